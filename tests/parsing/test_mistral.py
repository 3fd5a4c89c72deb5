"""``mistral`` tool parser beyond the golden files.

Tokenizer: the real Mistral-7B-v0.3 tokenizer in ``samples/models/mistral-7b-v0.3``
(pre-v11: ``[TOOL_CALLS]`` is one token, there is no ``[ARGS]``), so splitting
the token list at every position covers every marker boundary. The v11+
``[TOOL_CALLS]name[ARGS]{...}`` engine path has no sample tokenizer; it is
exercised with a stub vocabulary at the end. Where vLLM's streaming and
one-shot disagree (``length`` cuts, broken JSON, ``tool_choice: "none"``) the
tests assert vLLM's behaviour and say so.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from tests.parsing_helpers import MistralV11StubTokenizer, SampleHarness, create_parsing, splits
from worker.core.parsing import ChatParsing, ParseRequest, adapter_for
from worker.core.parsing.families.mistral import MistralToolParser, _JsonEvents, _JsonSyntaxError

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
CALLS = (
    '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
    '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]'
)
TEXT = "Let me check.[TOOL_CALLS] " + CALLS


HARNESS = SampleHarness("mistral-7b-v0.3")
encode, decode = HARNESS.encode, HARNESS.decode


@cache
def parsing() -> ChatParsing:
    return create_parsing(adapter_for(HARNESS.tokenizer), None, "mistral")


def request(choice: Any = "auto") -> ParseRequest:
    return ParseRequest(tools=TOOLS, tool_choice=choice)


def stream(chunks: list[list[int]], req: ParseRequest | None = None, last: str = "stop") -> dict[str, Any]:
    got = HARNESS.stream(parsing(), req or request(), chunks, last)
    return {"content": got.content, "calls": got.calls, "ids": [i for _, i in got.ids], "finish": got.finish}


def oneshot(text: str, req: ParseRequest | None = None) -> dict[str, Any]:
    msg = HARNESS.oneshot(parsing(), req or request(), text)
    return {"content": msg.content, "calls": [(c.name, c.arguments) for c in msg.tool_calls]}


def test_stream_matches_oneshot_at_every_split() -> None:
    ids = encode(TEXT)
    want = oneshot(decode(ids))
    assert want["calls"][0] == ("get_weather", '{"city": "Paris", "unit": "celsius"}')
    for chunks in splits(ids):
        got = stream(chunks)
        assert got["content"] == want["content"], [len(c) for c in chunks]
        assert got["calls"] == want["calls"], [len(c) for c in chunks]
        assert got["finish"] == "tool_calls"
        assert len(got["ids"]) == 2
        assert all(len(i) == 9 and i.isalnum() for i in got["ids"])


def test_streamed_args_are_valid_json_equal_to_oneshot() -> None:
    got = stream([[i] for i in encode(TEXT)])
    for (_, streamed), (_, expected) in zip(got["calls"], oneshot(TEXT)["calls"], strict=True):
        assert json.loads(streamed) == json.loads(expected)


def test_marker_spelled_as_text_across_records_is_content() -> None:
    """vLLM looks for the marker per record (id or text) and never buffers a partial one."""
    pieces = ["Hi [TOOL_", "CALLS] [{}]"]
    session = parsing().new_stream(request(), [1])
    out = [session.step(p, [999], None)[0] for p in pieces]
    assert [d.content if d else None for d in out] == pieces


def test_length_cut_streams_open_arguments_but_oneshot_returns_text() -> None:
    """vLLM quirk: the stream keeps what it streamed, one-shot gives the JSON back as content."""
    ids = encode(TEXT)[:-6]
    got = stream([[i] for i in ids], last="length")
    assert got["finish"] == "length"
    assert got["calls"][1][0] == "get_time"
    assert not got["calls"][1][1].endswith("}")
    want = oneshot(decode(ids))
    assert want["calls"] == []
    assert want["content"] == decode(ids).split("[TOOL_CALLS]")[1].strip()


def test_broken_json_silences_the_rest_of_the_stream() -> None:
    """vLLM's ijson coroutine dies at the first syntax error; later records stream nothing."""
    text = 'ok[TOOL_CALLS] [{"name": "get_weather", "arguments": {\'city\': \'Paris\'}}] more'
    ids = encode(text)
    got = stream([[i] for i in ids])
    assert got["content"] == "ok"
    # The record holding "{'" fails as a whole: not even the brace streams.
    assert got["calls"] == [("get_weather", "")]
    # One-shot: no usable call, the payload after the marker is the content.
    assert oneshot(decode(ids)) == {"content": decode(ids).split("[TOOL_CALLS]")[1].strip(), "calls": []}


