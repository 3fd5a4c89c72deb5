"""The gateway's other APIs with their real SDKs: client -> gateway -> Kafka -> ingest -> fake vLLM ->
workers -> gateway, the topics carrying chat envelopes as for the chat API."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from tests.api_cases import (
    ANTHROPIC_TOOLS,
    CHAT_TOOLS,
    QUESTION,
    RESPONSES_TOOLS,
    golden_chunks,
    golden_completion,
    stream_recording,
)
from tests.fake_vllm import Recording
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import TopicReader, wait_for_http
from tests.paths import REPO_ROOT
from tests.pipeline_helpers import Pipeline, cli

pytestmark = pytest.mark.kafka


SECOND_TURN = "And in Rome?"
INSTRUCTIONS = "Be brief."


def second_turn_recording() -> Recording:
    """The second turn of a conversation whose first was the golden stream: vLLM's messages for it."""
    messages = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": "\n\n",
        },  # the first turn's message; its reasoning and call are not replayed
        {"role": "user", "content": SECOND_TURN},
    ]
    first = stream_recording()
    request = {"model": "test-model", "messages": messages, "tools": CHAT_TOOLS, "stream": False}
    return dataclasses.replace(first, name="second-turn", request=request)


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str) -> Iterator[Pipeline]:
    factory = TopicFactory(kafka_bootstrap)
    extra = (stream_recording(), second_turn_recording())
    pipeline = Pipeline(kafka_bootstrap, factory, max_inflight=16, extra_recordings=extra)
    pipeline.start(workers=1)
    store = factory("responses", 3, config={"cleanup.policy": "compact"})
    pipeline.start_gateway("--responses-topic", store)
    pipeline.responses_topic = store  # type: ignore[attr-defined]
    with pipeline.serving() as ready:
        yield ready


def claude(pipeline: Pipeline, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=pipeline.gateway_url, api_key=api_key, max_retries=0, timeout=60)


def golden_reasoning() -> str:
    return "".join(c["choices"][0]["delta"].get("reasoning") or "" for c in golden_chunks() if c["choices"])


def test_messages_create_answers_thinking_and_a_tool_use(pipeline: Pipeline) -> None:
    message = claude(pipeline).messages.create(
        model="test-model",
        max_tokens=256,
        messages=[{"role": "user", "content": QUESTION}],
        tools=ANTHROPIC_TOOLS,
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
        tools=ANTHROPIC_TOOLS,
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


def test_messages_thinking_and_tool_choice_reach_vllm_as_its_own_chat_request(pipeline: Pipeline) -> None:
    """The SDK's ``thinking`` and ``tool_choice`` (Claude Code sends both) are converted as vLLM converts
    them, and the answer still comes as thinking and tool_use blocks."""
    message = claude(pipeline).messages.create(
        model="test-model",
        max_tokens=256,
        messages=[{"role": "user", "content": QUESTION}],
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "any"},
        thinking={"type": "enabled", "budget_tokens": 128},
    )
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    assert message.stop_reason == "tool_use"
    request_id = message.id[message.id.index("msg_") :]

    async def request_record() -> dict[str, Any]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.requests_topic).start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for record in reader.records:
                    if record.key == request_id.encode() and b'"request"' in record.value:
                        found: dict[str, Any] = json.loads(record.value)
                        return found
                await asyncio.sleep(0.1)
            raise AssertionError(f"no request record for {request_id}")
        finally:
            await reader.stop()

    record = asyncio.run(request_record())
    assert record["origin"] == {"api": "messages", "id": request_id}
    chat = record["request"]
    assert (chat["thinking_token_budget"], chat["tool_choice"]) == (128, "required")
    assert (chat["max_tokens"], chat["max_completion_tokens"]) == (256, 256)
    assert chat["tools"] == CHAT_TOOLS


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
            tools=ANTHROPIC_TOOLS,
        )
        assert message.stop_reason == "tool_use"
    finally:
        guarded.terminate()
        pipeline.gateway, pipeline.gateway_port = plain, plain_port


# --- Responses ---------------------------------------------------------------------------------------


def oai(pipeline: Pipeline, url: str | None = None) -> openai.OpenAI:
    base = url or pipeline.gateway_url
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)


def test_responses_stream_gives_the_events_and_the_completed_response(pipeline: Pipeline) -> None:
    stream = oai(pipeline).responses.create(
        model="test-model", input=QUESTION, tools=RESPONSES_TOOLS, stream=True
    )
    events: list[Any] = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for done in (
        "response.reasoning_text.done",
        "response.output_text.done",
        "response.function_call_arguments.done",
    ):
        assert done in kinds
    final = events[-1]
    assert final.type == "response.completed"
    response = final.response
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    reasoning, _, call = response.output
    assert (
        reasoning.type == "reasoning"
        and reasoning.content
        and reasoning.content[0].text == golden_reasoning()
    )
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris", "unit": "celsius"}
    assert response.usage is not None and response.usage.output_tokens == 38


