"""``llama3_json`` as vLLM 0.34 reads it (the parser engine), beyond its golden cases.

The real llama-3.1 tokenizer (``<|python_tag|>`` is a special token there).
"""

from __future__ import annotations

import time
from functools import cache
from typing import Any

import pytest

from tests.golden_cases import derenderer_for, sample_config
from tests.parsing_helpers import (
    WEATHER_REQUEST,
    records,
    sample_tokenizer,
    splits,
    stream_summary,
    summarize,
)
from tests.parsing_helpers import sample_encode as encode
from worker.core.parsing import ChatParsing, ParseRequest, adapter_for
from worker.core.parsing.families.llama_json import Llama3JsonEngineParser, member_object, valid_call_sequence
from worker.core.parsing.tools.llama3_json import Llama3JsonToolParser
from worker.core.vllm_version import VllmVersion

M = "llama-3.1"
WEATHER = '{"name": "get_weather", "parameters": {"city": "São Paulo", "days": [1, 2.5]}}'
TIME = '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}'
CALLS = [("get_weather", '{"city": "São Paulo", "days": [1, 2.5]}'), ("get_time", '{"tz": "Europe/Paris"}')]


@cache
def parsing(name: str = "llama3_json") -> ChatParsing:
    made = ChatParsing.create(
        adapter_for(sample_tokenizer(M)),
        reasoning_parser=None,
        tool_parser=name,
        enable_auto_tool_choice=True,
        llama3_json_on_engine=True,
    )
    assert made is not None
    return made


def oneshot(text: str, request: ParseRequest = WEATHER_REQUEST) -> dict[str, Any]:
    message = parsing().parse_full(text, encode(M, text), request, [1])
    return {"content": message.content, "calls": [(c.name, c.arguments) for c in message.tool_calls]}


def stream(
    chunks: list[list[int]], finish: str = "stop", request: ParseRequest = WEATHER_REQUEST
) -> dict[str, Any]:
    session = parsing().new_stream(request, [1])
    got = stream_summary(session, records(sample_tokenizer(M), chunks), finish, names_once=True)
    return {"content": got.content, "calls": got.calls, "finish": got.finish}


@pytest.mark.parametrize("name", ["llama3_json", "llama4_json"])
def test_the_version_profile_picks_the_reader(name: str) -> None:
    config = sample_config(model_dir=M, tool_parser=name, reasoning_parser=None, enable_auto_tool_choice=True)
    for version, expected in (
        (VllmVersion.V0_33, Llama3JsonToolParser),
        (VllmVersion.V0_34, Llama3JsonEngineParser),
    ):
        parsing = derenderer_for(config, version).parsing
        assert parsing is not None and parsing.tool_cls is expected
    # Other parsers keep their class.
    hermes = ChatParsing.create(
        adapter_for(sample_tokenizer(M)),
        reasoning_parser=None,
        tool_parser="hermes",
        enable_auto_tool_choice=True,
        llama3_json_on_engine=True,
    )
    assert hermes is not None and hermes.tool_cls is not Llama3JsonEngineParser


@pytest.mark.parametrize("joint", ["; ", "\n;"])
@pytest.mark.parametrize("prefix", ["", "<|python_tag|>"])
def test_every_split_streams_the_one_shot_calls_with_whole_arguments(prefix: str, joint: str) -> None:
    text = prefix + WEATHER + joint + TIME
    assert oneshot(text) == {"content": None, "calls": CALLS}
    ids = encode(M, text)
    for chunks in splits(ids):
        session = parsing().new_stream(WEATHER_REQUEST, [1])
        deltas = [session.step(t, i, None)[0] for t, i in records(sample_tokenizer(M), chunks)]
        deltas.append(session.step("", [], "stop")[0])
        got = summarize(deltas, ids_once=True, names_once=True)
        assert got.calls == CALLS
        assert not got.content
        # Arguments come in one delta per call, never in pieces.
        pieces = [
            c for d in deltas if d is not None for c in d.tool_calls if c.function and c.function.arguments
        ]
        assert sorted(c.index for c in pieces) == [0, 1]


def test_calls_without_a_semicolon_between_them() -> None:
    """A second object needs a ``;`` first: without it the rest is content, and one-shot keeps it all."""
    text = WEATHER + " " + TIME
    assert oneshot(text) == {"content": text, "calls": []}
    got = stream([[i] for i in encode(M, text)])
    assert got["calls"] == CALLS[:1]
    assert got["content"] == TIME


@pytest.mark.parametrize("tail", ["; ; " + TIME, "; and more", " then prose"])
def test_other_text_after_a_call_ends_the_calls(tail: str) -> None:
    text = WEATHER + tail
    assert oneshot(text) == {"content": text, "calls": []}
    got = stream([[i] for i in encode(M, text)])
    assert got["calls"] == CALLS[:1]
    assert got["content"] is not None and got["content"].strip() and got["content"] in tail


@pytest.mark.parametrize("end", ["<|eom_id|>", "<|eot_id|>", "<|end_of_text|>\n"])
def test_one_shot_allows_an_end_token_after_the_last_call(end: str) -> None:
    assert valid_call_sequence(WEATHER + end) is True
    assert valid_call_sequence(WEATHER + end + "x") is False


