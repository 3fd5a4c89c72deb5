"""Scans of a JSON document's bytes that look at its nesting, not its strings: how deep it nests,
and how many objects, arrays and elements it holds. Both run before (or instead of) parsing it."""

from __future__ import annotations

import re
from array import array
from itertools import accumulate

from schemas.bounds import MAX_JSON_DEPTH

# JSON strings, so the brackets and commas inside them are not counted.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# Opening brackets to 1, closing ones to -1 (as signed bytes).
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def json_depth_exceeds(value: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON document ``value`` nests arrays and objects deeper than ``limit``.

    Nearly free for ordinary records: fewer opening brackets than ``limit`` (those in strings
    included) cannot nest deeper. Otherwise strings are cut out and the nesting is summed up.
    """
    if value.count(b"[") + value.count(b"{") <= limit:
        return False
    if b'"' in value:
        value = _JSON_STRING.sub(b"", value)
    steps = array("b", value.translate(_BRACKET_STEPS, _NOT_BRACKETS))
    return max(accumulate(steps), default=0) > limit


def json_structure_counts(value: bytes) -> tuple[int, int, int]:
    """The objects, arrays and commas of the JSON document ``value``, outside its strings. A few
    of them are counted without cutting the strings out first (cheaper, and as good for a size)."""
    if b'"' in value and value.count(b"{") + value.count(b"[") + value.count(b",") > 64:
        value = _JSON_STRING.sub(b"", value)
    return value.count(b"{"), value.count(b"["), value.count(b",")
