"""``llama3_json`` / ``llama4_json``: vLLM's ``Llama3JsonToolParser``.

Llama 3.x writes ``{"name": ..., "parameters": {...}}`` objects, optionally
after ``<|python_tag|>``, several joined by ``; ``. The tokenizer must know
``<|python_tag|>`` (vLLM refuses to start otherwise).

One-shot: every ``{`` not inside an object already read starts a JSON
object (``raw_decode``); each needs ``name`` and ``arguments`` or
``parameters``, and any failure keeps the whole output as content. Prose
around the objects is dropped, so JSON quoted in prose becomes a call.

Streaming only engages when the output starts with ``<|python_tag|>`` or
``{`` (else every record is content, so quoted JSON stays content). Each
record re-reads the objects the way vLLM does, with the partial-JSON
completion of the ``partial_json_parser`` library (re-implemented here:
incomplete strings are only allowed once the call's name was sent):

* a call's name is sent alone, with its id, once it is complete;
* arguments stream as the common prefix of the previous and the current
  completed arguments JSON (so completion closers are not sent early),
  and in full once the object is complete;
* when the next object starts, the rest of the previous call's arguments
  is sent (possibly ``""``), and the record carries nothing else;
* a record that cannot be read yields nothing and changes nothing.

Finished objects are read once and kept, where vLLM re-reads them all. While
the object in progress ends inside a string value (most of a long call), a
record without a quote is read incrementally, its own characters plus a short
tail (``_Fast``); any other record re-reads the object in progress as vLLM
does (its cost grows with that call's text, at most ``max_model_len`` tokens).
Llama has a structural tag, so with strict tool calling ``required``/named
choices parse the native format like ``auto``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from worker.core.parsing.base import ToolParser
from worker.core.parsing.deltas import args_delta, name_delta
from worker.core.parsing.ids import random_tool_call_id
from worker.core.parsing.registry import tool_parser
from worker.core.parsing.types import (
    DeltaOut,
    ExtractedCalls,
    ParseRequest,
    ToolCallOut,
)
from worker.errors import ParserSetupError

BOT = "<|python_tag|>"
_DECODER = json.JSONDecoder()
_STRING_STOP = re.compile(r'["\\]')
_STRUCTURAL = re.compile(r'["\[\]{}]')


class _Partial(Exception):
    """The text cannot be completed to JSON (any failure of the library)."""


#: Set while a read is traced (see ``_anchor``): where the completion cut its partial
#: strings and how it closed the innermost container. None otherwise (parsing runs on one thread).
_trace: list[tuple[Any, ...]] | None = None


# -- partial JSON completion (partial_json_parser's algorithm) ---------------
#
# Completion returns (cut, closer): keep text[:cut] and append closer; closer
# None means the value was already complete. False-like results are raised
# as _Partial; malformed text raises too (the caller treats both alike).


def _skip_blank(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _at(text: str, pos: int) -> str:
    if pos >= len(text) or pos < 0:
        raise IndexError(pos)
    return text[pos]


def _complete_str(text: str, start: int, allow_str: bool) -> tuple[int, str | None] | None:
    """String at ``start`` (a quote): (end offset, closer) or None if partial and not allowed."""
    if _at(text, start) != '"':
        raise _Partial("expected a string")
    length = len(text)
    i = start + 1
    last_escaped = -1
    while True:
        # Jump to the next quote or backslash (the string's text in between is skipped in C).
        stop = _STRING_STOP.search(text, i)
        if stop is None:
            i = length
            break
        pos = stop.start()
        if text[pos] == '"':
            return pos + 1, None
        last_escaped = pos + 1
        if last_escaped == length:
            i = pos
            break
        i = pos + 2
    if not allow_str:
        return None
    # Cut a trailing, truncated \u / \U / \x escape (the library's windows).
    for marker, window in (("\\u", 5), ("\\U", 9), ("\\x", 3)):
        found = text.rfind(marker, max(start, i - window), i)
        if found != -1 and found != last_escaped:
            if _trace is not None:
                _trace.append(("str", start))
            return found, '"'
    if _trace is not None:
        _trace.append(("str", start))
    return i, '"'


def _complete_num(text: str, start: int, top_level: bool) -> tuple[int, str | None]:
    length = len(text)
    i = start + 1
    while i < length and text[i] in "1234567890.-+eE":
        i += 1
    # The library walks back over a dangling sign/exponent/point on its slice
    # of the text; an index below the slice start wraps to the text's end.
    rel = i - start
    modified = False
    while True:
        back = rel - 1
        if back >= 0:
            char = text[start + back]
        elif -back <= length - start:
            char = text[length + back]
        else:
            raise IndexError(back)
        if char not in ".-+eE":
            break
        modified = True
        rel -= 1
    end = start + rel
    if modified or (end == length and not top_level):
        return end, ""
    return end, None


_LITERALS = ("null", "true", "false", "Infinity")


def _complete_any(
    text: str, start: int, allow_str: bool, top_level: bool = False
) -> tuple[int, str | None] | None:
    char = _at(text, _skip_blank(text, start))
    if char == '"':
        return _complete_str(text, start, allow_str)
    if char in "1234567890":
        return _complete_num(text, start, top_level)
    if char == "[":
        return _complete_arr(text, start, allow_str)
    if char == "{":
        return _complete_obj(text, start, allow_str)
    rest_len = len(text) - start
    for literal in _LITERALS:
        if text.startswith(literal, start):
            return start + len(literal), None
        if rest_len <= len(literal) and literal.startswith(text[start:]):
            return start, literal
    if char == "-":
        if rest_len == 1:
            return None
        if text[start + 1] != "I":
            return _complete_num(text, start, top_level)
    for literal in ("-Infinity", "NaN"):
        if text.startswith(literal, start):
            return start + len(literal), None
        if rest_len <= len(literal) and literal.startswith(text[start:]):
            return start, literal
    raise _Partial(f"unexpected character {char!r}")


def _complete_arr(text: str, start: int, allow_str: bool) -> tuple[int, str | None]:
    i = j = start + 1
    try:
        while True:
            j = _skip_blank(text, j)
            if _at(text, j) == "]":
                return j + 1, None
            result = _complete_any(text, j, allow_str)
            if result is None:
                return i, "]"
            end, closer = result
            if closer is not None:
                return end, closer + "]"
            i = j = end
            j = _skip_blank(text, j)
            char = _at(text, j)
            if char == ",":
                j += 1
            elif char == "]":
                return j + 1, None
            else:
                raise _Partial("expected ',' or ']'")
    except IndexError:
        return i, "]"


def _complete_obj(text: str, start: int, allow_str: bool) -> tuple[int, str | None]:
    i = j = start + 1
    try:
        while True:
            j = _skip_blank(text, j)
            if _at(text, j) == "}":
                return j + 1, None
            key = _complete_str(text, j, allow_str)
            if key is None or key[1] is not None:
                return i, "}"
            j = _skip_blank(text, key[0])
            if _at(text, j) != ":":
                raise _Partial("expected ':'")
            j = _skip_blank(text, j + 1)
            result = _complete_any(text, j, allow_str)
            if result is None:
                return i, "}"
            end, closer = result
            if closer is not None:
                return end, closer + "}"
            i = j = end
            j = _skip_blank(text, j)
            char = _at(text, j)
            if char == ",":
                j += 1
            elif char == "}":
                return j + 1, None
            else:
                raise _Partial("expected ',' or '}'")
    except IndexError:
        return i, "}"


def _fix(text: str, allow_str: bool) -> tuple[str, str]:
    """The library's slow path: (kept text, appended closer)."""
    stripped = text.strip()
    try:
        result = _complete_any(stripped, 0, allow_str, top_level=True)
    except IndexError as exc:
        raise _Partial("malformed") from exc
    if result is None:
        raise _Partial("partial value not allowed")
    end, closer = result
    return text[:end], closer or ""