def test_responses_create_answers_one_response(pipeline: Pipeline) -> None:
    response = oai(pipeline).responses.create(model="test-model", input=QUESTION, tools=RESPONSES_TOOLS)
    want = golden_completion()["choices"][0]["message"]
    assert response.status == "completed" and response.id.startswith("resp_")
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    reasoning, call = response.output
    assert (
        reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].text == want["reasoning"]
    )
    assert call.type == "function_call" and call.arguments == want["tool_calls"][0]["function"]["arguments"]
    assert response.output_text == ""


def test_a_one_shot_response_answered_whole_writes_no_cancel(pipeline: Pipeline) -> None:
    """The handler closes the chat once it has the one answer; that wrote a cancel record for every
    successful one-shot (and Batch line), which ingest keeps as an early cancel of a request long gone."""
    ids = [
        oai(pipeline).responses.create(model="test-model", input=QUESTION, tools=RESPONSES_TOOLS).id
        for _ in range(2)
    ]

    async def records_of() -> list[Any]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.requests_topic).start()
        try:
            await asyncio.sleep(5)  # a cancel is written right after its answer: long past by now
            return [r for r in reader.records if r.key is not None and r.key.decode() in ids]
        finally:
            await reader.stop()

    mine = asyncio.run(records_of())
    assert sorted(r.key.decode() for r in mine if b'"endpoint"' in r.value) == sorted(ids)
    assert [r.value for r in mine if b'"cancel":true' in r.value] == []


def test_previous_response_id_carries_the_conversation_to_the_next_turn(pipeline: Pipeline) -> None:
    sdk = oai(pipeline)
    events = list(
        sdk.responses.create(model="test-model", input=QUESTION, tools=RESPONSES_TOOLS, stream=True)
    )
    first = events[-1]
    assert first.type == "response.completed"
    # Served only if the messages are the ones vLLM rebuilds: instructions, the first turn, the new input.
    second = sdk.responses.create(
        model="test-model",
        previous_response_id=first.response.id,
        input=SECOND_TURN,
        instructions=INSTRUCTIONS,
        tools=RESPONSES_TOOLS,
        max_output_tokens=256,
    )
    assert second.status == "completed" and second.previous_response_id == first.response.id
    assert (second.instructions, second.max_output_tokens) == (INSTRUCTIONS, 256)
    assert sdk.responses.retrieve(second.id).output[-1].type == "function_call"
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="test-model", previous_response_id="resp_unknown", input="x")


def wait_for_status(
    sdk: openai.OpenAI, response_id: str, statuses: tuple[str, ...]
) -> openai.types.responses.Response:
    deadline = time.monotonic() + 60
    while True:
        response = sdk.responses.retrieve(response_id)
        if response.status in statuses:
            return response
        assert time.monotonic() < deadline, f"{response_id} still {response.status}"
        time.sleep(0.2)


def test_background_response_is_retrieved_and_its_stream_resumed_from_any_replica(pipeline: Pipeline) -> None:
    sdk = oai(pipeline)
    queued = sdk.responses.create(model="test-model", input=QUESTION, tools=RESPONSES_TOOLS, background=True)
    assert queued.status == "queued" and queued.background
    done = wait_for_status(sdk, queued.id, ("completed",))
    assert [item.type for item in done.output] == ["reasoning", "message", "function_call"]
    resumed: list[Any] = list(sdk.responses.retrieve(queued.id, stream=True, starting_after=3))
    assert resumed[0].sequence_number == 4 and resumed[-1].type == "response.completed"
    assert [e.sequence_number for e in resumed] == list(range(4, 4 + len(resumed)))
    # A replica that did not run it answers from the topic alone.
    plain, plain_port = pipeline.gateway, pipeline.gateway_port
    other = pipeline.start_gateway("--responses-topic", pipeline.responses_topic)  # type: ignore[attr-defined]
    try:
        asyncio.run(wait_for_http(f"{pipeline.gateway_url}/healthz", 200, 60, what="(second gateway)"))
        elsewhere = oai(pipeline)
        assert elsewhere.responses.retrieve(queued.id).model_dump() == done.model_dump()
        replay: list[Any] = list(elsewhere.responses.retrieve(queued.id, stream=True))
        assert [e.model_dump() for e in replay[4:]] == [e.model_dump() for e in resumed]
    finally:
        other.terminate()
        pipeline.gateway, pipeline.gateway_port = plain, plain_port


