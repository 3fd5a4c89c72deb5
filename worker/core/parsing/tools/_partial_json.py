"""vLLM's partial-JSON read for ``llama3_json``: the completion of the ``partial_json_parser`` library.

Re-implemented (vLLM 0.33.0 calls the library): completion returns (cut,
closer), keep ``text[:cut]`` and append ``closer``; closer None means the value
was already complete. False-like results are raised as :class:`_Partial`;
malformed text raises too (the caller treats both alike). Incomplete strings
are allowed only with ``allow_str`` (vLLM allows them once the call's name was
sent). The library's fast path scans the brackets and completes only the last
open container (:func:`_ensure_json`).
"""

from __future__ import annotations

import json
import re
from typing import Any

_DECODER = json.JSONDecoder()
_STRING_STOP = re.compile(r'["\\]')
_STRUCTURAL = re.compile(r'["\[\]{}]')
_NOT_BLANK = re.compile(r"\S")  # re's \s is str.isspace on str patterns


class _Partial(Exception):
    """The text cannot be completed to JSON (any failure of the library)."""


def _skip_blank(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _at(text: str, pos: int) -> str:
    if pos >= len(text) or pos < 0:
        raise IndexError(pos)
    return text[pos]


def complete_str(text: str, start: int, allow_str: bool) -> tuple[int, str | None] | None:
    """String at ``start`` (a quote): (end offset, closer) or None if partial and not allowed."""
    if _at(text, start) != '"':
        raise _Partial("expected a string")
    length = len(text)
    i = start + 1
    while True:
        # Jump to the next quote or backslash (the string's text in between is skipped in C).
        stop = _STRING_STOP.search(text, i)
        if stop is None:
            i = length
            break
        pos = stop.start()
        if text[pos] == '"':
            return pos + 1, None
        if pos + 1 == length:
            i = pos
            break
        i = pos + 2
    if not allow_str:
        return None
    # Cut a trailing, truncated \u / \U / \x escape (the library's windows), unless its
    # backslash is itself escaped.
    for marker, window in (("\\u", 5), ("\\U", 9), ("\\x", 3)):
        found = text.rfind(marker, max(start, i - window), i)
        if found != -1 and not _escaped(text, found):
            return found, '"'
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
        return complete_str(text, start, allow_str)
    if char in "1234567890":
        return _complete_num(text, start, top_level)
    if char == "[":
        return _complete_container(text, start, allow_str, "]")
    if char == "{":
        return _complete_container(text, start, allow_str, "}")
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


def _complete_container(text: str, start: int, allow_str: bool, close: str) -> tuple[int, str | None]:
    """An array (``close`` ``]``) or an object (``}``, each item a key and ``:`` before its value)."""
    i = j = start + 1
    try:
        while True:
            j = _skip_blank(text, j)
            if _at(text, j) == close:
                return j + 1, None
            if close == "}":
                key = complete_str(text, j, allow_str)
                if key is None or key[1] is not None:
                    return i, close
                j = _skip_blank(text, key[0])
                if _at(text, j) != ":":
                    raise _Partial("expected ':'")
                j = _skip_blank(text, j + 1)
            result = _complete_any(text, j, allow_str)
            if result is None:
                return i, close
            end, closer = result
            if closer is not None:
                return end, closer + close
            i = j = end
            j = _skip_blank(text, j)
            char = _at(text, j)
            if char == ",":
                j += 1
            elif char == close:
                return j + 1, None
            else:
                raise _Partial(f"expected ',' or {close!r}")
    except IndexError:
        return i, close


def _fix(text: str, allow_str: bool, top_level: bool = False) -> tuple[str, str]:
    """The library's slow path: (kept text, appended closer)."""
    try:
        result = _complete_any(text.strip(), 0, allow_str, top_level)
    except IndexError as exc:
        raise _Partial("malformed") from exc
    if result is None:
        raise _Partial("partial value not allowed")
    end, closer = result
    return text[:end], closer or ""


def _closers(stack: list[tuple[int, str]]) -> str:
    return "".join("}" if char == "{" else "]" for _, char in reversed(stack))


def _escaped(text: str, pos: int) -> bool:
    """Whether an odd run of backslashes ends right before ``pos``."""
    before = pos
    while before > 0 and text[before - 1] == "\\":
        before -= 1
    return (pos - before) % 2 == 1


def _tail_fix(text: str, cut: int, opener: str, allow_str: bool) -> tuple[str, str, bool]:
    """Complete ``opener`` + the text after the comma at ``cut``: (kept, closer, empty).

    ``empty``: the completion keeps nothing of that text (then the comma goes too).
    """
    head, tail = _fix(opener + text[cut + 1 :], allow_str)
    return head[1:], tail, not (head[1:] + tail[:-1].strip())


def _cut_before_key(text: str, stack: list[tuple[int, str]], string_end: int) -> tuple[str, str]:
    """No partial strings: drop the last key of the innermost container (and its comma)."""
    opened = stack[-1][0]
    closers = _closers(stack)
    quote = string_end
    while True:
        quote = text.rfind('"', opened, quote)
        if quote == -1:
            return text[: opened + 1], closers
        if _escaped(text, quote):
            quote -= 1
            continue
        comma = text.rfind(",", opened, quote)
        if comma == -1:
            return text[: opened + 1], closers
        return text[:comma], closers


def _ensure_json(text: str, allow_str: bool) -> tuple[str, str]:
    """The library's fast path: bracket scan, then complete only the last open container.

    Returns (kept text, appended closer). Every failure raises (the library's assertions and
    its pop from an empty stack included).
    """
    tokens = [(found.start(), found.group()) for found in _STRUCTURAL.finditer(text)]
    if not tokens or tokens[0][1] == '"':
        return _fix(text, allow_str, top_level=True)
    stack: list[tuple[int, str]] = []
    in_string = False
    string_start = string_end = -1
    for at, char in tokens:
        if char == '"':
            if not in_string:
                in_string, string_start = True, at
            elif not _escaped(text, at):
                in_string, string_end = False, at
        elif in_string:
            continue
        elif char in "]}":
            if not stack:
                raise _Partial("unbalanced close")
            if stack.pop()[1] != ("{" if char == "}" else "["):
                raise _Partial("mismatched brackets")
        else:
            stack.append((at, char))
    if not stack:
        return text, ""
    last_at, last_char = tokens[-1]
    opened, kind = stack[-1]

    if in_string and not allow_str:
        if kind == "{" and opened > string_end:
            return text[: opened + 1], _closers(stack)
        comma = text.rfind(",", max(opened, string_end) + 1, string_start)
        if comma != -1:
            return text[:comma], _closers(stack)
        return _cut_before_key(text, stack, string_end)

    if in_string:
        if kind == "{":
            after = max(string_end, opened)
            between = text[after + 1 : string_start]
            if "," in between:
                comma = text.rindex(",", after, string_start)
                kept, tail, _ = _tail_fix(text, comma, "{", allow_str)
                return text[:comma] + kept, tail + _closers(stack[:-1])
            if ":" not in between:
                return text[:string_start], _closers(stack)
        head, tail = _fix(text[string_start:], allow_str)
        return text[:string_start] + head, tail + _closers(stack)

    comma = text.rfind(",", max(string_end, last_at) + 1)
    if comma != -1:
        if not text[comma + 1 :].strip():
            return text[:comma], _closers(stack)
        if kind != "[":
            raise _Partial("scalars after a comma in an object")
        kept, tail, empty = _tail_fix(text, comma, "[", allow_str)
        return text[: comma if empty else comma + 1] + kept, tail + _closers(stack[:-1])

    if last_char in "]}":
        if text[last_at + 1 :].strip():
            raise _Partial("text after a closed container")
        return text, _closers(stack)
    if last_char in "[{":
        head, tail = _fix(text[last_at:], allow_str)
        return text[:last_at] + head, tail + _closers(stack[:-1])

    # The last token closed a string.
    if kind == "[":
        return text, _closers(stack)
    colon = text.rfind(":", string_end)
    comma = text.rfind(",", opened + 1, string_start)
    if comma == -1:
        head, tail = _fix(text[opened:], allow_str)
        return text[:opened] + head, tail + _closers(stack[:-1])
    if colon == -1 and text.rfind(":", max(opened, comma) + 1, string_start) != -1:
        return text, _closers(stack)
    if colon != -1 and colon <= comma:
        raise _Partial("colon before the comma")
    kept, tail, empty = _tail_fix(text, comma, "{", allow_str)
    if empty:
        return text[:comma] + kept, tail + _closers(stack[:-1])
    # The library closes the object twice after a lone key (so json.loads fails then).
    return text[: comma + 1] + kept, tail + _closers(stack if colon == -1 else stack[:-1])


def partial_loads(text: str, allow_str: bool) -> tuple[Any, int]:
    """vLLM's ``partial_json_loads``: (value, chars consumed); raises on any failure."""
    try:
        head, tail = _ensure_json(text, allow_str)
        return json.loads(head + tail), len(text)
    except json.JSONDecodeError as exc:
        if "Extra data" in exc.msg:
            return _DECODER.raw_decode(text)
        raise


def reads_no_container(text: str, start: int) -> bool:
    """Whether no read from ``start`` gives an object, array or string, however the text grows.

    That is so once the first character that is not blank (``str.isspace``, as the completion's
    strip) is none of ``{["``: each way the completion goes keeps that character first (every cut
    comes after a later bracket, comma or quote; a word the slow path finishes stays a scalar),
    so ``json.loads`` fails or gives a number or a word, and ``raw_decode`` (which skips no
    blank) gives one too or fails.
    """
    found = _NOT_BLANK.search(text, start)
    return found is not None and found.group() not in '{["'


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def common_prefix_len(a: str, b: str) -> int:
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


def dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
