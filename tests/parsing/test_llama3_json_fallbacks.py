"""llama3_json on the text its reader used to leave to a whole re-read at every record (issue 8).

A duplicate key (``json.loads`` keeps its first position and its last value),
``parameters`` and ``arguments`` both given, and a syntax error. Each text
goes through the driver that compares every record's delta with the whole
re-read of vLLM's semantics (``incremental = False``); the work is checked by
counting the partial-JSON reads and the reader's scanned characters.
"""

from __future__ import annotations

import pytest

from tests.parsing_helpers import (
    LLAMA3_JSON_REQUEST,
    llama3_json_cuts_match,
    llama3_json_incremental_matches,
    llama3_json_parser,
    llama3_json_reads_per_record,
    sample_tokenizer,
)
from worker.core.parsing import adapter_for

TOKENIZER = adapter_for(sample_tokenizer("llama-3.1"))
HEAD = '<|python_tag|>{"name": "f", "parameters": '


def _same(pieces: list[str]) -> int:
    return llama3_json_incremental_matches(TOKENIZER, pieces)


def _reads_per_record(text: str, reads: list[int]) -> list[int]:
    return llama3_json_reads_per_record(TOKENIZER, text, reads)


#: Duplicate keys first, in the middle, repeated, nested, with values the completion leaves out
#: ("-") or cuts (strings with escapes), and the arguments key itself twice.
DUPLICATES = [
    HEAD + '{"k0": -1, "k0": 0, "k1": 1, "k2": 2, "k3": 3}}',
    HEAD + '{"a": "first value", "b": [1, 2], "c": 3, "a": "second \\u00e9 value\\n", "d": 4}}',
    HEAD + '{"a": 1, "b": 2, "a": 3, "a": 4, "b": {"x": 1, "x": [5, 6], "y": 7}, "a": -5}}',
    HEAD + '{"a": {"b": 1, "c": 2}, "a": {"c": 3, "b": 4, "c": -}}',
    HEAD + '{"a": 10, "a": -, "a": -2.5e3, "b": "x"}}',
    HEAD + '{"a": [{"k": 1, "k": 2}, {"k": "v", "j": 1, "k": "w"}], "b": 1, "a": true}}',
    HEAD + '{"s": "xyz", "t": 1, "s": "q"}}',
    HEAD + '{"a": 1}, "parameters": {"b": 2, "b": "long value here"}}',
    HEAD + '{"a": 1}, "parameters": -3}',
    HEAD + '"a string", "parameters": {"b": 1}}',
    HEAD + '{"a": 1, "a": -Infinity, "c": 1, "a": nul',
    '{"name": "f", "arguments": {"a": 1, "b": 2, "a": "open string at the end',
]
#: Syntax errors before the name that shift which quotes the library's scan takes to open strings.
SHIFTED = [
    '<|python_tag|>{"name": awrite_file", "parameters": 1e',
    '{"name": x", "parameters": {"a": "b", "c": [1, 2]}}',
    '{"name": "f"x "parameters": {"a": 1}}',
    '{"parameters": {"a": 1}, "arguments": [1] \\"x, "name": "f"}',
]
#: Both argument keys, and syntax errors the completion keeps or may still mend.
BROKEN = [
    HEAD + '{"a": 1}, "arguments": {"b": 2, "c": "more text after both keys"}}; {"name": "g"}',
    HEAD + '{"a": 1}, "arguments": -',
    '{"arguments": {"a": 1}, "parameters": [1, 2, 3], "name": "f"}',
    '{"arguments": {"a": 1}, "parameters": "a string, then the name", "name": "f"}',
    '{"arguments": {"a": 1}, "parameters": -12, "name": "f"}',
    HEAD + '{"a": 1 x, "b": "text after the error", "c": [1, 2]}}',
    HEAD + '{"a": 1,, "b": "text after the error"}}',
    HEAD + '{"a": 1, } "b": 2}}',
    HEAD + '{"a" "b": 2, "c": [1, 2, 3]}}',
    HEAD + '{"a": [1, 2,], "b": "x"}}',
    HEAD + '{"a": ["x" 1, 2, 3 4 5, "y"]}}',
    HEAD + '{"a": ["x",, 1 -',
    HEAD + '{"a": ["x", 1 - - -]}}',
    '{"a": [1 x "string opened after the error", "name": "f"}',
    '{"a": [1 x "s", "name": "f"}',
    '{"name": "f" x, "parameters": {"a": 1}}',
    HEAD + '{"a": 1}}}; {"name": "g", "parameters": {}}',
    HEAD + '{"a": "x"\u3000, "b": 2}}',
    HEAD + '{"a": tru, "b": "text after the literal", "c": [1, "d"]}}',
    HEAD + '{"a": ["x", nul- -, tr-',
    HEAD + '{"a": [1, nullx], "b": -Inx}}',
    HEAD + '{"a": tru\u3000, "b": 2}}',
    '{"a": [Na "string opened after the literal", "name": "f"}',
    *SHIFTED,
]
#: Numbers ending in a sign, exponent or point before a delimiter: the completion cuts there.
FROZEN = [
    HEAD + '{"a": 1., "b": "text after the number", "c": [1, {"d": 2}], "e": "x"}}; {"name": "g"}',
    HEAD + '{"a": [1, 2e+, "s", 3, ["t", 4]], "b": "x \\" y"}, "c": 1}',
    HEAD + '{"a": ["s", 1.5e-, 2, "t"], "b": [3, "u"]}}',
    HEAD + '{"a": {"b": -1.}, "c": "string", "d": [1]}}',
    '{"name": "f", "x": 7e, "parameters": {"a": "b"}}',
    HEAD + '{"a": -., "b": "signs only wrap to the end of the text"}}',
    HEAD + '{"a": 01., "b": "the cut value is not JSON either"}}',
]


