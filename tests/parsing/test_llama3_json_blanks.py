"""llama3_json with whitespace JSON does not allow (``\\u3000``, ``\\x0b``, ``\\x1f``) inside a call.

Whether the library's completion keeps such a blank (and json.loads then rejects
the read) turns on where it stands and what follows it, so a call holding one is
read whole at every record, as vLLM reads it. Every record's delta is compared with
the whole re-read, which follows the library exactly (test_partial_json_library).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parsing_helpers import (
    llama3_json_matches_whole_reread,
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
    """Equal to the whole re-read; the records that ran with the incremental reader."""
    return llama3_json_matches_whole_reread(
        TOKENIZER, pieces, before=lambda parser, _piece: parser._reader is not None
    )


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
