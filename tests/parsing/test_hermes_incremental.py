"""hermes reads an open call once per character (``_OpenBody``): every record's delta and the
remainder equal vLLM's whole re-read of the call (``incremental = False``), and the JSON check
answers as ``json.loads`` would."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.parsing_helpers import long_cuts, matches_whole_reread, qwen3, text_cuts
from worker.core.parsing.tools import hermes
from worker.core.parsing.tools._json_document import JsonDocument
from worker.core.parsing.tools._partial_json import is_json
from worker.core.parsing.tools.hermes import HermesToolParser
from worker.core.parsing.types import ParseRequest

REQUEST = ParseRequest(tools=None, tool_choice="auto", parallel_tool_calls=None)

# -- the JSON check --------------------------------------------------------------

#: Pieces of JSON and of what breaks it: numbers cut anywhere, literals, escapes, blanks json
#: does not allow, control characters.
JSON_PIECES = [
    *'{}[]":,-.eE+0123456789 \n\t',
    '"a"',
    "true",
    "null",
    "NaN",
    "-Infinity",
    "tru",
    "\\",
    "\\u",
    "00e9",
    "\\n",
    "\\x",
    "\x01",
    "\u3000",
    "x",
    '"k":',
    "[1,",
    '{"a":',
]


def fed(text: str, cuts: list[int], deep_at: int = 200) -> JsonDocument:
    document = JsonDocument(deep_at)
    pos = 0
    for size in cuts:
        document.feed(text, pos, min(len(text), pos + size))
        pos = min(len(text), pos + size)
    document.feed(text, pos, len(text))
    return document


@given(st.lists(st.sampled_from(JSON_PIECES), min_size=1, max_size=14), st.lists(st.integers(0, 5)))
def test_document_answers_as_json_loads(pieces: list[str], cuts: list[int]) -> None:
    text = "".join(pieces)
    document = fed(text, cuts)
    assert document.complete == is_json(text)
    if document.broken:  # final: no text after it is one document
        assert not any(is_json(text + more) for more in ("}", "]", '"}', "0}", "]}", "}]", ""))


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from('"\\\x00\u2028\ud800')),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES, st.booleans(), st.sampled_from([None, 1, "\t"]), st.lists(st.integers(1, 7)))
def test_every_document_json_writes_is_complete(
    value: Any, ascii_only: bool, indent: Any, cuts: list[int]
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert fed(text, cuts).complete
    assert not fed(text[:-1], cuts).complete or is_json(text[:-1])


def test_nesting_is_counted_not_parsed() -> None:
    assert fed("[" * 4 + "]" * 4, [], deep_at=5).complete
    deep = fed("[" * 5 + "]" * 5, [], deep_at=5)
    assert deep.deep and not deep.complete
    assert fed("[1, x, " + "[" * 9, [], deep_at=5).broken  # an error before the depth stays an error


# -- the open call, against the whole re-read ------------------------------------

#: Pieces of hermes output: tags and their prefixes, names and arguments keys with blanks, empty
#: names, JSON and broken JSON, blanks ``str.strip`` takes and json does not, deep nesting.
CALL_PIECES = [
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "</tool",
    "<",
    "\n",
    " ",
    "\u3000",
    "\x0b",
    "hi ",
    "{",
    "}",
    "[",
    "]",
    '"name"',
    '"name": "f"',
    '"name" :"get_w"',
    '"name":""',
    '"name":',
    '"name""name": "g"',
    '"name"name": "g"',
    '"arguments"',
    '"arguments": ',
    '"arguments" : {',
    ":",
    ",",
    '"',
    '"a"',
    "1",
    "-1.5e3",
    "true",
    "nul",
    '"x y"',
    '\\"',
    "\\u00e9",
    "\\",
    "\x01",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"name": "g", "arguments": {"b": [1, {"c": "d}"}]}}',
    "  }",
    "}\n",
    '{"arguments": {"q": 2}, "name": "h"}',
    "x",
    "NaN",
    '"nam',
    'e"',
    '"arg',
]


def call_text(rng: random.Random) -> str:
    parts = [rng.choice(CALL_PIECES) for _ in range(rng.randint(1, 30))]
    if rng.random() < 0.15:
        parts.insert(rng.randint(0, len(parts)), rng.choice("{[") * rng.randint(190, 210))
    prefix = rng.choice(
        ["", "pre ", "<tool_call>", "<tool_call>\n", '<tool_call>{"name": "f", "arguments": ']
    )
    return prefix + "".join(parts)


def parser(incremental: bool) -> HermesToolParser:
    made = HermesToolParser(qwen3()[1], None, {})
    made.incremental = incremental
    return made


def same_as_whole_reread(pieces: list[str]) -> None:
    matches_whole_reread(parser, step, HermesToolParser.remaining_unstreamed_args, pieces)


def step(streaming: HermesToolParser, piece: str) -> Any:
    return streaming.stream(piece, [0], REQUEST)


@pytest.mark.parametrize("seed", range(4))
def test_random_calls_in_random_records(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        text = call_text(rng)
        same_as_whole_reread(text_cuts(text, rng))
        same_as_whole_reread(long_cuts(text, rng))


@given(st.lists(st.sampled_from(CALL_PIECES), min_size=1, max_size=25), st.lists(st.integers(0, 6)))
def test_calls_from_pieces(pieces: list[str], cuts: list[int]) -> None:
    text, records, pos = "<tool_call>" + "".join(pieces), [], 0
    for size in cuts:
        records.append(text[pos : pos + size])
        pos += size
    same_as_whole_reread([*records, text[pos:]])


def test_a_long_call_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed: the JSON check takes each character of the open call once, and the
    whole call is re-read only by the record that closes it."""
    fed_chars: list[int] = []
    whole: list[int] = []
    feed, update = JsonDocument.feed, HermesToolParser._update_call

    def counting_feed(self: JsonDocument, text: str, pos: int, end: int) -> None:
        fed_chars.append(max(0, end - pos))
        feed(self, text, pos, end)

    def counting_update(self: HermesToolParser, index: int, body: str, complete: bool, deltas: Any) -> bool:
        whole.append(len(body))
        return update(self, index, body, complete, deltas)

    monkeypatch.setattr(JsonDocument, "feed", counting_feed)
    monkeypatch.setattr(HermesToolParser, "_update_call", counting_update)
    body = '{"name": "write_file", "arguments": {"content": "' + "line, {x: [1]}\\n " * 2_000 + '"}}'
    streaming = parser(True)
    sent = []
    for char in "<tool_call>\n" + body + "\n</tool_call>":
        out = streaming.stream(char, [0], REQUEST)
        sent += [call.function.arguments or "" for call in out.tool_calls if call.function] if out else []
    assert "".join(sent) == json.dumps(json.loads(body)["arguments"])
    assert sum(fed_chars) == len(body)
    assert whole == [len(body)]