@pytest.mark.parametrize("text", DUPLICATES + BROKEN + FROZEN)
def test_one_character_records_match_the_whole_reread(text: str) -> None:
    _same(list(text))


@pytest.mark.parametrize("text", SHIFTED)
def test_three_records_cut_anywhere_match_the_whole_reread(text: str) -> None:
    for first in range(1, len(text)):
        for second in range(first + 1, len(text)):
            _same([text[:first], text[first:second], text[second:]])


@pytest.mark.parametrize("seed", range(4))
def test_random_cuts_match_the_whole_reread(seed: int) -> None:
    llama3_json_cuts_match(TOKENIZER, DUPLICATES + BROKEN + FROZEN, seed)


def test_a_duplicate_key_first_keeps_the_reader(partial_json_reads: list[int]) -> None:
    body = ", ".join(f'"k{i}": {i}' for i in range(300))
    text = HEAD + '{"k0": -1, ' + body + "}}"
    per_record = _reads_per_record(text, partial_json_reads)
    # Only the records of the name and of the call's end read the call.
    late = per_record[text.index('"k1"') : -2]
    assert not any(late), sum(late)
    assert _same(list(text)) > len(text) - 60


def test_a_repeated_duplicate_in_the_middle_matches_and_keeps_the_reader(
    partial_json_reads: list[int],
) -> None:
    members = ", ".join(f'"k{i}": "v{i}"' for i in range(40))
    repeats = ", ".join(f'"k5": "value {i} \\u00e9 with more text"' for i in range(30))
    text = HEAD + "{" + members + ", " + repeats + ', "z": 1}}'
    assert not any(_reads_per_record(text, partial_json_reads)[text.index('"k1"') : -2])
    assert _same(list(text)) > len(text) - 60


def test_both_argument_keys_stop_the_reads(partial_json_reads: list[int]) -> None:
    text = HEAD + '{"a": 1}, "arguments": {' + ", ".join(f'"k{i}": {i}' for i in range(200)) + "}}"
    per_record = _reads_per_record(text, partial_json_reads)
    assert not any(per_record[text.index('"arguments": {') + 15 :])
    _same(list(text))


@pytest.mark.parametrize("second", ["[1, 2, 3], ", '"a string value", ', "-5, "])
def test_both_argument_keys_before_the_name_match_the_whole_reread(second: str) -> None:
    """Before the name these records read whole: a later error and quote can cut a read back
    before the second key, and it succeeds (``SHIFTED``)."""
    tail = ", ".join(f'"k{i}": {i}' for i in range(20))
    text = '{"parameters": {"a": 1}, "arguments": ' + second + tail + ', "name": "f"}'
    _same(list(text))
    for cut in range(1, len(text)):
        _same([text[:cut], text[cut:]])


