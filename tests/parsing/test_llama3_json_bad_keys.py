"""llama3_json with a key JSON rejects (an invalid escape, a control character).

The completion leaves a key without a value out, so until the value shows
(a lone ``-`` does not, nor a string in progress before the name is sent) the
reads go on as if the member were not there; once it shows, the completion
keeps the key and every read fails. The reader models both, so the call stays
read incrementally and then no record reads; every record's delta is compared
with the whole re-read.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parsing_helpers import (
    llama3_json_cuts_match,
    llama3_json_incremental_matches,
    llama3_json_reads_per_record,
    sample_tokenizer,
)
from worker.core.parsing import adapter_for

TOKENIZER = adapter_for(sample_tokenizer("llama-3.1"))
HEAD = '<|python_tag|>{"name": "f", "parameters": '
#: Keys JSON rejects, then values that show at once, late ("-", strings before the name) or never.
BAD_KEYS = [
    HEAD + '{"a\\q": "long string value", "b": 1}}',
    HEAD + '{"a\\q": -5, "b": 1}}',
    HEAD + '{"a\\q": -, "b": 1}}',
    HEAD + '{"a\\q":   {"x": [1, 2]}, "b": 1}}',
    HEAD + '{"k": 1, "a\\q": [1, "x"]}}',
    HEAD + '{"k": {"a\x01": true}}}',
    HEAD + '{"a\\u12": nul',
    HEAD + '{"a\\q"',
    HEAD + '{"k": ["x", {"a\\q": -Infinity}]}}',
    '{"parameters": {"a\\q": "s", "b": 2}, "name": "f"}',
    '{"parameters": {"a\\q": -',
    '{"par\\qameters": {"b": 2}, "name": "f"}',
    '{"na\\me": "f", "parameters": {"b": 2}}',
    '{"name": "f", "x\\q": -',
    '{"a\\q": -.5, "name": "f"}',
    '{"name": "f", "parameters": {"a": 1}, "b\\q": "s"}; {"name": "g"}',
]


def _same(pieces: list[str]) -> int:
    return llama3_json_incremental_matches(TOKENIZER, pieces)


@pytest.mark.parametrize("text", BAD_KEYS)
def test_one_character_records_match_the_whole_reread(text: str) -> None:
    _same(list(text))


@pytest.mark.parametrize("seed", range(3))
def test_random_cuts_match_the_whole_reread(seed: int) -> None:
    llama3_json_cuts_match(TOKENIZER, BAD_KEYS, seed)


_VALUES = st.one_of(
    st.integers(-99, 99),
    st.text(alphabet='ab "\\', max_size=5),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.sampled_from(["x", "y"]), st.booleans(), max_size=2),
)


@settings(max_examples=120, deadline=None)
@given(
    members=st.lists(st.tuples(st.sampled_from(["a", "b"]), _VALUES), max_size=4),
    at=st.integers(0, 4),
    key=st.sampled_from(['"a\\q"', '"\\u12x"', '"a\tb"', '"\x1f"']),
    value=st.sampled_from(["-", "-1", '"s"', "[1]", '{"z": 2}', "tru", "", "  -"]),
    name_first=st.booleans(),
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4),
)
def test_a_rejected_key_anywhere_matches_the_whole_reread(
    members: list[tuple[str, Any]], at: int, key: str, value: str, name_first: bool, sizes: list[int]
) -> None:
    items = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in members]
    items.insert(min(at, len(items)), f"{key}: {value}")
    args = "{" + ", ".join(items) + "}"
    text = (
        '{"name": "f", "parameters": ' + args + "}"
        if name_first
        else '{"parameters": ' + args + ', "name": "f"}'
    )
    pieces, pos, turn = [], 0, 0
    while pos < len(text):
        pieces.append(text[pos : pos + sizes[turn % len(sizes)]])
        pos, turn = pos + sizes[turn % len(sizes)], turn + 1
    _same(pieces)


def _reads_per_record(text: str, reads: list[int]) -> list[int]:
    return llama3_json_reads_per_record(TOKENIZER, text, reads)


BODY = ", ".join(f'"k{i}": [{i}, "v{i}"]' for i in range(120))


@pytest.mark.parametrize(
    "text",
    [
        HEAD + '{"a\\q": {' + BODY + "}}}",
        HEAD + '{"k": 1, "a\x01": "' + "long text " * 60 + '"}}',
        HEAD + '{"a\\q": -' + "1" * 400 + "}}",
    ],
)
def test_a_rejected_key_stops_the_reads_once_its_value_shows(
    partial_json_reads: list[int], text: str
) -> None:
    per_record = _reads_per_record(text, partial_json_reads)
    # A few records after the key closes its value has shown: no record reads from there.
    settled = text.index(":", text.index("\\q" if "\\q" in text else "\x01")) + 6
    assert not any(per_record[settled:]), sum(per_record[settled:])
    _same(list(text))


@pytest.mark.parametrize(
    "text",
    [
        '{"parameters": {"a\\q": {"k0": [0, "v0"], "k1": 1}}, "name": "f"}',
        '{"parameters": {"a\\q": "v" \\"x", "name": "f"}',
        '{"parameters": {"a\\q": "v"} \\"x, "name": "f"}',
        '{"name": "f", "parameters": {"a\\q": "v" \\"x", "b": 1}}',
    ],
)
def test_before_the_name_a_later_error_may_mend_a_rejected_key(text: str) -> None:
    """Reads without incomplete strings: an error and a quote after the rejected key can shift
    which quotes the library's scan takes to open strings, and it cuts back before the key. So
    before the name is sent the record reads whole (docs/security.md: not O(delta)), cut anywhere."""
    for first in range(1, len(text), 3):
        for second in range(first + 1, len(text), 2):
            _same([text[:first], text[first:second], text[second:]])
    _same(list(text))


def test_a_rejected_key_without_its_value_keeps_the_reader(partial_json_reads: list[int]) -> None:
    """While the value is a lone "-", the completion leaves the member out: the reader goes on."""
    text = HEAD + '{"a\\q": -' + " " * 200 + "1}}"
    per_record = _reads_per_record(text, partial_json_reads)
    assert not any(per_record[text.index("\\q") + 8 : text.index("1}}")])
    assert _same(list(text)) > 200