def _closers(stack: list[tuple[int, str]]) -> str:
    return "".join("}" if char == "{" else "]" for _, char in reversed(stack))


def _escaped(text: str, pos: int) -> bool:
    count = 0
    while pos - count - 1 >= 0 and text[pos - count - 1] == "\\":
        count += 1
    return count % 2 == 1


def _ensure_json(text: str, allow_str: bool) -> str:
    """The library's fast path: bracket scan, then complete only the last open container."""
    tokens = [(found.start(), found.group()) for found in _STRUCTURAL.finditer(text)]
    if not tokens or tokens[0][1] == '"':
        head, tail = _fix(text, allow_str)
        return head + tail
    stack: list[tuple[int, str]] = []
    in_string = False
    for i, char in tokens:
        if char == '"':
            if not in_string or not _escaped(text, i):
                in_string = not in_string
        elif not in_string:
            if char in "]}":
                if not stack or stack.pop()[1] != ("{" if char == "}" else "["):
                    raise _Partial("mismatched brackets")
            else:
                stack.append((i, char))
    if not stack:
        return text
    last_i, last_char = tokens[-1]
    if text[-1] in "]}" and not in_string:
        return text[: last_i + 1] + _closers(stack)
    if last_char == '"':
        if in_string:
            if not allow_str:
                # Partial strings are not allowed: cut back to the previous token,
                # unless that closes a string in an object (then read the object).
                if len(tokens) < 2:
                    raise _Partial("partial string not allowed")
                cut, before = tokens[-2]
                if before != '"' or stack[-1][1] != "{":
                    return text[: cut + 1] + _closers(stack)
            if stack[-1][1] != "{":
                result = _complete_str(text, last_i, allow_str)
                if result is None or result[1] is None:
                    raise _Partial("string scan disagrees")  # the library fails here too
                return text[: result[0]] + result[1] + _closers(stack)
        if stack[-1][1] == "[":
            rest = text[last_i + 1 :].rstrip("-").strip().lstrip(",")
            if rest:
                head, tail = _fix("[" + rest, allow_str)
                if not (head.startswith("[") and tail.endswith("]")):
                    raise _Partial("malformed array tail")
                return text[: last_i + 1] + "," + head[1:] + tail + _closers(stack[:-1])
            return text[: last_i + 1] + _closers(stack)
    index, _ = stack.pop()
    head, tail = _fix(text[index:], allow_str)
    if _trace is not None:
        _trace.append(("fix", index, in_string, tail, _closers(stack)))
    return text[:index] + head + tail + _closers(stack)


