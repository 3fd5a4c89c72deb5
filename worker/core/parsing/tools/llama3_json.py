"""``llama3_json`` / ``llama4_json``: vLLM 0.33's ``Llama3JsonToolParser`` (0.34 reads them on the
parser engine: ``families/llama_json.py``, picked by version in ``ChatParsing.create``).

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

Finished objects are read once and kept, where vLLM re-reads them all. Once the
call's name is sent, the call in progress is read incrementally
(:mod:`._json_call_reader`): each record scans its own characters, and its
arguments JSON is an append-only part plus a short volatile tail, so the diff
costs O(the record) (a duplicate key also costs one copy of the members after
its first position). Before the name is sent, a record whose read surely
succeeds without a name (the same scan tells, until the ``"name"`` key) sends
nothing and skips the read; the read vLLM remembers is made once, when needed.
Once the call's reads fail for good (text JSON rejects, a rejected key with its
value, a blank JSON rejects then a comma, closer or value, both ``parameters``
and ``arguments``, a complete call read after blanks and followed by more text,
the next read starting on a string after ``;{``, or on anything but ``{["`` after
blanks, such as prose after a call), every record gives nothing without reading; after a syntax
error, a record whose read surely fails (:class:`_Broken`) does too.
A call after other text than ``; `` is kept and read incrementally when blanks
then ``{`` follow the two characters vLLM skips. Text that reader does not model
(whitespace JSON does not allow before a key, ...), other text between calls, a syntax error
before the name that the completion may still cut off, and the name's own records
re-read the call as vLLM does (their cost grows with that call's text; the parse budget,
``CompositeParser``, bounds their sum).
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
from worker.core.parsing.tools._json_call_reader import FAILED, Broken, CallReader, Frozen, Unsupported, View
from worker.core.parsing.tools._partial_json import common_prefix_len, dump, is_json, reads_no_container
from worker.core.parsing.tools._partial_json import partial_loads as partial_loads  # tests patch it here
from worker.core.parsing.types import (
    DeltaOut,
    ExtractedCalls,
    ParseRequest,
    ToolCallOut,
)
from worker.errors import ParserSetupError

BOT = "<|python_tag|>"
_DECODER = json.JSONDecoder()
_TOKENS = re.compile(r'["\[\]{}]')  # what the library's bracket scan sees
_JSON_BLANKS = re.compile(r"[ \t\n\r]*")  # what json.loads skips (str.isspace is wider)


class _Broken:
    """The call in progress after a syntax error (:class:`Broken`): does a record's read surely fail?

    At the error ``e`` the text before is a JSON prefix and ``text[e]`` (not a blank) is rejected
    there. A read is ``json.loads`` of a kept prefix plus closers (or ``raw_decode``, which needs
    an object complete before ``e``: none), so it fails once the prefix reaches past ``e``. The
    library keeps up to its last bracket or quote (the text ends with a closer; a string in
    progress in an array), or up to where the walk of the last open container ends, and that
    walk reaches ``e`` and raises there (its leniencies are not at ``e``; the array tail after a
    string is no exception: the library completes it from its last comma, and an error there
    raises). It may keep less only without incomplete strings, once a quote follows ``e``: its
    scan may then end inside what it takes for a string, and it cuts back to a comma or a key
    before that string, which can lie before ``e`` (the error may have shifted which quotes open
    strings, so any number of them counts). Quotes only accumulate, so a case once ruled out
    stays out.
    """

    def __init__(self, index: int, error: Broken, text: str) -> None:
        self.index = index
        self.quoted = '"' in text[error.at :]  # a quote follows the error

    def feed(self, delta: str) -> None:
        self.quoted = self.quoted or '"' in delta

    def fails(self, named: bool) -> bool:
        return named or not self.quoted


class _Frozen:
    """The call in progress after a number that ends in a sign, exponent or point (:class:`Frozen`).

    With incomplete strings (the name was sent) the library's bracket scan, kept here from the
    number on, tells each read: it keeps the number (the read fails) when the text ends with a
    closer, when the last open container or the array tail it reads starts after the number, or
    when it completes a string in an array; else its walk reaches the number and gives the one
    value cut there. So after the first read that gives it, no record needs to read.
    """

    def __init__(self, index: int, error: Frozen, text: str) -> None:
        self.index = index
        self.stack = [(char, True) for char in error.openers]  # (opener, opened before the number)
        self.in_string = False
        self.last = '"' if error.quote else "{"  # the last bracket or quote
        self.last_after = False  # ... and it comes after the number
        self.mismatched = False
        self.seen = False  # a read gave the cut value
        self.scan(text, error.end)

    def scan(self, text: str, pos: int) -> None:
        for found in _TOKENS.finditer(text, pos):
            at, char = found.start(), found.group()
            if self.mismatched:
                return
            self.last, self.last_after = char, True
            if char == '"':
                slash = at
                while slash > 0 and text[slash - 1] == "\\":
                    slash -= 1
                if not self.in_string or (at - slash) % 2 == 0:
                    self.in_string = not self.in_string
            elif not self.in_string:
                if char in "]}":
                    opener = "[" if char == "]" else "{"
                    if not self.stack or self.stack.pop()[0] != opener:
                        self.mismatched = True
                else:
                    self.stack.append((char, False))

    def reads_cut(self, text: str) -> bool:
        """Whether a read of ``text`` gives the value cut at the number (else it fails)."""
        if self.mismatched or not self.stack or (text[-1] in "]}" and not self.in_string):
            return False
        opener, before = self.stack[-1]
        if self.last == '"' and opener == "[":
            return not self.in_string and not self.last_after
        return before


class Llama3JsonToolParser(ToolParser):
    supports_required_and_named = False
    #: False re-reads the call in progress at every record (the reference the tests compare with).
    incremental = True

    def setup(self) -> None:
        if self.tokenizer.get_vocab().get(BOT) is None:
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
        self._prev_len = 0  # the text the last successful read saw
        # Set while the call in progress is read incrementally (after its name was sent).
        self._reader: CallReader | None = None
        self._view = View(-1, "", False)  # the reader's last successful read
        self._prev_is_last_read = False  # _prev is the last successful read (none since the reader took over)
        self._no_reader = -1  # the call the reader gave up on
        # Before a call's name is sent: a reader that tells when the whole read would surely
        # succeed without a name (nothing to send), so the record skips it.
        self._unnamed: CallReader | None = None
        self._no_unnamed = -1  # the call that reader gave up on
        self._prev_stale = False  # _prev is the read of text[:_prev_len], not made yet
        self._stuck = False  # every later read fails (the call's text is dead for good)
        self._blank_from = -1  # the read from here fails while the text after it is blanks only
        self._broken: _Broken | None = None
        self._frozen: _Frozen | None = None

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
                    call = ToolCallOut(id=random_tool_call_id(), name=name, arguments=dump(args))
                except Exception:  # vLLM: any failure keeps the whole output as content
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
        text, self._text = self._text, ""
        text += delta_text  # in place: CPython appends to a string only this name holds
        self._text = text
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
        if self.incremental and self._fails(delta_text):
            return None  # the read fails: nothing changes, as vLLM skips the record
        try:
            reader = self._reader
            if reader is not None:
                try:
                    reader.feed(self._text)
                    if reader.dead:
                        self._stuck = True
                        return None
                    if not reader.complete:
                        return self._step_reader(reader)
                except Unsupported as exc:
                    self._no_reader = self._index
                    self._note(exc)
                self._leave_reader()
            elif self.incremental and not self._name_sent and self._skips_unnamed():
                return None
            self._rebuild_prev()
            return self._step()
        except Exception:  # vLLM skips the record on any failure
            return None

    def _fails(self, delta_text: str) -> bool:
        """Whether this record's read surely fails, without reading."""
        if self._stuck:
            return True
        if self._blank_from >= 0:
            if not delta_text.strip(" \t\n\r"):
                return True
            self._blank_from = -1
        frozen = self._frozen
        if frozen is not None:
            if frozen.index != self._index:
                self._frozen = None
                return False
            frozen.scan(self._text, len(self._text) - len(delta_text))
            if not frozen.reads_cut(self._text) or frozen.seen:
                return True  # it fails, or gives the value the last read gave: nothing changes
            frozen.seen = True  # this record reads it once
            return False
        broken = self._broken
        if broken is None:
            return False
        if broken.index != self._index:
            self._broken = None
            return False
        broken.feed(delta_text)
        return broken.fails(self._name_sent)

    def _note(self, exc: Unsupported) -> None:
        if not self.incremental:
            return
        if isinstance(exc, Broken):
            self._broken = _Broken(self._index, exc, self._text)
        elif isinstance(exc, Frozen) and self._name_sent:
            self._frozen = _Frozen(self._index, exc, self._text)

    def _skips_unnamed(self) -> bool:
        """True when this record's whole read surely succeeds and finds no name (it gives nothing).

        Such a record only moves the read vLLM remembers (``_prev``) to the current text; that
        read is made once, when something needs it.
        """
        index = self._index
        if index < 0 or len(self._kept) != index or index == self._no_unnamed:
            return False
        reader = self._unnamed
        if reader is None or reader.start != self._kept_end:
            reader = self._unnamed = CallReader(self._kept_end, partial_strings=False)
        try:
            reader.feed(self._text)
        except Unsupported as exc:
            self._unnamed, self._no_unnamed = None, index
            self._note(exc)
            return False
        if reader.failing:
            # Both argument keys, or a rejected key and its value: the reads keep them and fail,
            # until an error and a quote after them (see _Broken) cut a read back before them.
            self._unnamed, self._no_unnamed = None, index
            return False
        if not reader.reads_unnamed(self._text):
            return False
        self._prev_len = len(self._text)
        self._prev_stale = True
        return True

    def _rebuild_prev(self) -> None:
        if self._prev_stale:
            self._prev_stale = False
            read = self._read(self._text[: self._prev_len])
            if read is not None:
                self._prev = read[0]

    def _read(self, text: str) -> tuple[list[Any], list[bool], int] | None:
        """All objects so far, which are complete, and where the last one starts.

        vLLM re-reads every object at every record; an object that is complete and followed by
        more text reads the same forever, so it is read once and kept, and a record re-reads
        only the object in progress. The reference (``incremental = False``) keeps nothing.
        """
        allow_str = self._name_sent
        keep = self.incremental
        objects: list[Any] = list(self._kept) if keep else []
        complete: list[bool] = [True] * len(objects)
        start = last = self._kept_end if keep else self._calls_at
        while start < len(text):
            if keep and text[start].isspace() and text[start] not in " \t\n\r":
                # json.loads rejects it and every completion keeps it (or gives a scalar, which
                # fails too): no read from here succeeds again.
                self._stuck = True
                return None
            if keep and reads_no_container(text, start):
                # Prose after a call ("; The ..."): the read here gives a scalar (no `in`) or
                # fails, and the objects before it read the same, so no read succeeds again.
                self._stuck = True
                return None
            self._reread += _read_weight(text, start)
            try:
                obj, consumed = partial_loads(text[start:], allow_str)
            except Exception:
                if keep and text[start] in " \t\n\r":
                    self._blank_read_fails(text, start)
                return None
            whole = is_json(text[start : start + consumed])
            complete.append(whole)
            followed = self._next_object_follows(text, start + consumed)
            last = start
            start += consumed + 2  # vLLM skips two characters, meant for "; "
            if "parameters" in obj:
                if "arguments" in obj:
                    return None  # vLLM asserts: both keys given
                obj["arguments"] = obj["parameters"]
            objects.append(obj)
            if keep and whole and followed and len(self._kept) == len(objects) - 1:
                self._kept.append(obj)
                self._kept_end = start
        return objects, complete, last

    @staticmethod
    def _next_object_follows(text: str, end: int) -> bool:
        """Whether an object that ends at ``end`` (``raw_decode``) is read the same from now on.

        Its read gives it or fails, and fails exactly when the completion of the text after it
        raises. When the two skipped characters hold no bracket or quote and the text from
        ``end + 2`` is JSON blanks then ``{``, the next read's bracket scan is that same scan,
        so reading on from ``end + 2`` alone fails exactly when the whole read does.
        """
        if len(text) <= end + 2 or _TOKENS.search(text, end, end + 2):
            return False
        at = _after_blanks(text, end + 2)
        return at < len(text) and text[at] == "{"

    def _blank_read_fails(self, text: str, start: int) -> None:
        """After a failed read of an object that starts with JSON blanks: does every later one fail?

        ``raw_decode`` does not skip blanks, so once a complete object there is followed by
        anything but blanks (json.loads: "Extra data"), no read succeeds again. While the text is
        blanks only, reads fail until something else comes.
        """
        at = _after_blanks(text, start)
        if at == len(text):
            self._blank_from = start
            return
        if text[at] != "{":
            return
        self._reread += _read_weight(text, at)
        try:
            _, end = _DECODER.raw_decode(text, at)
        except ValueError:
            return
        if _after_blanks(text, end) < len(text):
            self._stuck = True

    def _step(self) -> DeltaOut | None:
        partial_strings = self._name_sent  # this read completes a string in progress
        read = self._read(self._text)
        if read is None:
            return None
        objects, complete, last = read
        if not objects:
            return None
        current: Any = objects[self._index]
        delta: DeltaOut | None = None
        if len(objects) > self._index + 1:
            # A new object began: flush what completion added to the previous call.
            if self._index >= 0:
                args = current.get("arguments")
                if args:
                    delta = self._args_delta(dump(args)[len(self._streamed[self._index]) :])
            self._index = len(objects) - 1
            self._name_sent = False
            self._streamed.append("")
            if self.incremental and not isinstance(objects[-1], dict):
                # A string ("name" after ";{") or an array (a JSON list of calls) where a call
                # should start: from its first character every later read gives one again or
                # fails, and the call in progress has no .get: no later record gives anything.
                self._stuck = True
            return delta  # vLLM returns before remembering this read
        if not self._name_sent:
            name = current.get("name")
            if name:
                if not isinstance(name, str):
                    return None  # vLLM's delta model rejects it: the record is skipped
                delta = DeltaOut(tool_calls=[name_delta(self._index, name)])
                self._name_sent = True
                self._unnamed = None  # its scan is done: the call reader takes over
        else:
            args = current.get("arguments")
            if args:
                sent = len(self._streamed[self._index])
                now = dump(args)
                before = self._prev[self._index].get("arguments")
                diff: str | None = None
                if complete[self._index]:
                    diff = now[sent:]
                elif before:
                    then = dump(before)
                    if now != then:
                        diff = now[: common_prefix_len(then, now)][sent:]
                if diff is not None:
                    delta = self._args_delta(diff)
        self._prev = objects
        self._prev_len = len(self._text)
        if (
            self.incremental
            and self._name_sent
            and not complete[self._index]
            and self._no_reader != self._index
            and len(self._text) > last  # the read ended with the call in progress
            # The calls before are kept: one re-read instead (after `\"`, say) scans this call's
            # text too, so whether the read succeeds turns on more than this call.
            and last == self._kept_end
        ):
            self._reader = self._start_reader(last, current, partial_strings)
            self._prev_is_last_read = True
        return delta

    def _start_reader(self, start: int, current: dict[str, Any], partial_strings: bool) -> CallReader | None:
        """A reader of the call in progress, checked against the whole read this record made.

        When that read left a string in progress out (``partial_strings`` False: the record sent the
        name), the reader, whose reads complete it as the next records' do, is checked against
        one such read of the text, and the view the next record compares with is this record's.
        """
        reader = CallReader(start)
        try:
            reader.feed(self._text)
            view = reader.read(self._text) if not reader.complete else FAILED
        except Unsupported as exc:
            view = FAILED
            self._note(exc)
        if view is not FAILED:
            expected = _arguments_json(current)
            got = reader.text_of(view) if view.size >= 0 else None
            if partial_strings and got == expected:
                self._view = view
                return reader
            if not partial_strings and self._reads_with_strings(start, got):
                if expected is None:
                    view = View(-1, "", False)
                else:
                    # The stable part this record's text shares with the reader's.
                    size = common_prefix_len(reader.stable.between(0, view.size), expected)
                    view = View(size, expected[size:], bool(current["arguments"]))
                self._view = reader.last_view = view
                return reader
        self._no_reader = self._index
        return None

    def _reads_with_strings(self, start: int, got: str | None) -> bool:
        """Whether a read completing strings gives ``got`` as the arguments of the call at ``start``."""
        self._reread += _read_weight(self._text, start)
        try:
            obj, _ = partial_loads(self._text[start:], True)
            if "parameters" in obj:
                if "arguments" in obj:
                    return False  # vLLM asserts
                obj["arguments"] = obj["parameters"]
            return _arguments_json(obj) == got
        except Exception:  # the read fails
            return False

    def _step_reader(self, reader: CallReader) -> DeltaOut | None:
        """``_step`` for a record of the call in progress, read incrementally."""
        now = reader.read(self._text)
        if now is FAILED:
            return None  # the read fails: nothing changes
        then = self._view
        delta: DeltaOut | None = None
        if now.size >= 0 and now.truthy:
            # Read first, as vLLM does: a record that began two calls at once left no entry (it fails).
            sent = len(self._streamed[self._index])
            if then.size >= 0 and then.truthy:
                cut = _changed_at(reader, then, now)
                if cut >= 0:
                    delta = self._args_delta(reader.text_of(now, sent, cut) if sent < cut else "")
        self._view = now
        self._prev_len = len(self._text)
        self._prev_is_last_read = False
        return delta

    def _leave_reader(self) -> None:
        """Back to whole reads: rebuild what the last successful read gave (unless ``_prev`` is it)."""
        if self._reader is not None:
            self._reader = None
            if self._prev_is_last_read:
                return
            read = self._read(self._text[: self._prev_len])
            if read is not None:
                self._prev = read[0]

    def _args_delta(self, diff: str) -> DeltaOut:
        self._streamed[self._index] += diff
        return DeltaOut(tool_calls=[args_delta(self._index, diff)])

    def remaining_unstreamed_args(self) -> str:
        self._rebuild_prev()
        self._leave_reader()
        if not self._prev:
            return ""
        index = len(self._prev) - 1
        try:
            args = self._prev[index].get("arguments", {})
            expected = args if isinstance(args, str) else dump(args)
        except Exception:
            return ""
        actual = self._streamed[index] if index < len(self._streamed) else ""
        return expected[len(actual) :] if expected.startswith(actual) else ""