def test_cancel_stops_a_background_generation(pipeline: Pipeline) -> None:
    sdk = oai(pipeline)
    before = set(pipeline.fake.aborted)
    queued = sdk.responses.create(
        model="test-model",
        input=QUESTION,
        tools=RESPONSES_TOOLS,
        background=True,
        user="fault:stall",
    )
    wait_for_status(sdk, queued.id, ("in_progress",))
    cancelled = sdk.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    deadline = time.monotonic() + 20
    while not set(pipeline.fake.aborted) - before:
        assert time.monotonic() < deadline, f"no abort reached vLLM\n{pipeline.logs()}"
        time.sleep(0.1)
    time.sleep(1)  # the generation's own last writes do not undo the cancel
    assert sdk.responses.retrieve(queued.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        sdk.responses.cancel(queued.id)


def test_a_responses_client_leaving_mid_stream_aborts_the_generation_upstream(pipeline: Pipeline) -> None:
    # (Messages has no field the fake vLLM's faults could be chosen by: vLLM passes no user on.)
    before = set(pipeline.fake.aborted)
    request = {
        "model": "test-model",
        "input": QUESTION,
        "tools": RESPONSES_TOOLS,
        "stream": True,
        "user": "fault:stall",
    }

    async def read_a_little_and_leave() -> None:
        url = f"{pipeline.gateway_url}/v1/responses"
        async with aiohttp.ClientSession() as session, session.post(url, json=request) as response:
            assert response.status == 200
            await response.content.readline()  # the first event arrived; then the client goes away

    asyncio.run(read_a_little_and_leave())
    deadline = time.monotonic() + 20
    while not set(pipeline.fake.aborted) - before:
        assert time.monotonic() < deadline, f"no abort reached vLLM\n{pipeline.logs()}"
        time.sleep(0.1)


# --- which API a request came in on ------------------------------------------------------------------


def test_consume_and_audit_name_the_api_each_request_came_in_on(pipeline: Pipeline, tmp_path: Path) -> None:
    with claude(pipeline).messages.stream(
        model="test-model",
        max_tokens=256,
        messages=[{"role": "user", "content": QUESTION}],
        tools=ANTHROPIC_TOOLS,
    ) as stream:
        message = stream.get_final_message()
    # The gateway's id for it, which the message id carries (vLLM's render and generate prefix it).
    message_id = message.id[message.id.index("msg_") :]
    assert message.id.endswith(message_id) and len(message_id) == len("msg_") + 32
    response = oai(pipeline).responses.create(model="test-model", input=QUESTION, tools=RESPONSES_TOOLS)
    # A Batch line's request as written to the requests topic (batch_<id>-<line>): ingest and the worker
    # carry its origin through.
    line_id = f"batch_{uuid.uuid4().hex[:8]}-3"
    batch_line = {
        "request_id": line_id,
        "endpoint": "chat",
        "request": stream_recording().request,
        "origin": {"api": "batch", "id": line_id.removesuffix("-3"), "line": 3},
    }

    async def send_and_wait() -> None:
        reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        try:
            await pipeline.send([batch_line])
            outputs = (await pipeline.outputs(reader, [line_id]))[line_id]
            assert outputs[0]["origin"] == batch_line["origin"] and "origin" not in outputs[1]
        finally:
            await reader.stop()

    asyncio.run(send_and_wait())

    consumed = cli(
        pipeline.bootstrap, "consume", "--topic", pipeline.topics.output, "--from-beginning", "--assemble"
    )
    assert consumed.returncode == 0, consumed.stderr
    assembled = consumed.stderr.decode()
    assert f"== messages {message_id} (request {message_id}) (chat, " in assembled
    assert f"== responses {response.id} (request {response.id}) (chat, " in assembled
    assert f"== batch {line_id.removesuffix('-3')} line 3 (request {line_id}) (chat, " in assembled

    # Audited without the reasoning parser, all three differ, and the report names their APIs.
    report = tmp_path / "report.jsonl"
    audited = cli(
        pipeline.bootstrap,
        "audit",
        "--input-topic",
        pipeline.topics.input,
        "--output-topic",
        pipeline.topics.output,
        "--tokenizer",
        str(REPO_ROOT / "samples" / "models" / "qwen3"),
        "--served-model-name",
        "test-model",
        "--tool-parser",
        "hermes",
        "--enable-auto-tool-choice",
        "--report",
        str(report),
    )
    assert audited.returncode == 1, audited.stderr
    lines = {line["request_id"]: line for line in map(json.loads, report.read_text().splitlines())}
    assert lines[message_id]["origin"] == {"api": "messages", "id": message_id}
    assert lines[response.id]["origin"] == {"api": "responses", "id": response.id}
    assert lines[line_id]["origin"] == batch_line["origin"]
    # The module's pipeline is shared, so other tests' requests differ too and the summary lists
    # only the first few: the report is where each of these three is found.
    assert {lines[rid]["status"] for rid in (message_id, response.id, line_id)} == {"differing"}
