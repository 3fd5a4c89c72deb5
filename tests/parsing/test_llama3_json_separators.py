"""llama3_json with text other than ``; `` between calls, or blanks before a call.

vLLM reads a call, skips two characters (meant for ``; ``) and reads the rest
from there. With ``;  {`` or ``; \\n{`` the next read starts with blanks: it
reads the call in progress like any other, but once that call is complete and
more text follows, ``raw_decode`` (which does not skip blanks) fails every read.
With ``;{`` or ``,{`` it starts inside the next object, on a string it reads
whole: no later record gives anything. The parser keeps the calls before and
reads the call in progress incrementally, and stops reading once no read can
succeed; every record's delta is compared with the whole re-read.
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
TAG = "<|python_tag|>"
A = '{"name": "f", "parameters": {"a": 1, "s": "text"}}'
B = '{"name": "g", "arguments": {"b": [1, 2], "t": "more text"}}'
C = '{"name": "h", "parameters": {}}'
#: What models write between calls, and what lands vLLM's next read elsewhere.
SEPARATORS = [
    "; ",
    ";  ",
    "; \n",
    ";\n",
    ";\n\n",
    ";",
    ",",
    ", ",
    " ",
    "  ",
    "",
    "\n",
    ";\u3000",
    "; \t\r\n ",
]

CORPUS = [
    *(TAG + A + sep + B + sep + C for sep in SEPARATORS),
    *(A + sep + B for sep in SEPARATORS),
    TAG + " " + A + "; " + B,
    TAG + "\n\n" + A,
    TAG + "\u3000" + A,
    TAG + "  " + '"name": "f"}',
    TAG + A + "; " + B + ";  " + C + "; " + A,
    TAG + A + ";" + " " * 30 + B,
    TAG + A + "; " + " " * 30 + "x" + B,
    TAG + A + ';{ "name": "g", "parameters": {}}',
    TAG + A + '; "parameters"]',
    TAG + A + "; []",
    TAG + A + ";  [1, 2]; " + B,
    TAG + A + ";  " + B[:-1] + ' x, "c": 2}}',
    TAG + A + "; \n" + B + "   ",
]


def _same(pieces: list[str]) -> int:
    return llama3_json_incremental_matches(TOKENIZER, pieces)


@pytest.mark.parametrize("text", CORPUS)
def test_one_character_records_match_the_whole_reread(text: str) -> None:
    _same(list(text))


@pytest.mark.parametrize("seed", range(4))
def test_random_cuts_match_the_whole_reread(seed: int) -> None:
    llama3_json_cuts_match(TOKENIZER, CORPUS, seed)


_ARGS = st.dictionaries(
    st.sampled_from(["a", "b", "k"]),
    st.one_of(st.integers(-99, 99), st.text(alphabet='ab "\\{}[];,', max_size=6), st.lists(st.booleans())),
    max_size=4,
)


@settings(max_examples=120, deadline=None)
@given(
    calls=st.lists(_ARGS, min_size=1, max_size=4),
    separators=st.lists(st.sampled_from(SEPARATORS), min_size=3, max_size=3),
    lead=st.sampled_from(["", " ", "\n ", "\u3000"]),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    stop=st.floats(0.0, 1.0),
)
def test_any_separators_match_the_whole_reread(
    calls: list[Any], separators: list[str], lead: str, sizes: list[int], stop: float
) -> None:
    text = TAG + lead
    for i, args in enumerate(calls):
        text += (separators[i - 1] if i else "") + json.dumps({"name": f"f{i}", "parameters": args})
    if stop < 0.3:  # cut short, as a stream stopped by max_tokens is
        text = text[: max(1, int(len(text) * stop / 0.3))]
    pieces, pos, turn = [], 0, 0
    while pos < len(text):
        pieces.append(text[pos : pos + sizes[turn % len(sizes)]])
        pos, turn = pos + sizes[turn % len(sizes)], turn + 1
    _same(pieces)


def _reads_per_record(text: str, reads: list[int]) -> list[int]:
    return llama3_json_reads_per_record(TOKENIZER, text, reads)


def _call(i: int) -> str:
    return json.dumps({"name": "f", "parameters": {"k": i, "s": f"value {i}"}})


@pytest.mark.parametrize("separator", [";  ", "; \n", ";\t\t", ";", ",", " ", "\n"])
def test_calls_after_another_separator_stop_the_reads(partial_json_reads: list[int], separator: str) -> None:
    """Once no read can succeed again, no record reads: not the earlier calls, not the next one."""
    text = TAG + separator.join(_call(i) for i in range(60))
    per_record = _reads_per_record(text, partial_json_reads)
    # The second call ends, then its separator: every read fails (or reads a string) from there.
    settled = text.index(_call(2)) + 4
    assert not any(per_record[settled:]), sum(per_record[settled:])
    _same(list(text[: text.index(_call(4))]))


@pytest.mark.parametrize(
    "head",
    [
        TAG + " ",
        TAG + "\n\n",
        TAG + _call(0) + ";  ",
        TAG + _call(0) + "; \n",
        TAG + _call(0) + "; " + _call(1) + ";\r\n ",
    ],
)
def test_a_call_after_blanks_is_read_incrementally(partial_json_reads: list[int], head: str) -> None:
    args = ", ".join(f'"k{i}": [{i}, "v{i}"]' for i in range(150))
    text = head + '{"name": "f", "parameters": {' + args + "}}"
    per_record = _reads_per_record(text, partial_json_reads)
    middle = per_record[text.index('"k1"') : -2]
    assert not any(middle), sum(middle)
    assert _same(list(text)) > len(args) - 20


def test_blanks_after_a_separator_are_not_read(partial_json_reads: list[int]) -> None:
    text = TAG + _call(0) + "; " + " \n" * 300 + _call(1)
    per_record = _reads_per_record(text, partial_json_reads)
    blanks = text.index(" \n")
    assert not any(per_record[blanks + 8 : blanks + 600]), sum(per_record[blanks + 8 : blanks + 600])
    _same(list(text))


#: What a model may write after a call instead of another one; each read from its first character
#: that is not blank gives a number or a word (which vLLM's ``in`` refuses) or fails.
PROSE = [
    "\n\nThe weather in Paris is sunny.",
    " I have called the tool.",
    "; Note: done",
    '; 1. first {"a": [2]} then ]',
    "; nullx {",
    "; true",
    '; tru"e" [',
    "; -Infinity, {}",
    ';\u3000x {"name": "g"}',
    ". NaN",
    ";\n\n  false {",
]


@pytest.mark.parametrize("prose", PROSE)
def test_prose_after_a_call_matches_the_whole_reread(prose: str) -> None:
    for text in (TAG + A + prose, TAG + A + "; " + B + prose, A + prose + " more"):
        _same(list(text))


@pytest.mark.parametrize("seed", range(3))
def test_prose_after_calls_in_random_cuts_matches_the_whole_reread(seed: int) -> None:
    corpus = [TAG + A + prose + extra for prose in PROSE for extra in ("", " " + B, ' "x" ] }')]
    llama3_json_cuts_match(TOKENIZER, corpus, seed, rounds=80)


def test_prose_after_a_call_is_not_read(partial_json_reads: list[int]) -> None:
    """vLLM reads the call and the prose after it at every record: quadratic in the prose."""
    text = TAG + _call(0) + "\n\nI have called the function, " + "and here is more about it. " * 40
    per_record = _reads_per_record(text, partial_json_reads)
    prose = text.index("I have") + 2
    assert not any(per_record[prose:]), sum(per_record[prose:])
    _same(list(text))


#: A JSON array of calls, as a model may write instead of ``; `` joined objects: vLLM reads the
#: array, which has no ``.get``, at every record and never sends a call.
ARRAYS = [
    TAG + "[" + A + ", " + B + "]",
    "[" + A + "]",
    TAG + " [" + A + "]",
    TAG + A + "; [" + B + "]",
    TAG + '["x", ' + A + "]",
]


@pytest.mark.parametrize("text", ARRAYS)
def test_an_array_of_calls_matches_the_whole_reread(text: str) -> None:
    _same(list(text))


def test_an_array_of_calls_is_not_read_after_it_opens(partial_json_reads: list[int]) -> None:
    text = TAG + "[" + ", ".join(_call(i) for i in range(40)) + "]"
    per_record = _reads_per_record(text, partial_json_reads)
    assert not any(per_record[len(TAG) + 2 :]), sum(per_record[len(TAG) + 2 :])


@pytest.mark.parametrize("seed", range(2))
def test_arrays_in_random_cuts_match_the_whole_reread(seed: int) -> None:
    llama3_json_cuts_match(TOKENIZER, [text + tail for text in ARRAYS for tail in ("", "; " + C)], seed)


#: Two characters after a call that hold a quote or bracket: the call is not kept, so each read
#: scans the next call's text too (its quotes counted from the wrong parity after `\"`).
ODD_SEPARATORS = ['\\"', '"', '";', "; [", "]", "}", '\\"\\"']
ESCAPED = '{"name": "f", "parameters": {"a": "b\\"c", "d": [1, "e\\"]"]}}'


@pytest.mark.parametrize("separator", ODD_SEPARATORS)
def test_a_call_after_odd_separators_matches_the_whole_reread(separator: str) -> None:
    """A review's fuzz found the call after ``\\"`` read incrementally where the whole read, which
    starts at the call before, failed: its remainder at the finish differed."""
    for text in (A + separator + ESCAPED, TAG + A + separator + ESCAPED + separator + C):
        _same(list(text))


@pytest.mark.parametrize("seed", range(2))
def test_odd_separators_in_random_cuts_match_the_whole_reread(seed: int) -> None:
    corpus = [TAG + A + sep + ESCAPED + tail for sep in ODD_SEPARATORS for tail in ("", sep + B)]
    llama3_json_cuts_match(TOKENIZER, corpus, seed)