def _arguments_json(obj: dict[str, Any]) -> str | None:
    return dump(obj["arguments"]) if "arguments" in obj else None


#: What each opening bracket adds to a whole read's count for the parse budget: the library
#: recurses per level, so a deep read costs more per character (300 levels: ~4x a flat one).
_BRACKET_WEIGHT = 4


def _read_weight(text: str, start: int) -> int:
    """A whole read of ``text[start:]`` as the parse budget counts it (``ToolParser.reread_chars``)."""
    return len(text) - start + _BRACKET_WEIGHT * (text.count("[", start) + text.count("{", start))


def _after_blanks(text: str, pos: int) -> int:
    found = _JSON_BLANKS.match(text, pos)
    return found.end() if found else pos


def _changed_at(reader: CallReader, then: View, now: View) -> int:
    """Where two reads' arguments JSON first differ (vLLM's common prefix); -1 when equal."""
    suffix = now.suffix
    if then.lost_at >= 0 or (then.suffix is not suffix and (then.suffix or suffix)):
        # A duplicate key cut the stable part back, or its member began or ended: compare the texts
        # from where they may differ (the copy of the members after it, once per such member).
        at = then.lost_at if then.lost_at >= 0 else then.size
        old = then.lost if then.lost_at >= 0 else then.volatile + then.suffix
        new = reader.text_of(now, at)
        return -1 if old == new else at + common_prefix_len(old, new)
    # The stable part only grew: compare what follows the earlier read's stable part.
    grown = reader.stable.between(then.size, now.size) if now.size > then.size else ""
    later = grown + now.volatile
    if then.volatile == later:
        return -1
    same = common_prefix_len(then.volatile, later)
    if suffix and same == min(len(later), len(then.volatile)):
        # One is a prefix of the other: the shared suffix follows the shorter.
        rest = (later if len(later) > len(then.volatile) else then.volatile)[same:]
        if rest[:1] == suffix[:1]:
            same += common_prefix_len(rest + suffix, suffix)
    return then.size + same
