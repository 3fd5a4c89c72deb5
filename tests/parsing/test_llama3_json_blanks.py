"""llama3_json with whitespace JSON does not allow (``\\u3000``, ``\\x0b``, ``\\x1f``) inside a call.

json.loads rejects such a blank wherever the library's completion keeps it. While only
blanks follow it the completion strips it (or keeps the text whole, and the read fails);
once a comma or closer follows a value, or a value starts, every read keeps it and fails,
so no record reads again. Elsewhere the call is read whole, as vLLM reads it. Every
record's delta is compared with the whole re-read, which follows the library exactly
(test_partial_json_library).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parsing_helpers import (
    llama3_json_incremental_matches,
    llama3_json_reads_per_record,
    sample_tokenizer,
    text_cuts,
)
from worker.core.parsing import adapter_for

TOKENIZER = adapter_for(sample_tokenizer("llama-3.1"))
HEAD = '<|python_tag|>{"name": "f", "parameters": '
BLANKS = ["\u3000", "\x0b", "\x1f", "\x85", "\u2028"]
BASES = [
    HEAD + '{"a": 1, "b": [1, 2, {"c": "x"}], "d": "text", "e": -2.5, "f": true}}; {"name": "g"}',
    HEAD + '["x", 1, "y", [2, "z"], -3, nul]}',
    '{"parameters": {"a": 1, "b": "s"}, "name": "f"}',
    '{"name": "f", "arguments": {"a": {"b": {"c": [1, -]}}}}',
    '{"parameters": {"a": ["x", "y", 1, "z"], "b": {"c": "d"}, "e": [[], {}]}, "name": "f"}',
    HEAD + '{"a": ["x", -1, "y", tru, "z,", {"k:": "v"}], "b": "w", "c": [-, 2]}}',
    '{"name": "f", "parameters": {"a,b": "x", "c": [{"d": "e"}, "f"]}}; {"name": "g"}',
]
CORPUS = [
    HEAD + '{"a": 1\u3000, "b": 2}}',
    HEAD + '{"a": 1,\x0b "b": "long string value"}}',
    HEAD + '{"a":\u3000-, "b": 2}}',
    HEAD + '{"a": [1\x1f, -5]}}',
    HEAD + '{"a": [1\x1f]}}',
    HEAD + '{"a": ["x"\u3000, 1, "y"]}}',
    HEAD + '{\u3000"a": {"b": 1}}}',
    HEAD + '{"a": 1}\u3000}',
    '{"name": "f"\u3000, "parameters": {"a": 1}}',
    '{"parameters": {"a": 1\u3000, "b": 2}, "name": "f"}',
]


def _same(pieces: list[str]) -> int:
    return llama3_json_incremental_matches(TOKENIZER, pieces)


@pytest.mark.parametrize("text", CORPUS)
def test_one_character_records_match_the_whole_reread(text: str) -> None:
    _same(list(text))


@pytest.mark.parametrize("seed", range(3))
def test_random_blanks_match_the_whole_reread(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        text = rng.choice(BASES)
        for _ in range(rng.randint(1, 2)):
            at = rng.randrange(1, len(text))
            text = text[:at] + rng.choice(BLANKS) + text[at:]
        if rng.random() < 0.3:
            text = text[: rng.randrange(1, len(text) + 1)]
        _same(text_cuts(text, rng))


@settings(max_examples=150, deadline=None)
@given(
    base=st.sampled_from(BASES),
    places=st.lists(st.tuples(st.floats(0.0, 1.0), st.sampled_from(BLANKS)), min_size=1, max_size=2),
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4),
)
def test_blanks_anywhere_match_the_whole_reread(
    base: str, places: list[tuple[float, str]], sizes: list[int]
) -> None:
    text = base
    for where, blank in places:
        at = 1 + int(where * (len(text) - 1))
        text = text[:at] + blank + text[at:]
    pieces, pos, turn = [], 0, 0
    while pos < len(text):
        pieces.append(text[pos : pos + sizes[turn % len(sizes)]])
        pos, turn = pos + sizes[turn % len(sizes)], turn + 1
    _same(pieces)


def _all_places(text: str) -> list[int]:
    """Every index outside strings after the call's first character (a blank goes before it)."""
    places, in_string, escaped = [], False, False
    for at, char in enumerate(text):
        if not in_string and at > text.index("{"):
            places.append(at)
        if in_string:
            escaped, in_string = char == "\\" and not escaped, in_string and (escaped or char != '"')
        else:
            in_string = char == '"'
    return places


@pytest.mark.parametrize("base", BASES)
def test_a_blank_at_every_place_matches_the_whole_reread(base: str) -> None:
    rng = random.Random(base)
    for at in _all_places(base):
        blank = rng.choice(BLANKS) + rng.choice(["", " ", "\u3000", "\x0b\n"])
        _same(list(base[:at] + blank + base[at:]))


def _reads_per_record(text: str, reads: list[int]) -> list[int]:
    return llama3_json_reads_per_record(TOKENIZER, text, reads)


BODY = ", ".join(f'"k{i}": [{i}, "v{i}"]' for i in range(100))


@pytest.mark.parametrize(
    ("text", "settled"),
    [
        (HEAD + '{"a": 1\u3000, ' + BODY + "}}", "\u3000"),
        (HEAD + '{"a": 1' + "\u3000 " * 100 + ", " + BODY + "}}", "\u3000"),
        (HEAD + '{"a": "x"\x0b, ' + BODY + "}}", "\x0b"),
        (HEAD + '{"a": ["x"\x1f, ' + BODY[6:] + "]}}", "\x1f"),
        (HEAD + '{"a": [1]\x85, ' + BODY + "}}", "\x85"),
        (HEAD + '{"a":\u2028{' + BODY + "}}}", "\u2028"),
        (HEAD + '{"a": [\u3000"x", ' + BODY[6:] + "]}}", "\u3000"),
        (HEAD + '{"a": [\u3000' + ", ".join(str(i) for i in range(300)) + "]}}", "\u3000"),
    ],
)
def test_a_blank_then_a_comma_or_a_value_stops_the_reads(
    partial_json_reads: list[int], text: str, settled: str
) -> None:
    """No record reads from the blank on: while blanks follow it the reader reads, then every read fails."""
    per_record = _reads_per_record(text, partial_json_reads)
    assert not any(per_record[text.index(settled) :]), sum(per_record[text.index(settled) :])
    _same(list(text))


@pytest.mark.parametrize(
    "text",
    [
        '{"parameters": {"a": 1\u3000, ' + BODY + '}, "name": "f"}',
        '{"parameters": {"a": [\u30001, ' + BODY[6:] + ']}, "name": "f"}',
    ],
)
def test_a_blank_before_the_name_matches_the_whole_reread(text: str) -> None:
    """Before the name is sent these records read whole: a later error and a quote could still cut
    a read back before the blank (see ``_skips_unnamed``)."""
    _same(list(text))