def test_whole_output_check() -> None:
    assert valid_call_sequence("Hi " + WEATHER) is None
    assert valid_call_sequence("<|python_tag|>" + WEATHER + ";" + TIME + ";") is True
    assert valid_call_sequence("<|python_tag|>") is False
    assert valid_call_sequence('{"name": "f"}') is False  # neither arguments nor parameters
    assert valid_call_sequence("[" + WEATHER + "]") is None
    assert valid_call_sequence(WEATHER + ";;" + TIME) is False


def test_json_quoted_in_prose_stays_content() -> None:
    text = 'Send {"name": "get_time", "parameters": {"tz": "UTC"}} to me.'
    assert oneshot(text) == {"content": text, "calls": []}
    assert stream([[i] for i in encode(M, text)]) == {"content": text, "calls": [], "finish": "stop"}


def test_a_python_tag_after_prose_opens_calls() -> None:
    text = "Checking.<|python_tag|>" + TIME
    assert oneshot(text) == {"content": "Checking.", "calls": CALLS[1:]}
    got = stream([[i] for i in encode(M, text)])
    assert got["calls"] == CALLS[1:]
    assert got["content"] == "Checking."


def test_a_call_cut_short_sends_its_raw_arguments() -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Par'
    got = stream([[i] for i in encode(M, text)], finish="length")
    assert got["calls"] == [("get_weather", '{"city": "Par')]
    assert got["finish"] == "length"


def test_arguments_are_typed_by_the_tool_schema() -> None:
    request = ParseRequest(
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
                },
            }
        ],
        tool_choice="auto",
    )
    text = '{"name": "f", "arguments": {"n": "7"}}'
    assert oneshot(text, request)["calls"] == [("f", '{"n": 7}')]
    assert stream([[i] for i in encode(M, text)], request=request)["calls"] == [("f", '{"n": 7}')]


def test_tool_choice_none_keeps_a_leading_object_as_content() -> None:
    request = ParseRequest(tools=WEATHER_REQUEST.tools, tool_choice="none")
    got = stream([[i] for i in encode(M, TIME)], request=request)
    assert got["calls"] == []
    assert got["content"] == TIME


def test_member_object() -> None:
    raw = '{"name": "a", "x": {"arguments": {"no": 1}}, "arguments": {"s": "}{\\"", "o": {}}}'
    assert member_object(raw, "arguments") == '{"s": "}{\\"", "o": {}}'
    assert member_object('{"arguments": {"a": [1, {', "arguments") == '{"a": [1, {'
    assert member_object('{"arguments": ', "arguments") is None
    assert member_object('{"parameters": {}}', "arguments") is None
    with pytest.raises(ValueError, match="not an object"):
        member_object('{"arguments": "{}"}', "arguments")


def test_hostile_output_streams_in_time_per_record() -> None:
    """A call of 200,000 characters in 20,000 records, a run of 30,000 empty objects and a
    nesting of 100,000 brackets: each record costs its own length."""
    parser = Llama3JsonEngineParser(adapter_for(sample_tokenizer(M)), WEATHER_REQUEST.tools, {})
    piece = "0123456789"
    start = time.perf_counter()
    assert parser.stream('{"name": "get_weather", "parameters": {"city": "', [], WEATHER_REQUEST) is not None
    for _ in range(20_000):
        assert parser.stream(piece, [], WEATHER_REQUEST) is None
    end = parser.stream('"}}', [], WEATHER_REQUEST)
    assert end is not None and end.tool_calls[0].function is not None
    assert end.tool_calls[0].function.arguments == '{"city": "' + piece * 20_000 + '"}'
    for _ in range(30_000):
        parser.stream(";{}", [], WEATHER_REQUEST)
    deep = Llama3JsonEngineParser(adapter_for(sample_tokenizer(M)), WEATHER_REQUEST.tools, {})
    deep.stream("{", [], WEATHER_REQUEST)
    for _ in range(10_000):
        assert deep.stream("[[[[[[[[[[", [], WEATHER_REQUEST) is None
    deep.finish_stream()
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": ' + "[" * 100_000,
        "x<|python_tag|>{" + '"a":' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"name": "get_weather", "parameters": {"city": ' + "[" * 100_000 + "]" * 100_000 + "}}",
    ],
)
def test_one_shot_nesting_past_json_stays_content(text: str) -> None:
    """vLLM's json raises there (a failed request); the whole output is content, as 0.33's reader gives."""
    assert oneshot(text) == {"content": text, "calls": []}


def test_a_tokenizer_without_the_python_tag_still_reads_a_leading_object() -> None:
    """vLLM 0.34 starts without ``<|python_tag|>`` in the vocabulary (0.33's reader refuses)."""
    tokenizer = sample_tokenizer("llama-3")
    made = ChatParsing.create(
        adapter_for(tokenizer),
        reasoning_parser=None,
        tool_parser="llama3_json",
        enable_auto_tool_choice=True,
        llama3_json_on_engine=True,
    )
    assert made is not None
    message = made.parse_full(TIME, [], WEATHER_REQUEST, [1])
    assert [(c.name, c.arguments) for c in message.tool_calls] == CALLS[1:]
    session = made.new_stream(WEATHER_REQUEST, [1])
    chunks = [[i] for i in encode("llama-3", TIME)]
    assert stream_summary(session, records(tokenizer, chunks), names_once=True).calls == CALLS[1:]