@pytest.mark.parametrize(
    "error",
    [" x", ",,", ", }", " 1", ": 1", "]"],
)
def test_a_syntax_error_stops_the_reads(partial_json_reads: list[int], error: str) -> None:
    """Once the completion keeps the error for any later text, no record reads the call."""
    tail = ", ".join(f'"k{i}": [{i}, "v"]' for i in range(100))
    text = HEAD + '{"a": 1' + error + ", " + tail + "}}"
    per_record = _reads_per_record(text, partial_json_reads)
    assert not any(per_record[text.index(error) + len(error) + 2 :])
    _same(list(text))


@pytest.mark.parametrize("literal", ["tru", "nullx", "-Inx", "N"])
def test_a_literal_the_completion_cannot_finish_stops_the_reads(
    partial_json_reads: list[int], literal: str
) -> None:
    """Once a delimiter follows it, the completion's walk raises there at every read."""
    tail = ", ".join(f'"k{i}": [{i}, "v"]' for i in range(100))
    text = HEAD + '{"a": ' + literal + ", " + tail + "}}"
    per_record = _reads_per_record(text, partial_json_reads)
    assert not any(per_record[text.index(literal) + len(literal) + 2 :])
    _same(list(text))


@pytest.mark.parametrize(
    "tail",
    [
        # An error in the array tail after a string: the library keeps it and json.loads fails
        # (a reimplementation of it once mended these, and the parser streamed values vLLM never does).
        '["x" 1',
        '["x",, 2',
        '["x", 1 -',
        '["x", tr-',
    ],
)
def test_errors_in_the_array_tail_after_a_string_fail_as_the_library_fails(tail: str) -> None:
    text = HEAD + '{"a": ' + tail
    parser = llama3_json_parser(TOKENIZER)
    for char in text:
        parser.stream(char, [0], LLAMA3_JSON_REQUEST)
    assert parser._read(parser._text) is None
    _same(list(text))


@pytest.mark.parametrize("error", ["1 ", ",, ", "1 -", "tr- "])
def test_an_error_in_the_array_tail_after_a_string_stops_the_reads(
    partial_json_reads: list[int], error: str
) -> None:
    """The benchmark's shape: numbers after the error, no bracket or quote, every read fails."""
    text = HEAD + '{"k": ["x" ' + error + " ".join(str(i) for i in range(300)) + "]}}"
    per_record = _reads_per_record(text, partial_json_reads)
    assert not any(per_record[text.index('"x"') + 4 + len(error) : -2])
    _same(list(text))


def test_an_error_before_the_name_is_cut_before_a_string_that_opened_after_it() -> None:
    """Without incomplete strings the completion cuts before the string: the read succeeds."""
    text = '{"a": [1 x "abc'
    parser = llama3_json_parser(TOKENIZER)
    for char in text:
        parser.stream(char, [0], LLAMA3_JSON_REQUEST)
    assert parser._read(parser._text) is not None
    _same(list(text))


@pytest.mark.parametrize("number", ["1.", "-2e", "3.5e+"])
def test_a_number_the_completion_cuts_reads_once(partial_json_reads: list[int], number: str) -> None:
    """After such a number every read fails or gives the value cut there: one more read at most."""
    tail = ", ".join(f'"k{i}": [{i}, "v{i}", {{"w": {i}}}]' for i in range(60))
    text = HEAD + '{"a": ' + number + ", " + tail + "}}"
    per_record = _reads_per_record(text, partial_json_reads)
    assert sum(1 for n in per_record[text.index(number) + len(number) + 2 :] if n) <= 1
    _same(list(text))


def test_a_dead_string_stops_the_reads(partial_json_reads: list[int]) -> None:
    """A control character JSON rejects inside a finished string: every later read fails."""
    text = HEAD + '{"a": "x\ty", "b": "' + "long text " * 50 + '"}}'
    per_record = _reads_per_record(text, partial_json_reads)
    assert not any(per_record[text.index('"b"') :])
    _same(list(text))
