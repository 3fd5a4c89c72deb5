"""llama3_json before a call's name is sent: records skip the whole read when it surely gives nothing.

Until the name is sent, vLLM reads the call without incomplete strings at every
record; a read that succeeds without a name sends nothing and only becomes the
read vLLM remembers. The parser skips such records (an incremental scan tells
when the read surely succeeds) and makes the remembered read once, when needed.
``incremental = False`` keeps the whole re-read as the reference: both read the
same texts, the name after the arguments, cut at random points, and every
record's delta (ids aside) and the end-of-stream remainder must be equal.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.parsing_helpers import (
    LLAMA3_JSON_REQUEST,
    delta_without_ids,
    llama3_json_matches_whole_reread,
    llama3_json_parser,
    llama3_json_reads_per_record,
    sample_tokenizer,
    text_cuts,
)
from worker.core.parsing import adapter_for
from worker.core.parsing.tools.llama3_json import Llama3JsonToolParser

CORPUS = [
    '{"parameters": {"s": "a long string, the name comes last"}, "name": "f"}',
    '{"parameters": {"a": 1, "b": -2.5e3, "c": [1, -3, "x", - 4, true], "d": null}, "name": "f"}',
    '{"arguments": ["x", - 1, "y\\"z [", {"k": "v\\\\"}], "name": "f"}; {"name": "g", "parameters": {}}',
    '{"parameters": {"s": "escaped \\" quote, { and [ brackets"}, "name": "write_file"}',
    '{"parameters": {"n": 01, "m": 1}, "name": "f"}',  # a number JSON rejects
    '{"parameters": {"n": tru, "m": nulx}, "name": "f"}',
    '{"parameters": {"k": 1}, "name": 5}',  # a name that is not a string
    '{"parameters": {"k": 1}, "name": ""}',
    '{"parameters": {"k": 1}, "name": "a \\" quote", "name": "g"}',
    '{"name"  :  "f"  , "parameters": {"k": "v"}}',
    '{"parameters": {"k": 1}, "name": "f", "name": "g"}',
    '{"parameters": {"k": 1}, "name": {"x": "y"}, "z": 1}',
    '{"parameters": {"k": 1}, "arguments": {"k": 2}, "name": "f"}',
    '{"note": {"name": "inner"}, "parameters": {"k": [1, 2]}, "name": "f"}',
    '{"parameters": {"k": 1}}; {"parameters": {"j": 2}, "name": "g"}',
    '{"parameters": {"k": -Infinity, "l": NaN, "m": -I, "n": 1e, "o": 2.}, "name": "f"}',
    '{"parameters": {"k": "unterminated and the text stops',
    '{"parameters": {"a": [[], {}, [{"b": [1, "c"]}]], "e": "\\u00e9\\ud83d\\ude00"}, "name": "f"}',
]


def _random_string(rng: random.Random) -> str:
    pieces = ["abc", " ", "\\n", '\\"', "\\\\", "[", "]", "{", "}", ",", ":", "\\u00e9", "\\ud83d", "北"]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))


def _random_value(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if depth < 3 and roll < 0.25:
        members = [
            f'"{_random_string(rng)[:6]}": {_random_value(rng, depth + 1)}' for _ in range(rng.randint(0, 3))
        ]
        return "{" + ", ".join(members) + "}"
    if depth < 3 and roll < 0.45:
        return "[" + ", ".join(_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))) + "]"
    if roll < 0.7:
        return rng.choice(["1", "-2.5e3", "0.", "1e", "-", "- 1", "true", "nul", "NaN", "-Infinity", "01"])
    return '"' + _random_string(rng) + '"'


def _random_call(rng: random.Random) -> str:
    key = rng.choice(["parameters", "arguments"])
    members = [f'"{key}": {_random_value(rng)}']
    if rng.random() < 0.3:
        members.append(f'"note": {_random_value(rng)}')
    rng.shuffle(members)
    members.append('"name": ' + rng.choice(['"f"', '"write_file"', "3", '""', "null", '"a\\"b"', "[1]"]))
    if rng.random() < 0.1:
        members.append('"name": "g"')
    text = "{" + ", ".join(members) + rng.choice(["}", "", "}}"])
    if rng.random() < 0.1:
        cut = rng.randrange(len(text))
        text = text[:cut] + rng.choice(['"', "\\", "{", "]", ",", " "]) + text[cut + rng.randint(0, 1) :]
    return text


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return adapter_for(sample_tokenizer("llama-3.1"))


def _skipped(parser: Llama3JsonToolParser, _piece: str) -> bool:
    return bool(parser._prev_stale)  # the whole read skipped


def _same(tokenizer: Any, pieces: list[str]) -> int:
    return llama3_json_matches_whole_reread(tokenizer, pieces, after=_skipped)


def test_corpus_in_one_character_records(tokenizer: Any) -> None:
    skipped = 0
    for text in CORPUS:
        for prefix in ("", "<|python_tag|>"):
            skipped += _same(tokenizer, list(prefix + text))
    assert skipped > sum(len(text) for text in CORPUS) // 2


@pytest.mark.parametrize("seed", range(8))
def test_random_splits_of_calls_named_last(tokenizer: Any, seed: int) -> None:
    rng = random.Random(seed)
    skipped = records = 0
    for _ in range(250):
        text = (
            rng.choice(CORPUS)
            if rng.random() < 0.2
            else "; ".join(_random_call(rng) for _ in range(rng.randint(1, 2)))
        )
        if rng.random() < 0.5:
            text = "<|python_tag|>" + text
        if rng.random() < 0.3:  # cut short, as a stream stopped by max_tokens is
            text = text[: rng.randrange(1, len(text) + 1)]
        pieces = text_cuts(text, rng)
        skipped += _same(tokenizer, pieces)
        records += len(pieces)
    assert skipped > records // 4, (skipped, records)


@pytest.mark.parametrize(
    ("body", "scan_factor"),
    [
        (", ".join(f'"k{i}": {i}' for i in range(400)), 2),
        (", ".join(f'"k{i}": "v{i}"' for i in range(300)), 2),
        # A string in progress is also decoded as it grows: its characters are scanned twice more.
        ('"s": "' + "a long string, " * 300 + '"', 4),
        ('"a": [' + ", ".join(f'[{i}, "x", -{i}.5]' for i in range(150)) + "]", 2),
        # Escaped quotes in strings in progress: the library's scan skips them (the read succeeds).
        ('"s": "' + 'a \\"quoted\\" {string}, ' * 200 + '"', 4),
        (", ".join(f'"k\\"{i}": ["v\\"{i}", "\\"{i}\\\\"]' for i in range(150)), 4),
    ],
)
def test_records_before_the_name_skip_the_whole_read(
    partial_json_reads: list[int], tokenizer: Any, body: str, scan_factor: int
) -> None:
    """Until the name's value closes, a record scans a constant number of times its own characters
    and reads nothing whole."""
    read = partial_json_reads
    text = '<|python_tag|>{"parameters": {' + body + '}, "name": "f"}'
    name_closes = text.rindex('"')
    pieces = text_cuts(text, random.Random(0))
    parser = llama3_json_parser(tokenizer)
    seen = 0
    for number, piece in enumerate(pieces):
        reader = parser._unnamed
        before = reader.scanned if reader is not None else 0
        read.clear()
        parser.stream(piece, [0], LLAMA3_JSON_REQUEST)
        seen += len(piece)
        if number > 1 and seen <= name_closes:
            assert read == [], (piece, read)  # no whole read
            assert parser._unnamed is not None
            assert parser._unnamed.scanned - before <= scan_factor * len(piece) + 64, piece
    # The name and the arguments stream as the whole re-read sends them.
    reference = llama3_json_parser(tokenizer, incremental=False)
    want = [delta_without_ids(reference.stream(piece, [0], LLAMA3_JSON_REQUEST)) for piece in pieces]
    got_parser = llama3_json_parser(tokenizer)
    got = [delta_without_ids(got_parser.stream(piece, [0], LLAMA3_JSON_REQUEST)) for piece in pieces]
    assert got == want
    assert any(delta for delta in got)


def test_a_lone_minus_then_blanks_after_a_string_in_an_array_skips_the_read(
    partial_json_reads: list[int], tokenizer: Any
) -> None:
    """The array tail from the last comma leaves the "-" out with that comma: the read succeeds."""
    text = '{"parameters": {"a": ["x\\"", -' + " \n" * 150 + '1]}, "name": "f"}'
    per_record = llama3_json_reads_per_record(tokenizer, text, partial_json_reads)
    assert not any(per_record[text.index("-") : text.index("1]")])
    assert llama3_json_matches_whole_reread(tokenizer, list(text)) == 0