def partial_loads(text: str, allow_str: bool) -> tuple[Any, int]:
    """vLLM's ``partial_json_loads``: (value, chars consumed); raises on any failure."""
    try:
        return json.loads(_ensure_json(text, allow_str)), len(text)
    except json.JSONDecodeError as exc:
        if "Extra data" in exc.msg:
            return _DECODER.raw_decode(text)
        raise


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _common_prefix_len(a: str, b: str) -> int:
    # Bisection on slice comparisons: the text is compared in C, not char by char.
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while high - low > 1:  # a[:low] == b[:low] and a[:high] != b[:high]
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- the string in progress, read incrementally -------------------------------
#
# A long call is mostly one long string argument. While the text ends inside a
# string value and records add no quote, the completion above only changes that
# string: its text is kept up to the end (less trailing blanks and a truncated
# escape in the last few characters) and closed with '"' and the same closers.
# So the arguments JSON is P + (the string's JSON text) + Q with P and Q fixed,
# and a record only has to decode its own characters plus a short tail.

#: Characters behind the text's end that the completion may still cut (an escape
#: window of at most 9 plus a trailing backslash); text before them is final.
_WINDOW = 12
#: Stands in for the string's text when locating it in the arguments JSON.
_SENTINEL = "\ue000"
_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB]")
#: Longest Q (the arguments JSON after the string) compared at each record.
_MAX_SUFFIX = 64


