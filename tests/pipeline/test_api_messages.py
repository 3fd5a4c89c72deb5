"""Anthropic Messages on the chat derender: the request conversion and the events, without Kafka.

The expectations are vLLM 0.33.0's ``entrypoints/anthropic/serving.py`` behaviour for the same chat deltas
(``to_chat_completion_request``, ``message_stream_converter``, ``messages_full_converter``), and every
event and message must parse as the ``anthropic`` SDK's typed models with no unknown or missing field.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent

from tests.api_cases import ANTHROPIC_TOOLS, CHAT_TOOLS, QUESTION, golden_chunks, golden_completion
from tests.api_schemas import parsed_exactly
from worker.pipeline.apis import messages
from worker.pipeline.apis.chat_source import BadRequest


def test_a_conversation_with_system_thinking_tools_and_results_becomes_vllms_chat_request() -> None:
    body = {
        "model": "m",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: 123"},
            {"type": "text", "text": "Be brief."},
        ],
        "messages": [
            {"role": "user", "content": QUESTION},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Need weather.", "signature": "s"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "18C"}],
                    }
                ],
            },
        ],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "any"},
        "thinking": {"type": "enabled", "budget_tokens": 32},
        "stop_sequences": ["END"],
        "temperature": 0.2,
        "stream": True,
    }
    assert messages.to_chat_request(body) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": QUESTION},
            {
                "role": "assistant",
                "reasoning": "Need weather.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
                    }
                ],
                "content": "Let me look.",
            },
            # a user turn of tool results only is its tool messages, and no user message
            {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        ],
        "max_tokens": 64,
        "max_completion_tokens": 64,
        "stop": ["END"],
        "temperature": 0.2,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "thinking_token_budget": 32,
        "parallel_tool_calls": True,
        "tool_choice": "required",
        "tools": CHAT_TOOLS,
    }


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": []},  # no max_tokens
        {"model": "m", "max_tokens": 8, "messages": "hi"},
        {"model": "m", "max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]},
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [7]}]},
        {"model": "m", "max_tokens": 8, "messages": [], "tools": [{"input_schema": {}}]},
    ],
)
def test_malformed_requests_are_refused_with_the_reason(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        messages.to_chat_request(body)


@pytest.mark.parametrize(
    ("finish", "stop", "used", "complete", "want"),
    [
        ("length", None, True, True, ("max_tokens", None)),
        ("stop", None, False, False, ("end_turn", None)),
        ("stop", "END", False, False, ("stop_sequence", "END")),
        ("stop", "END", True, False, ("stop_sequence", "END")),  # a call cut short by a stop string
        ("stop", "END", True, True, ("tool_use", None)),
        ("stop", 151645, False, False, ("end_turn", None)),  # a stop token id is no stop sequence
        ("stop", None, True, False, ("tool_use", None)),  # a named (forced) tool call finishes with stop
        ("tool_calls", None, True, True, ("tool_use", None)),
        ("abort", None, False, False, (None, None)),
    ],
)
def test_stop_reason_is_mapped_as_vllm_maps_it(
    finish: str, stop: Any, used: bool, complete: bool, want: tuple[str | None, str | None]
) -> None:
    assert messages.stop_reason(finish, stop, used, complete) == want


def stream_events(chunks: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    stream = messages.MessageStream()
    events = [event for chunk in chunks for event in stream.feed(chunk)]
    return events + stream.end()


def test_the_golden_stream_becomes_thinking_text_and_tool_use_blocks_in_vllms_order() -> None:
    chunks = golden_chunks()
    events = stream_events(chunks)
    for name, data in events:
        assert data["type"] == name
        parsed_exactly(RawMessageStreamEvent, data)
    shape = [
        (name, data.get("index"), (data.get("content_block") or data.get("delta") or {}).get("type"))
        for name, data in events
    ]
    thinking = [
        d["delta"]["thinking"] for _, d in events if d.get("delta", {}).get("type") == "thinking_delta"
    ]
    arguments = [
        d["delta"]["partial_json"] for _, d in events if d.get("delta", {}).get("type") == "input_json_delta"
    ]
    assert shape == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"),
        *[("content_block_delta", 0, "thinking_delta")] * len(thinking),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        *[("content_block_delta", 2, "input_json_delta")] * len(arguments),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    # the first chunk's reasoning (it comes with the role) is kept: vLLM would drop it
    assert "".join(thinking) == "".join(
        c["choices"][0]["delta"].get("reasoning") or "" for c in chunks if c["choices"]
    )
    assert json.loads("".join(arguments)) == {"city": "Paris", "unit": "celsius"}
    start = events[0][1]
    (tool,) = [d["content_block"] for _, d in events if d.get("content_block", {}).get("type") == "tool_use"]
    assert start["message"]["id"] == chunks[0]["id"] and start["message"]["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
    }
    call = chunks[11]["choices"][0]["delta"]["tool_calls"][0]
    assert tool == {"type": "tool_use", "id": call["id"], "name": "get_weather", "input": {}}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][1]["usage"] == {"input_tokens": 232, "output_tokens": 38}


def test_text_arriving_during_a_tool_call_is_held_for_a_block_of_its_own() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    call = {"index": 0, "id": "t1", "function": {"name": "f", "arguments": "{}"}}
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"tool_calls": [call]}),
        chunk({"content": "late"}),
    ]
    chunks += [chunk({}, "stop"), {"id": "c", "model": "m", "choices": [], "usage": {"prompt_tokens": 3}}]
    names = [(n, d.get("index")) for n, d in stream_events(chunks)]
    assert names == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("message_delta", None),
        ("message_stop", None),
    ]


def test_an_error_mid_stream_closes_the_open_block_then_says_error() -> None:
    stream = messages.MessageStream()
    events = [e for c in golden_chunks()[:3] for e in stream.feed(c)]
    events += stream.error({"message": "engine died", "code": 503})
    assert [n for n, _ in events[-3:]] == ["content_block_delta", "content_block_stop", "error"]
    assert events[-1][1] == {"type": "error", "error": {"type": "overloaded_error", "message": "engine died"}}


def test_the_one_shot_completion_becomes_vllms_message() -> None:
    completion = golden_completion()
    message = messages.to_message(completion)
    parsed = parsed_exactly(Message, message)
    call = completion["choices"][0]["message"]["tool_calls"][0]
    assert [b.type for b in parsed.content] == ["thinking", "tool_use"]
    assert message["content"][0]["thinking"] == completion["choices"][0]["message"]["reasoning"]
    assert message["content"][1] == {
        "type": "tool_use",
        "id": call["id"],
        "name": "get_weather",
        "input": json.loads(call["function"]["arguments"]),
    }
    assert (message["id"], message["stop_reason"], "stop_sequence" in message) == (
        completion["id"],
        "tool_use",
        False,
    )
    usage = completion["usage"]
    assert message["usage"] == {
        "input_tokens": usage["prompt_tokens"],
        "output_tokens": usage["completion_tokens"],
    }
    empty = {**completion, "choices": [{"message": {"content": None}, "finish_reason": "stop"}]}
    assert messages.to_message(empty)["content"] == [{"type": "text", "text": ""}]
