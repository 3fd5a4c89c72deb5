"""The gateway's other APIs with their real SDKs: client -> gateway -> Kafka -> ingest -> fake vLLM ->
workers -> gateway, the topics carrying chat envelopes as for the chat API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.api_cases import ANTHROPIC_TOOLS, QUESTION, golden_chunks, golden_completion, stream_recording
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import wait_for_http
from tests.pipeline_helpers import Pipeline

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str) -> Iterator[Pipeline]:
    factory = TopicFactory(kafka_bootstrap)
    pipeline = Pipeline(kafka_bootstrap, factory, max_inflight=16, extra_recordings=(stream_recording(),))
    pipeline.start(workers=1, gateway=True)
    try:
        asyncio.run(wait_for_http(f"{pipeline.gateway_url}/healthz", 200, 60, what="(gateway)"))
        yield pipeline
    finally:
        pipeline.stop()
        factory.cleanup()


def claude(pipeline: Pipeline, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=pipeline.gateway_url, api_key=api_key, max_retries=0, timeout=60)


def golden_reasoning() -> str:
    return "".join(c["choices"][0]["delta"].get("reasoning") or "" for c in golden_chunks() if c["choices"])


def test_messages_create_answers_thinking_and_a_tool_use(pipeline: Pipeline) -> None:
    message = claude(pipeline).messages.create(
        model="test-model",
        max_tokens=256,
        messages=[{"role": "user", "content": QUESTION}],
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
    )
    want = golden_completion()
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    thinking, tool = message.content
    assert thinking.type == "thinking" and thinking.thinking == want["choices"][0]["message"]["reasoning"]
    assert tool.type == "tool_use" and tool.name == "get_weather"
    assert tool.input == json.loads(want["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    assert (
        message.stop_reason == "tool_use"
        and message.usage.output_tokens == want["usage"]["completion_tokens"]
    )


def test_messages_stream_gives_the_event_sequence_and_the_same_message(pipeline: Pipeline) -> None:
    with claude(pipeline).messages.stream(
        model="test-model",
        max_tokens=256,
        messages=[{"role": "user", "content": QUESTION}],
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    thinking, text, tool = message.content
    assert thinking.type == "thinking" and thinking.thinking == golden_reasoning() and thinking.signature
    assert text.type == "text" and text.text == "\n\n"
    assert tool.type == "tool_use" and tool.input == {"city": "Paris", "unit": "celsius"}
    assert message.stop_reason == "tool_use" and message.usage.output_tokens == 38


def test_messages_errors_come_in_anthropics_shape(pipeline: Pipeline) -> None:
    robot: Any = {"role": "robot", "content": "x"}  # no role the SDK's types allow
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(pipeline).messages.create(model="test-model", max_tokens=8, messages=[robot])
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "unknown message role 'robot'"},
    }
    with pytest.raises(anthropic.BadRequestError):  # vLLM's render refuses it: the status comes through
        claude(pipeline).messages.create(
            model="test-model", max_tokens=8, messages=[{"role": "user", "content": "unrecorded"}]
        )


def test_x_api_key_is_accepted_beside_bearer(pipeline: Pipeline) -> None:
    plain, plain_port = pipeline.gateway, pipeline.gateway_port
    guarded = pipeline.start_gateway("--api-key", "sesame")
    try:
        asyncio.run(wait_for_http(f"{pipeline.gateway_url}/healthz", 200, 60, what="(gateway with key)"))
        with pytest.raises(anthropic.AuthenticationError):
            claude(pipeline, "wrong").messages.create(
                model="test-model", max_tokens=8, messages=[{"role": "user", "content": QUESTION}]
            )
        message = claude(pipeline, "sesame").messages.create(
            model="test-model",
            max_tokens=256,
            messages=[{"role": "user", "content": QUESTION}],
            tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
        )
        assert message.stop_reason == "tool_use"
    finally:
        guarded.terminate()
        pipeline.gateway, pipeline.gateway_port = plain, plain_port