class _Fast:
    """Incremental read of the call in progress while its text ends inside a string value.

    ``stable`` is the JSON text of the string's characters before ``done`` (whole
    escapes only, never between two surrogate escapes that decode as one
    character), which no later record can change; each record decodes only what
    it adds and the short tail after ``done``.
    """

    def __init__(self, text: str, quote: int, end: int) -> None:
        self.done = quote + 1  # start of the tail not yet decoded into ``stable``
        self.end = end  # end of the string's text less trailing blanks
        self.stable = ""
        self.valid = True  # False once ``stable`` holds text JSON cannot read
        self.prefix = ""  # P: the arguments JSON before the string's text
        self.suffix = ""  # Q: the arguments JSON after it
        self.in_args = False  # False: the string is elsewhere and the arguments never change
        self.is_args = False  # the arguments value is the string itself
        self.prev_len = 0  # the text the last successful read saw (vLLM's prev_tool_call_arr)
        self.prev_done = 0  # len(stable) at that read
        self.prev_tail = ""  # the arguments JSON's string text after prev_done at that read
        self.prev_truthy = False
        self.scanned = 0  # characters this object handled (for the bounded-work test)
        self._advance(text)

    def _advance(self, text: str) -> None:
        """Move ``done`` to the last whole-escape boundary before the window and decode up to it."""
        target = self.end - _WINDOW
        pos = good = self.done
        if target <= pos:
            return
        self.scanned += target - pos
        while pos < target:
            slash = text.find("\\", pos, target)
            if slash == -1:
                good = target
                break
            if slash > pos:
                good = slash
            unit = 6 if text[slash + 1] == "u" else 2
            if slash + unit > target:
                break
            pos = slash + unit
            if not (unit == 6 and _HIGH_SURROGATE.match(text, slash)):
                good = pos
        if good > self.done and self.valid:
            try:
                self.stable += _dump(json.loads('"' + text[self.done : good] + '"'))[1:-1]
            except ValueError:
                self.valid = False  # the completion keeps this text from now on: every read fails
        self.done = good

    def tail(self, text: str) -> str | None:
        """The JSON text of the string after ``done`` as the completion keeps it; None if unreadable."""
        rest = '"' + text[self.done : self.end]
        self.scanned += len(rest)
        result = _complete_str(rest, 0, True)
        if result is None:
            return None
        try:
            return _dump(json.loads(rest[: result[0]] + '"'))[1:-1]
        except ValueError:
            return None

    def extend(self, text: str, delta_text: str) -> str | None:
        """Take a record's text (no quote in it); the string's new tail, None if the read fails."""
        self.scanned += len(delta_text)
        kept = delta_text.rstrip()
        if kept:
            self.end = len(text) - len(delta_text) + len(kept)
        self._advance(text)
        return self.tail(text) if self.valid else None

    def slice(self, tail: str, low: int, high: int) -> str:
        """``(prefix + stable + tail + suffix)[low:high]`` without building the whole."""
        out = []
        base = 0
        for part in (self.prefix, self.stable, tail, self.suffix):
            if low < base + len(part) and high > base:
                out.append(part[max(low - base, 0) : high - base])
            base += len(part)
        return "".join(out)


def _anchor(text: str, start: int, trace: list[tuple[Any, ...]], args: Any) -> _Fast | None:
    """A ``_Fast`` for the object read from ``start`` when it ends in a string value, else None.

    ``trace`` is the completion's record of that read, ``args`` the arguments it gave.
    """
    if not trace or trace[-1][0] != "fix":
        return None
    _, index, in_string, tail, closers = trace[-1]
    strings = [entry for entry in trace if entry[0] == "str"]
    # The completion closed a string that runs to the end as the innermost object's last value.
    if not in_string or tail != '"}' or not strings:
        return None
    body = text[start:]
    quote = index + strings[-1][1]
    if body[quote] != '"' or _SENTINEL in body or "\\ue000" in body.lower():
        return None
    try:
        obj = json.loads(body[: quote + 1] + _SENTINEL + '"}' + closers)
        if not isinstance(obj, dict):
            return None
        if "parameters" in obj:
            obj["arguments"] = obj["parameters"]
        located = _dump(obj.get("arguments"))
        fast = _Fast(text, start + quote, start + index + len(body[index:].rstrip()))
        tail_now = fast.tail(text)
        if not fast.valid or tail_now is None:
            return None
        count = located.count(_SENTINEL)
        if count == 1:
            cut = located.index(_SENTINEL)
            fast.prefix, fast.suffix = located[:cut], located[cut + 1 :]
            fast.in_args = True
            fast.is_args = isinstance(obj.get("arguments"), str)
            if len(fast.suffix) > _MAX_SUFFIX:
                return None
            # The read this record made must be what the model says it is.
            if args:
                if _dump(args) != fast.prefix + fast.stable + tail_now + fast.suffix:
                    return None
            elif not fast.is_args or fast.stable or tail_now:
                return None
        elif count != 0:
            return None
    except Exception:  # noqa: BLE001 - any surprise leaves the fast path; the full parse decides
        return None
    fast.prev_len = len(text)
    fast.prev_done = len(fast.stable)
    fast.prev_tail = tail_now
    fast.prev_truthy = bool(args)
    return fast


