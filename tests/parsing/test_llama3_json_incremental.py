"""llama3_json's incremental read of a string in progress equals the whole re-read, byte for byte.

The parser reads the call in progress incrementally while its text ends inside a
string value (each record decodes only its own characters); the class flag
``incremental = False`` keeps the whole re-read of vLLM's semantics as the
reference. Both parse the same texts cut at random points: every record's delta
(ids aside, they are random) and the end-of-stream remainder must be equal.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.parsing_helpers import (
    LLAMA3_JSON_REQUEST,
    llama3_json_matches_whole_reread,
    llama3_json_parser,
    long_cuts,
    sample_tokenizer,
    text_cuts,
)
from worker.core.parsing import adapter_for
from worker.core.parsing.tools.llama3_json import Llama3JsonToolParser

CODE = 'def f(x):\n    return {"a": [x, "\\\\"]}\n\t# café 北京 😀 \u2028 end'
#: Calls as a model writes them, and text that breaks them in the ways the reader cares about.
CORPUS = [
    json.dumps({"name": "write_file", "parameters": {"path": "a.py", "content": CODE}}),
    json.dumps({"name": "write_file", "parameters": {"content": CODE}}, ensure_ascii=False),
    json.dumps({"name": "f", "arguments": {"a": {"b": [1, 2.50, {"c": CODE}]}, "d": "x" * 40}}),
    json.dumps({"name": "f", "arguments": CODE}),  # the arguments are one string
    json.dumps({"name": "f", "arguments": ""}),
    json.dumps({"name": "f", "parameters": {"s": "\ud83d\ude00" * 5 + "tail"}}),  # surrogate escapes
    '{"name": "f", "parameters": {"s": "a\\ud83d\\ude00b\\ud83dx\\ude00\\uDBFF\\uDFFF"}}',
    '{"name": "f", "parameters": {"s": "bad \\q escape then more text and more"}}',
    '{"name": "f", "parameters": {"s": "bad \\x41 and \\U0001F600 and \\u12 done"}}',
    '{"name": "f", "parameters": {"s": "raw\ncontrol\tcharacters in the text"}}',
    '{"name": "f", "parameters": {"s": "trailing blanks      \u3000\u2028  then text  "}}',
    '{"name": "f", "parameters": {"s": "ends on a backslash \\\\\\\\\\", "t": 1}}',
    '{"name": "f", "parameters": {"a": "x", "b": 1, "a": "duplicate key grows in the middle"}}',
    '{"name": "f", "parameters": {"k": 1}, "note": "a string outside the arguments, long enough"}',
    '{"name": "f", "parameters": ["in an array", "second string, quite a long one here"]}',
    '{"name": "f", "parameters": {"a": ["x", {"b": "nested deep string with {brackets} [too]"}]}}',
    '{"name": "f", "parameters": {"n": -12.5e+3, "m": 1E400, "o": 007, "p": "after numbers"}}',
    '{"name": "f", "parameters": {"s": "text"}, "arguments": {"both": "keys given"}}',
    '{"parameters": {"s": "the name comes last, after a long string"}, "name": "f"}',
    '{"name": 5, "parameters": {"s": "a name that is not a string"}}',
    '{"name": "f", "parameters": {"s": "no closing quote at all and the text stops',
    '{"name": "f", "parameters": {"s": "unicode \\u00e9\\u4eac\\u0000 escapes \\n\\r\\t\\b\\f\\/"}}',
]


def _calls(count: int, rng: random.Random) -> str:
    return "; ".join(rng.choice(CORPUS[:6]) for _ in range(count))


_ALPHABET = [
    '"',
    "\\",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    " ",
    "\n",
    "u",
    "d",
    "8",
    "e",
    "0",
    "a",
    "é",
    "😀",
    "\t",
]


def _random_string(rng: random.Random) -> str:
    """A JSON string body mixing plain text, every escape, broken escapes and blanks."""
    pieces = []
    for _ in range(rng.randint(0, 40)):
        roll = rng.random()
        if roll < 0.4:
            pieces.append(rng.choice(["abc", "北京", " ", "  ", "x", "{", "]", "é", "\u3000", "\x1f"]))
        elif roll < 0.7:
            pieces.append(
                rng.choice(["\\n", '\\"', "\\\\", "\\/", "\\t", "\\u00e9", "\\ud83d\\ude00", "\\uDBFF"])
            )
        else:
            pieces.append(
                rng.choice(["\\", "\\u", "\\u0", "\\x4", "\\U0001", "\\q", "\n", rng.choice(_ALPHABET)])
            )
    return "".join(pieces)


def _random_value(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if depth < 3 and roll < 0.25:
        members = [
            f'"{_random_string(rng)[:8]}": {_random_value(rng, depth + 1)}' for _ in range(rng.randint(0, 3))
        ]
        return "{" + ", ".join(members) + "}"
    if depth < 3 and roll < 0.35:
        return "[" + ", ".join(_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    if roll < 0.45:
        return rng.choice(["1", "-2.5e3", "0.", "1e", "-", "true", "nul", "NaN", "-Infinity"])
    return '"' + _random_string(rng) + '"'


def _random_call(rng: random.Random) -> str:
    args = _random_value(rng)
    if rng.random() < 0.7:
        args = '{"' + rng.choice(["content", "s", "a"]) + '": ' + args + rng.choice(["}", "", ', "k": 1}'])
    key = rng.choice(["parameters", "arguments"])
    text = (
        '{"name": "' + rng.choice(["f", "write_file"]) + f'", "{key}": ' + args + rng.choice(["}", "", "}}"])
    )
    if rng.random() < 0.1:  # a typo anywhere
        cut = rng.randrange(len(text))
        text = text[:cut] + rng.choice(_ALPHABET) + text[cut + rng.randint(0, 1) :]
    return text


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return adapter_for(sample_tokenizer("llama-3.1"))


def _fast(parser: Llama3JsonToolParser, _piece: str) -> bool:
    return parser._reader is not None  # read incrementally


def _same(tokenizer: Any, pieces: list[str]) -> int:
    return llama3_json_matches_whole_reread(tokenizer, pieces, before=_fast)


def test_corpus_in_one_character_records(tokenizer: Any) -> None:
    fast = 0
    for text in CORPUS:
        for prefix in ("", "<|python_tag|>"):
            fast += _same(tokenizer, list(prefix + text))
    # A good share of these records take the incremental read (the rest hold quotes or broken text).
    assert fast > 2 * sum(len(text) for text in CORPUS) // 3


@pytest.mark.parametrize("seed", range(8))
def test_random_splits_of_real_and_broken_calls(tokenizer: Any, seed: int) -> None:
    rng = random.Random(seed)
    fast = records = 0
    for _ in range(250):
        roll = rng.random()
        if roll < 0.15:  # one long string of escapes, broken escapes, blanks and surrogates
            body = "".join(_random_string(rng).replace('"', "") for _ in range(8))
            text = '{"name": "f", "parameters": {"s": "' + body + rng.choice(['"}}', "", '", "t": "x"}}'])
        elif roll < 0.3:
            text = _calls(rng.randint(1, 3), rng)
        elif roll < 0.5:
            text = rng.choice(CORPUS)
        else:
            text = "; ".join(_random_call(rng) for _ in range(rng.randint(1, 2)))
        if rng.random() < 0.5:
            text = "<|python_tag|>" + text
        if rng.random() < 0.2:  # cut short, as a stream stopped by max_tokens is
            text = text[: rng.randrange(1, len(text) + 1)]
        pieces = text_cuts(text, rng)
        fast += _same(tokenizer, pieces)
        records += len(pieces)
        _same(tokenizer, long_cuts(text, rng))
    assert fast > records // 4, (fast, records)


def _name_closes(text: str) -> int:
    value = text.index('"name": "') + len('"name": "')
    return text.index('"', value)


@pytest.mark.parametrize("text", [t for t in CORPUS if t.startswith('{"name": "')])
def test_the_record_that_sends_the_name_may_open_a_string(tokenizer: Any, text: str) -> None:
    """One record closes the name and goes on into the arguments (a string opened, say); the
    records after it read incrementally and equal the whole re-read, wherever that record ends."""
    close = _name_closes(text)
    for end in range(close + 1, len(text)):
        pieces = [text[:close], text[close:end], *text[end:]]
        fast = _same(tokenizer, pieces)
        if text in CORPUS[:6]:  # as a model writes them: the reader holds every record after it
            assert fast == len(text) - end


def test_a_long_string_opened_with_the_name_is_not_read_again(
    tokenizer: Any, partial_json_reads: list[int]
) -> None:
    text = '{"name": "write_file", "parameters": {"content": "' + "some text, " * 300 + '"}}'
    close = _name_closes(text)
    parser = llama3_json_parser(tokenizer)
    parser.stream(text[:close], [0], LLAMA3_JSON_REQUEST)
    parser.stream(text[close : close + 40], [0], LLAMA3_JSON_REQUEST)
    partial_json_reads.clear()
    for char in text[close + 40 : -3]:
        parser.stream(char, [0], LLAMA3_JSON_REQUEST)
    assert partial_json_reads == []
