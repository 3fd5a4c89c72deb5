"""OpenAI Responses on the chat derender: the request conversion and the events, without Kafka.

The expectations are vLLM 0.33.0's non-Harmony Responses path for the same chat deltas
(``construct_input_messages``, ``SimpleStreamingEventProcessor``, ``build_response_output_items``), and
every event and ``Response`` must parse as the ``openai`` SDK's typed models with no unknown or missing field.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent

from tests.api_cases import CHAT_TOOLS, QUESTION, RESPONSES_TOOLS, golden_chunks, golden_completion
from tests.api_schemas import event_parsed_exactly, parsed_exactly
from worker.pipeline.apis import responses
from worker.pipeline.apis.chat_source import BadRequest


def test_input_items_become_vllms_chat_messages() -> None:
    previous = responses.Previous(
        messages=[{"role": "system", "content": "old instructions"}, {"role": "user", "content": QUESTION}],
        output=[
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "r"}],
            },
            {
                "type": "message",
                "id": "m",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
            },
            {"type": "function_call", "id": "fc", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        ],
    )
    body = {
        "instructions": "Be brief.",
        "input": [
            {
                "type": "reasoning",
                "id": "rs_2",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "think"}],
            },
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": '{"tz": "CET"}'},
            {"type": "function_call_output", "call_id": "c2", "output": "12:00"},
            {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        ],
    }
    assert responses.input_messages(body, previous) == [
        {"role": "system", "content": "Be brief."},  # the old instructions do not carry over
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "Checking."},  # of the previous output only messages are replayed
        {
            "role": "assistant",
            "reasoning": "think",
            "tool_calls": [
                {
                    "id": "c2",
                    "function": {"name": "get_time", "arguments": '{"tz": "CET"}'},
                    "type": "function",
                }
            ],
        },
        {"role": "tool", "content": "12:00", "tool_call_id": "c2"},
        {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ]


def test_the_request_becomes_a_chat_request_with_flat_tools_unflattened() -> None:
    body = {
        "model": "m",
        "input": QUESTION,
        "tools": RESPONSES_TOOLS,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 99,
        "temperature": 0.5,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
    }
    chat = responses.to_chat_request(body, responses.input_messages(body), stream=True)
    assert chat == {
        "model": "m",
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": CHAT_TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0.5,
        "max_tokens": 99,
        "reasoning_effort": "low",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": {"type": "object"}},
        },
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "input": 7},
        {"model": "m", "input": [{"type": "mystery"}]},
        {"model": "m", "input": [{"type": "reasoning", "encrypted_content": "x", "summary": []}]},
        {"model": "m", "input": [{"type": "reasoning", "summary": [], "content": [7]}]},
        {"model": "m", "input": [{"type": "reasoning", "summary": "x"}]},
        {"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
        {"model": "m", "input": [7]},
        {"model": "m", "input": "hi", "tools": [{"type": "web_search"}]},
        {"model": 3, "input": "hi"},
    ],
)
def test_malformed_requests_are_refused_with_the_reason(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        responses.to_chat_request(body, responses.input_messages(body), stream=False)


def stream_of(chunks: list[dict[str, Any]], body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    start = responses.response_object(body or {"model": "test-model"}, "resp_1", 0, "in_progress")
    converter = responses.ResponseStream(start)
    events = converter.start()
    for chunk in chunks:
        events += converter.feed(chunk)
    return events + converter.end()


def test_the_golden_stream_gives_openais_events_in_vllms_order() -> None:
    chunks = golden_chunks()
    events = stream_of(chunks, {"model": "test-model", "tools": RESPONSES_TOOLS})
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        event_parsed_exactly(ResponseStreamEvent, event)
    kinds = [e["type"] for e in events]
    reasoning = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    arguments = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * len(reasoning),
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * len(arguments),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = parsed_exactly(Response, events[-1]["response"])
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    reasoning_item, message, call = events[-1]["response"]["output"]
    assert reasoning_item["content"][0]["text"] == "".join(reasoning)
    assert "".join(reasoning) == "".join(
        c["choices"][0]["delta"].get("reasoning") or "" for c in chunks if c["choices"]
    )
    assert message["content"][0]["text"] == "\n\n"
    tool = chunks[11]["choices"][0]["delta"]["tool_calls"][0]
    assert (call["name"], call["call_id"], json.loads(call["arguments"])) == (
        "get_weather",
        tool["id"],
        {"city": "Paris", "unit": "celsius"},
    )
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1, 2]
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (232, 38)
    assert final.status == "completed" and final.tools[0].type == "function"


def test_a_length_finish_leaves_the_last_item_and_the_response_incomplete() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = stream_of(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}, "length"),
        ]
    )
    item = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["status"] for i in item] == ["incomplete"] and item[0]["content"][0]["text"] == "Hello"
    assert events[-1]["type"] == "response.incomplete"
    final = parsed_exactly(Response, events[-1]["response"])
    assert final.status == "incomplete" and final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"


def test_an_error_mid_stream_ends_in_response_failed() -> None:
    converter = responses.ResponseStream(
        responses.response_object({"model": "m"}, "resp_1", 0, "in_progress")
    )
    events = converter.start() + [e for c in golden_chunks()[:3] for e in converter.feed(c)]
    events += converter.fail({"message": "engine died", "code": 500})
    for event in events:
        event_parsed_exactly(ResponseStreamEvent, event)
    assert [e["type"] for e in events[-4:]] == [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.failed",
    ]
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "engine died"}


def test_the_one_shot_completion_becomes_vllms_output_items() -> None:
    completion = golden_completion()
    items, finish = responses.output_items(completion)
    response = responses.finished(
        responses.response_object({"model": "test-model"}, "resp_1", 0, "in_progress"),
        items,
        finish,
        completion["usage"],
    )
    parsed = parsed_exactly(Response, response)
    message = completion["choices"][0]["message"]
    assert [i.type for i in parsed.output] == ["reasoning", "function_call"]
    assert (
        items[0]["content"] == [{"text": message["reasoning"], "type": "reasoning_text"}]
        and items[0]["status"] is None
    )
    call = message["tool_calls"][0]
    assert (items[1]["call_id"], items[1]["arguments"], items[1]["status"]) == (
        call["id"],
        call["function"]["arguments"],
        "completed",
    )
    assert parsed.status == "completed" and parsed.usage is not None
    assert parsed.usage.output_tokens == completion["usage"]["completion_tokens"]