def test_tool_choice_none_stream_drops_markup_oneshot_keeps_it() -> None:
    """vLLM quirk (golden README): streaming runs the parser and drops the calls."""
    req = request("none")
    ids = encode(TEXT)
    got = stream([[i] for i in ids], req)
    assert got["content"] == oneshot(TEXT.split("[TOOL_CALLS]")[0])["content"]
    assert got["calls"] == [] and got["finish"] == "stop"
    assert oneshot(decode(ids), req) == {"content": decode(ids), "calls": []}


def test_bare_object_string_arguments_and_trailing_text() -> None:
    text = '[TOOL_CALLS] {"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"} thanks'
    got = stream([[i] for i in encode(text)])
    # String-valued arguments stream decoded; text after the object is content.
    assert got["calls"] == [("get_time", '{"tz": "UTC"}')]
    assert got["content"] == " thanks"
    assert oneshot(decode(encode(text)))["calls"] == [("get_time", '{"tz": "UTC"}')]


def test_required_bare_array_without_marker() -> None:
    req = request("required")
    body = '[{"name": "get_weather", "arguments": {"city": "Lyon"}}]'
    got = stream([[i] for i in encode(body)], req)
    assert got["calls"] == [("get_weather", '{"city": "Lyon"}')]
    assert oneshot(body, req)["calls"] == [("get_weather", '{"city": "Lyon"}')]
    # Without a forced choice a bare array is just content.
    assert oneshot(body) == {"content": body, "calls": []}


@pytest.mark.parametrize(
    ("text", "events", "fails_at"),
    [
        ('[{"a": 12}]', ["start_array", "start_map", "map_key", "scalar", "end_map", "end_array"], None),
        ("[01]", ["start_array", "scalar"], 3),  # yajl rejects the second number when it ends
        ('[{"a" 1}]', ["start_array", "start_map", "map_key"], 7),
        ("[tru}", ["start_array"], 4),
        ('"a\nb"', [], 2),
    ],
)
def test_json_events_follow_yajl_timing(text: str, events: list[str], fails_at: int | None) -> None:
    parser = _JsonEvents()
    seen: list[str] = []
    for i, ch in enumerate(text):
        try:
            seen += [name for _, name, _ in parser.feed(ch)]
        except _JsonSyntaxError:
            assert i == fails_at
            break
    else:
        assert fails_at is None
    assert seen == events


def test_v11_engine_path_streams_name_then_arguments() -> None:
    parser = MistralToolParser(MistralV11StubTokenizer(), TOOLS, {})
    req = request()
    records: list[tuple[str, list[int]]] = [
        ("Sure.", [100]),
        ("[TOOL_CALLS]", [9]),
        ("get_weather", [101]),
        ("[ARGS]", [32]),
        ('{"city": "Paris"', [102]),
        ("}", [103]),
    ]
    deltas = [parser.stream(text, ids, req) for text, ids in records]
    final = parser.finish_stream()
    assert deltas[0] is not None and deltas[0].content == "Sure."
    named = deltas[4]
    assert named is not None and named.tool_calls[0].function is not None
    assert named.tool_calls[0].function.name == "get_weather"
    assert named.tool_calls[0].function.arguments == '{"city": "Paris"'
    assert deltas[5] is None  # the closing brace waits for the end
    assert final is not None and final.tool_calls[0].function is not None
    assert final.tool_calls[0].function.arguments == "}"
    one = MistralToolParser(MistralV11StubTokenizer(), TOOLS, {}).extract_tool_calls(
        'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"} trailing', req
    )
    assert one.content == "Sure."
    assert [(c.name, c.arguments) for c in one.calls] == [("get_weather", '{"city": "Paris"}')]