# -- parser ------------------------------------------------------------------


@tool_parser("llama3_json", "llama4_json")
class Llama3JsonToolParser(ToolParser):
    supports_required_and_named = False
    #: False re-reads the call in progress at every record (the reference the tests compare with).
    incremental = True

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any],
    ) -> None:
        super().__init__(tokenizer, tools, chat_template_kwargs)
        if tokenizer.get_vocab().get(BOT) is None:
            raise ParserSetupError(f"the tokenizer has no {BOT!r} token")
        self._text = ""
        self._mode: bool | None = None  # None: undecided, True: calls, False: content
        self._calls_at = 0  # where the objects start (after the tag)
        self._prev: list[Any] = []  # vLLM's prev_tool_call_arr
        self._index = -1  # vLLM's current_tool_id
        self._name_sent = False
        self._streamed: list[str] = []
        self._kept: list[Any] = []  # finished objects, read once
        self._kept_end = 0
        self._fast: _Fast | None = None  # set while the call in progress ends inside a string

    # -- one-shot ------------------------------------------------------

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        if BOT not in text and "{" not in text:
            return ExtractedCalls(False, [], text)
        calls: list[ToolCallOut] = []
        end = -1
        pos = text.find("{")
        while pos >= 0:
            if pos > end:
                try:
                    obj, length = _DECODER.raw_decode(text, pos)
                    end = length  # raw_decode with an offset returns the absolute end
                    name = obj["name"]
                    args = obj["arguments"] if "arguments" in obj else obj["parameters"]
                    call = ToolCallOut(id=random_tool_call_id(), name=name, arguments=_dump(args))
                except Exception:  # noqa: BLE001 - vLLM: any failure keeps the whole output as content
                    return ExtractedCalls(False, [], text)
                if not isinstance(call.name, str):
                    return ExtractedCalls(False, [], text)
                calls.append(call)
            pos = text.find("{", pos + 1)
        if calls:
            return ExtractedCalls(True, calls, None)
        return ExtractedCalls(False, [], text)

    # -- streaming -----------------------------------------------------

    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        self._text += delta_text
        if self._mode is None:
            text = self._text
            if text.startswith(BOT):
                self._mode, self._calls_at = True, len(BOT)
            elif text.startswith("{"):
                self._mode, self._calls_at = True, 0
            elif not BOT.startswith(text) or not text:
                self._mode = False if text else None
            self._kept_end = self._calls_at
        if not self._mode:
            return DeltaOut(content=delta_text)
        try:
            if self._fast is not None:
                if '"' not in delta_text:
                    return self._step_fast(self._fast, delta_text)
                self._leave_fast()
            return self._step()
        except Exception:  # noqa: BLE001 - vLLM skips the record on any failure
            return None

    def _read(
        self, text: str, trace: list[tuple[Any, ...]] | None = None
    ) -> tuple[list[Any], list[bool]] | None:
        """All objects so far and which are complete.

        vLLM re-reads every object at every record; an object that is complete and followed by
        more text reads the same forever, so it is read once and kept, and a record re-reads
        only the object in progress. ``trace`` receives the completion's record of the last
        object read and (last) where it starts.
        """
        global _trace
        allow_str = self._name_sent
        objects: list[Any] = list(self._kept)
        complete: list[bool] = [True] * len(objects)
        start = self._kept_end
        while start < len(text):
            try:
                if trace is not None:
                    trace.clear()
                    _trace = trace
                obj, consumed = partial_loads(text[start:], allow_str)
            except Exception:  # noqa: BLE001 - vLLM's partial JSON read: any failure skips the record
                return None
            finally:
                _trace = None
            if trace is not None:
                trace.append(("start", start, consumed))
            whole = _is_json(text[start : start + consumed])
            complete.append(whole)
            # Kept only when the "; " separator follows: other text can make vLLM's read of the
            # whole rest fail at this object later.
            followed = text[start + consumed : start + consumed + 3] == "; {"
            start += consumed + 2  # the "; " between objects
            if "parameters" in obj:
                if "arguments" in obj:
                    return None  # vLLM asserts: both keys given
                obj["arguments"] = obj["parameters"]
            objects.append(obj)
            if whole and followed and len(self._kept) == len(objects) - 1:
                self._kept.append(obj)
                self._kept_end = start
        return objects, complete

    def _step(self) -> DeltaOut | None:
        trace: list[tuple[Any, ...]] | None = [] if self.incremental and self._name_sent else None
        read = self._read(self._text, trace)
        if read is None:
            return None
        objects, complete = read
        if not objects:
            return None
        current: Any = objects[self._index]
        delta: DeltaOut | None = None
        if len(objects) > self._index + 1:
            # A new object began: flush what completion added to the previous call.
            if self._index >= 0:
                args = current.get("arguments")
                if args:
                    delta = self._args_delta(_dump(args)[len(self._streamed[self._index]) :])
            self._index = len(objects) - 1
            self._name_sent = False
            self._streamed.append("")
            return delta  # vLLM returns before remembering this read
        if not self._name_sent:
            name = current.get("name")
            if name:
                if not isinstance(name, str):
                    return None  # vLLM's delta model rejects it: the record is skipped
                delta = DeltaOut(tool_calls=[name_delta(self._index, name)])
                self._name_sent = True
        else:
            args = current.get("arguments")
            if args:
                sent = len(self._streamed[self._index])
                now = _dump(args)
                before = self._prev[self._index].get("arguments")
                diff: str | None = None
                if complete[self._index]:
                    diff = now[sent:]
                elif before:
                    then = _dump(before)
                    if now != then:
                        diff = now[: _common_prefix_len(then, now)][sent:]
                if diff is not None:
                    delta = self._args_delta(diff)
        self._prev = objects
        if trace and not complete[self._index]:
            _, start, consumed = trace.pop()
            if start + consumed == len(self._text):
                self._fast = _anchor(self._text, start, trace, current.get("arguments"))
        return delta

    def _step_fast(self, fast: _Fast, delta_text: str) -> DeltaOut | None:
        """``_step`` for a record that extends the string the call in progress ends in."""
        tail = fast.extend(self._text, delta_text)
        if tail is None:
            return None  # the read fails: nothing changes
        delta: DeltaOut | None = None
        truthy = not fast.is_args or bool(fast.stable) or bool(tail)
        if fast.in_args and truthy and fast.prev_truthy:
            new = fast.stable[fast.prev_done :] + tail
            if new != fast.prev_tail:
                common = _common_prefix_len(fast.prev_tail + fast.suffix, new + fast.suffix)
                cut = len(fast.prefix) + fast.prev_done + common
                sent = len(self._streamed[self._index])
                delta = self._args_delta(fast.slice(tail, sent, cut) if sent < cut else "")
        fast.prev_len = len(self._text)
        fast.prev_done = len(fast.stable)
        fast.prev_tail = tail
        fast.prev_truthy = truthy
        return delta

    def _leave_fast(self) -> None:
        """Back to whole reads: rebuild what the last successful read gave."""
        fast, self._fast = self._fast, None
        if fast is not None:
            read = self._read(self._text[: fast.prev_len])
            if read is not None:
                self._prev = read[0]

    def _args_delta(self, diff: str) -> DeltaOut:
        self._streamed[self._index] += diff
        return DeltaOut(tool_calls=[args_delta(self._index, diff)])

    def remaining_unstreamed_args(self) -> str:
        self._leave_fast()
        if not self._prev:
            return ""
        index = len(self._prev) - 1
        try:
            args = self._prev[index].get("arguments", {})
            expected = args if isinstance(args, str) else _dump(args)
        except Exception:  # noqa: BLE001 - arguments that cannot be written have no remainder
            return ""
        actual = self._streamed[index] if index < len(self._streamed) else ""
        return expected[len(actual) :] if expected.startswith(actual) else ""