@given(st.text(alphabet="</tol_ca>x", max_size=16), st.sampled_from([hermes.START, hermes.END, "abab"]))
def test_partial_tag_overlap_is_the_longest_proper_prefix(text: str, tag: str) -> None:
    longest = max((k for k in range(1, len(tag)) if text.endswith(tag[:k])), default=0)
    assert hermes.partial_tag_overlap(text, tag) == longest


@pytest.mark.parametrize("digits", [4_300, 4_301])
@pytest.mark.parametrize("number", ["{}", "-{}", "{}.5", "[{}]", '{{"a": {}}}'])
def test_an_integer_past_the_conversion_limit_is_no_document(number: str, digits: int) -> None:
    """json.loads raises on an integer of more digits than int() converts from text."""
    text = number.format("1" * digits)
    for cuts in ([], [1] * 50, [4_000]):
        assert fed(text, cuts).complete == is_json(text)
    same_as_whole_reread(['<tool_call>{"name": "f", "arguments": ' + text + "}", "\n</tool_call>"])


@pytest.mark.parametrize("before", ["", '<tool_call>{"name": "g", "arguments": {}}</tool_call>'])
def test_a_call_too_deep_for_json_is_read_once(monkeypatch: pytest.MonkeyPatch, before: str) -> None:
    """Past json's nesting limit the parse's RecursionError undoes the record's calls; what the
    open call's reading found stays (it was read again whole at every later record)."""
    made: list[int] = []

    class Counted(hermes._OpenBody):
        def __init__(self, index: int) -> None:
            made.append(index)
            super().__init__(index)

    monkeypatch.setattr(hermes, "_OpenBody", Counted)
    text = before + '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 1_500 + "1, 2" * 20
    pieces = [text[: len(before) + 60], *(text[at : at + 3] for at in range(len(before) + 60, len(text), 3))]
    same_as_whole_reread(pieces)
    assert made == [1 if before else 0]
