"""``gateway`` with the real ``openai`` SDK: client -> gateway -> Kafka -> ingest -> fake vLLM -> workers."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from openai import AsyncOpenAI, OpenAI

from tests.fake_vllm import full_response
from tests.golden_cases import derenderer_for
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import TopicReader, WorkerProcess, free_port, produce, wait_for_http
from tests.pipeline_helpers import (
    COMPLETION_CASE,
    CONFIG,
    N2_CASE,
    ONE_SHOT_CASE,
    STREAM_CASE,
    Pipeline,
    assemble,
    case,
    cli,
    comparable,
    new_id,
    recording,
    reference_outputs,
    request_of,
    same_answer,
    two_prompt_recording,
)
from tests.stream_builders import written
from worker.assembly import AssembledResponse
from worker.core.envelope_processor import EnvelopeProcessor

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str) -> Iterator[Pipeline]:
    factory = TopicFactory(kafka_bootstrap)
    pipeline = Pipeline(kafka_bootstrap, factory, max_inflight=16).start(workers=2, gateway=True)
    with pipeline.serving() as ready:
        yield ready


def client(pipeline: Pipeline, api_key: str = "unused") -> OpenAI:
    # No retries: a retried request would be a second request, and the tests count what happens.
    return OpenAI(base_url=f"{pipeline.gateway_url}/v1", api_key=api_key, max_retries=0, timeout=60)


def sdk_chunks_as_outputs(chunks: list[Any]) -> list[dict[str, Any]]:
    """What the SDK parsed, as output envelopes (for ``assemble``)."""
    return [
        {"request_id": "r", "seq": i, "endpoint": "chat", "body": {"chunk": c.model_dump()}}
        for i, c in enumerate(chunks)
    ]


def contains(mine: Any, theirs: Any) -> bool:
    """``mine`` has every field of ``theirs`` with the same value (the SDK adds fields of its own)."""
    if isinstance(theirs, dict):
        return isinstance(mine, dict) and all(contains(mine.get(k), v) for k, v in theirs.items())
    if isinstance(theirs, list):
        return isinstance(mine, list) and len(mine) == len(theirs) and all(map(contains, mine, theirs))
    return bool(mine == theirs)


def test_streaming_chat_with_reasoning_and_a_tool_call(pipeline: Pipeline) -> None:
    golden = case(STREAM_CASE)
    body = request_of(recording(golden.id))
    stream = client(pipeline).chat.completions.create(**body)
    chunks = list(stream)
    # Chunk for chunk what vLLM's derender gives for these tokens (ids aside), as the SDK parsed it.
    want = [o["body"]["chunk"] for o in comparable(golden.expected)]
    got = [o["body"]["chunk"] for o in comparable(sdk_chunks_as_outputs(chunks))]
    assert len(got) == len(want)
    for mine, theirs in zip(got, want, strict=True):
        assert contains(mine, theirs)
    answer = assemble(sdk_chunks_as_outputs(chunks))
    same_answer(answer, assemble(golden.expected))
    assert (
        answer.choices[0].reasoning and answer.choices[0].tool_calls[0]["function"]["name"] == "get_weather"
    )


def test_one_shot_chat_equals_vllms_one_shot_derender(pipeline: Pipeline) -> None:
    golden = case(ONE_SHOT_CASE)
    body = request_of(recording(golden.id))
    raw = client(pipeline).chat.completions.with_raw_response.create(**body)
    assert raw.http_response.status_code == 200
    got = {"seq": 0, "endpoint": "chat", "body": raw.http_response.json()}
    assert comparable([got]) == comparable(golden.expected)
    completion = raw.parse()  # the SDK takes it as a ChatCompletion
    message = completion.choices[0].message
    assert message.tool_calls and message.tool_calls[0].function.name == "get_weather"
    assert completion.choices[0].finish_reason == "tool_calls"


def test_streaming_completions_one_and_two_prompts_and_n2_chat(pipeline: Pipeline) -> None:
    sdk = client(pipeline)
    golden = case(COMPLETION_CASE)
    chunks = list(sdk.completions.create(**request_of(recording(golden.id))))
    texts = "".join(c.choices[0].text for c in chunks if c.choices)
    assert texts == assemble(golden.expected).choices[0].content
    assert chunks[-1].choices[0].finish_reason == "length"

    two = two_prompt_recording()
    merged: dict[int, str] = {}
    for chunk in sdk.completions.create(**request_of(two)):
        for choice in chunk.choices:
            merged[choice.index] = merged.get(choice.index, "") + choice.text
    want = [assemble(reference_outputs(two, request_of(two), i)).choices[0].content for i in (0, 1)]
    assert merged == {0: want[0], 1: want[1]}  # prompt i's choices are numbered i*n+j, as vLLM does

    n2 = recording(N2_CASE)
    outputs = sdk_chunks_as_outputs(list(sdk.chat.completions.create(**request_of(n2))))
    same_answer(assemble(outputs), assemble(reference_outputs(n2, request_of(n2))))


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        ("render-400", openai.BadRequestError, 400),
        ("generate-500", openai.InternalServerError, 500),
        ("generate-503", openai.InternalServerError, 503),
    ],
)
def test_vllm_http_errors_reach_the_sdk_with_their_status(
    pipeline: Pipeline, fault: str, error: type[openai.APIStatusError], status: int
) -> None:
    body = request_of(recording(STREAM_CASE), user=f"fault:{fault}")
    for streaming in (True, False):
        # A stream too: the error status comes with the response, before any chunk.
        with pytest.raises(error) as raised:
            client(pipeline).chat.completions.create(**{**body, "stream": streaming})
        assert raised.value.status_code == status


def test_a_stream_cut_mid_sse_ends_with_an_error_event(pipeline: Pipeline) -> None:
    body = request_of(recording(STREAM_CASE), user="fault:cut")
    chunks = iter(client(pipeline).chat.completions.create(**body))
    for _ in range(4):  # the chunks before the cut, in order
        next(chunks)
    with pytest.raises(openai.APIError, match="cut off"):  # then the error
        next(chunks)


def test_client_disconnect_aborts_the_generation_upstream(pipeline: Pipeline) -> None:
    body = request_of(recording(STREAM_CASE), user="fault:stall")
    before = set(pipeline.fake.aborted)

    async def read_one_chunk_and_leave() -> None:
        async with aiohttp.ClientSession() as session:
            url = f"{pipeline.gateway_url}/v1/chat/completions"
            async with session.post(url, json=body) as response:
                assert response.status == 200
                await response.content.readline()  # the first chunk arrived; then the client goes away

    asyncio.run(read_one_chunk_and_leave())
    deadline = time.monotonic() + 20
    while not set(pipeline.fake.aborted) - before:
        assert time.monotonic() < deadline, f"no abort reached vLLM\n{pipeline.logs()}"
        time.sleep(0.1)
    assert all(a.startswith("generate-tokens-chatcmpl-") for a in set(pipeline.fake.aborted) - before)


def test_models_health_and_api_key(pipeline: Pipeline) -> None:
    assert [m.id for m in client(pipeline).models.list()] == ["test-model"]
    plain, plain_port = pipeline.gateway, pipeline.gateway_port
    guarded = pipeline.start_gateway("--api-key", "sesame")
    try:
        asyncio.run(wait_for_http(f"{pipeline.gateway_url}/healthz", 200, 60, what="(gateway with key)"))
        with pytest.raises(openai.AuthenticationError):
            client(pipeline, "wrong").models.list()
        answer = client(pipeline, "sesame").chat.completions.create(**request_of(recording(ONE_SHOT_CASE)))
        assert answer.choices[0].finish_reason == "tool_calls"
    finally:
        guarded.terminate()
        pipeline.gateway, pipeline.gateway_port = plain, plain_port


def test_a_worker_sigkilled_under_gateway_load(pipeline: Pipeline) -> None:
    golden = case(STREAM_CASE)
    body = request_of(recording(golden.id), user="fault:slower")
    sdk = AsyncOpenAI(base_url=f"{pipeline.gateway_url}/v1", api_key="x", max_retries=0, timeout=90)
    first_chunks = asyncio.Event()

    async def one() -> AssembledResponse:
        chunks = []
        async for chunk in await sdk.chat.completions.create(**body):
            chunks.append(chunk)
            if len(chunks) == 3:
                first_chunks.set()
        return assemble(sdk_chunks_as_outputs(chunks))

    async def go() -> list[AssembledResponse]:
        tasks = [asyncio.create_task(one()) for _ in range(8)]
        async with asyncio.timeout(60):
            await first_chunks.wait()
        pipeline.workers.alive[0].kill()  # mid-stream: its partitions move to the other worker
        return await asyncio.gather(*tasks)

    answers = asyncio.run(go())
    want = assemble(golden.expected)
    for answer in answers:  # exactly-once: every stream whole, nothing lost or repeated
        same_answer(answer, want)
    pipeline.workers.start()  # back to two for whatever runs next


def test_one_shot_completion_with_two_prompts_equals_vllms_one_shot_derender(pipeline: Pipeline) -> None:
    two = two_prompt_recording(stream=False)
    raw = client(pipeline).completions.with_raw_response.create(**request_of(two))
    assert raw.http_response.status_code == 200
    # The reference: vLLM's one-shot completion derender of the two generate responses ingest got.
    responses = [
        full_response("r", "test-model", ids, chunks)
        for ids, chunks in zip(two.prompt_token_ids, two.chunks, strict=True)
    ]
    body = {
        "stream": False,
        "model": "test-model",
        "generate_responses": responses,
        "prompt_tokens": [len(ids) for ids in two.prompt_token_ids],
        "prompt_token_ids": two.prompt_token_ids,
        "completion_request": request_of(two),
    }
    envelope = {"request_id": "r", "seq": 0, "endpoint": "completion", "body": body}
    result = EnvelopeProcessor(derenderer_for(CONFIG)).process(orjson.dumps(envelope), b"r")
    assert result.output is not None
    got = {"seq": 0, "endpoint": "completion", "body": raw.http_response.json()}
    assert comparable([got]) == comparable([written(result)])
    completion = raw.parse()
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.choices[0].text == completion.choices[1].text != ""


def test_trace_context_rides_from_the_http_request_to_every_record(pipeline: Pipeline) -> None:
    """The client's W3C trace context reaches the requests, input and output records of its request
    (gateway -> ingest -> worker), so one trace covers the whole pipeline; but not its sampled flag
    (a client must not force sampling) nor its baggage (8 KB of it would ride on every record)."""
    from worker.runtime.observability.genai_metrics import REQUEST_START_HEADER

    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    body = request_of(recording(case(STREAM_CASE).id))
    baggage = ",".join(f"k{i}={'v' * 60}" for i in range(128))[:8000]
    headers = {"traceparent": parent, "baggage": baggage}
    chunks = list(client(pipeline).chat.completions.create(**body, extra_headers=headers))
    request_id = chunks[0].id.rsplit("chatcmpl-", 1)[1]

    async def records(topic: str, count: int) -> list[Any]:
        reader = await TopicReader(pipeline.bootstrap, topic).start()
        try:
            deadline = time.monotonic() + 30
            while True:
                mine = [r for r in reader.records if r.key == request_id.encode()]
                if len(mine) >= count or time.monotonic() > deadline:
                    return mine
                await asyncio.sleep(0.1)
        finally:
            await reader.stop()

    # The requests topic also holds ingest's own markers for the request; the gateway's record is the request.
    requests = [r for r in asyncio.run(records(pipeline.requests_topic, 1)) if b'"ingest"' not in r.value]
    assert len(requests) == 1
    inputs = asyncio.run(records(pipeline.topics.input, len(chunks)))
    outputs = asyncio.run(records(pipeline.topics.output, len(chunks)))
    assert len(inputs) == len(outputs) == len(chunks)
    unsampled = parent[:-2] + "00"  # the same trace and parent, not sampled
    for record in [*requests, *inputs, *outputs]:
        assert dict(record.headers).get("traceparent") == unsampled.encode(), record
        assert "baggage" not in dict(record.headers), record
    assert all(REQUEST_START_HEADER in dict(r.headers) for r in inputs)


# --- issue 30: the gateway survives the clients it faces ---------------------------------------------


def extra_gateway(
    pipeline: Pipeline, *extra: str, output_topic: str | None = None
) -> tuple[WorkerProcess, str]:
    """A gateway of its own (the fixture's stays up), healthy; its process and URL."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "worker.cli",
        "gateway",
        "--bootstrap-servers",
        pipeline.bootstrap,
        *(
            "--requests-topic",
            pipeline.requests_topic,
            "--output-topic",
            output_topic or pipeline.topics.output,
        ),
        *("--host", "127.0.0.1", "--port", str(port), "--served-model-name", "test-model"),
        *("--request-timeout-s", "30", "--allow-no-api-key", *extra),
    ]
    name = f"gateway-{port}"
    process = WorkerProcess(name, command, pipeline.workers.log_dir / f"{name}.log").start()
    url = f"http://127.0.0.1:{port}"
    asyncio.run(wait_for_http(f"{url}/healthz", 200, 60, what=f"({name})"))
    return process, url


async def request_ids_by_marker(
    pipeline: Pipeline, markers: list[Any], timeout: float = 30, field: str = "user"
) -> dict[Any, str]:
    """The request id the gateway gave each request whose ``field`` is one of ``markers``."""
    reader = await TopicReader(pipeline.bootstrap, pipeline.requests_topic).start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            found: dict[Any, str] = {}
            for record in reader.records:
                value = orjson.loads(record.value)
                marker = value.get("request", {}).get(field) if isinstance(value, dict) else None
                if marker in markers:
                    found[marker] = value["request_id"]
            if len(found) == len(markers) or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.1)
    finally:
        await reader.stop()


def test_malformed_shapes_are_answered_as_vllm_before_kafka(pipeline: Pipeline) -> None:
    """``"stream_options": "x"`` was a text/plain 500 after the request reached Kafka; a string
    ``include_usage`` hung 600 s waiting for a usage chunk that never came."""
    refused_marker, usage_marker = new_id("refused"), new_id("usage")
    body = request_of(recording(STREAM_CASE))
    url = f"{pipeline.gateway_url}/v1/chat/completions"

    async def go() -> tuple[int, str, dict[str, Any], str]:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json={**body, "user": refused_marker, "stream_options": "x"}) as r:
                refused = (r.status, r.content_type, await r.json())
            usage = {**body, "user": usage_marker, "stream_options": {"include_usage": "false"}}
            async with asyncio.timeout(20), session.post(url, json=usage) as r:
                assert r.status == 200
                text = await r.text()
        return *refused, text

    status, content_type, error, text = asyncio.run(go())
    assert (status, content_type) == (400, "application/json")
    assert error["error"]["code"] == 400 and "stream_options" in error["error"]["message"]
    assert text.endswith("data: [DONE]\n\n") and '"error"' not in text and '"usage":{' not in text
    found = asyncio.run(request_ids_by_marker(pipeline, [refused_marker, usage_marker], timeout=5))
    assert list(found) == [usage_marker]  # the refused request never reached the requests topic


def _rss_bytes(process: WorkerProcess) -> int:
    assert process.proc is not None
    with open(f"/proc/{process.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_15_mib_body_and_20k_prompts_leave_the_gateway_small_and_responsive(pipeline: Pipeline) -> None:
    assert pipeline.gateway is not None
    before = _rss_bytes(pipeline.gateway)
    base = pipeline.gateway_url
    big = orjson.dumps({"model": "test-model", "messages": [{"role": "user", "content": "x" * (15 << 20)}]})
    many = orjson.dumps({"model": "test-model", "prompt": ["p"] * 20_000, "stream": True})

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the gateway must count
        for start in range(0, len(big), 1 << 20):
            yield big[start : start + (1 << 20)]

    async def health_latencies(stop: asyncio.Event) -> list[float]:
        took = []
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                started = time.monotonic()
                async with session.get(f"{base}/healthz") as r:
                    assert r.status == 200
                took.append(time.monotonic() - started)
                await asyncio.sleep(0.05)
        return took

    async def post(session: aiohttp.ClientSession, path: str, data: Any) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        async with session.post(f"{base}{path}", data=data, headers=headers) as r:
            return r.status, await r.json()

    async def go() -> tuple[list[tuple[int, Any]], list[float]]:
        stop = asyncio.Event()
        health = asyncio.create_task(health_latencies(stop))
        async with aiohttp.ClientSession() as session:
            answers = [
                await post(session, "/v1/chat/completions", big),
                await post(session, "/v1/chat/completions", chunked()),
                await post(session, "/v1/completions", many),
            ]
        stop.set()
        return answers, await health

    answers, latencies = asyncio.run(go())
    assert [status for status, _ in answers] == [413, 413, 400]
    assert all(set(body["error"]) == {"message", "type", "param", "code"} for _, body in answers)
    assert max(latencies) < 1.0, latencies
    assert _rss_bytes(pipeline.gateway) - before < 64 << 20


def test_an_error_answer_is_cancelled_upstream(pipeline: Pipeline) -> None:
    """A request that ends with an error writes its cancel (ingest may still hold its siblings)."""
    marker = int(time.time() * 1000)  # a seed: the fake vLLM ignores it, so the fault still applies
    body = request_of(recording(STREAM_CASE), user="fault:generate-500", seed=marker)
    with pytest.raises(openai.InternalServerError):
        client(pipeline).chat.completions.create(**body)
    request_id = asyncio.run(request_ids_by_marker(pipeline, [marker], field="seed"))[marker]

    async def cancels() -> list[Any]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.requests_topic).start()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                mine = [
                    r for r in reader.records if r.key == request_id.encode() and b'"cancel":true' in r.value
                ]
                if mine:
                    return mine
                await asyncio.sleep(0.1)
            return []
        finally:
            await reader.stop()

    assert len(asyncio.run(cancels())) == 1


def test_sigterm_ends_and_cancels_every_open_stream(pipeline: Pipeline) -> None:
    """aiohttp waited 60 s and the pod is killed at 30 s: every rolling update orphaned the open
    streams upstream. Now each gets an error event, and ingest its cancel, before the gateway exits."""
    process, url = extra_gateway(pipeline)
    body = request_of(recording(STREAM_CASE), user="fault:stall")
    before = set(pipeline.fake.aborted)

    async def one(session: aiohttp.ClientSession, started: asyncio.Event) -> str:
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            first = await response.content.readline()
            started.set()
            return (first + await response.content.read()).decode()

    async def go() -> list[str]:
        async with aiohttp.ClientSession() as session:
            events = [asyncio.Event() for _ in range(3)]
            tasks = [asyncio.create_task(one(session, e)) for e in events]
            async with asyncio.timeout(60):
                for event in events:
                    await event.wait()
            assert process.proc is not None
            process.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(25):
                return await asyncio.gather(*tasks)

    started = time.monotonic()
    texts = asyncio.run(go())
    assert process.proc is not None and process.proc.wait(25) == 0, process.log_tail()
    assert time.monotonic() - started < 28  # inside the pod's 30 s grace period
    for text in texts:
        assert "shutting down" in text and text.endswith("data: [DONE]\n\n"), text
    deadline = time.monotonic() + 20
    while len(set(pipeline.fake.aborted) - before) < 3:
        assert time.monotonic() < deadline, (
            f"aborts: {set(pipeline.fake.aborted) - before}\n{pipeline.logs()}"
        )
        time.sleep(0.1)


def test_two_gateways_read_the_partitions_an_output_topic_grows(pipeline: Pipeline) -> None:
    """The partitions were fixed at start: a record in a partition added later was never read."""
    output = pipeline.factory("gateway-output", 1)
    gateways = [
        extra_gateway(pipeline, "--output-partition-refresh-s", "1", output_topic=output) for _ in range(2)
    ]
    markers = [new_id("grown"), new_id("grown")]
    body = request_of(recording(ONE_SHOT_CASE))

    async def ask(url: str, marker: str) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/chat/completions", json={**body, "user": marker}) as r,
        ):
            return r.status, await r.json()

    async def go() -> list[tuple[int, Any]]:
        asks = [asyncio.create_task(ask(url, m)) for (_, url), m in zip(gateways, markers, strict=True)]
        ids = await request_ids_by_marker(pipeline, markers)
        admin = AIOKafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({output: NewPartitions(total_count=3)})
        finally:
            await admin.close()
        await asyncio.sleep(4)  # a few refreshes
        records = [
            (
                ids[m].encode(),
                orjson.dumps(
                    {
                        "request_id": ids[m],
                        "seq": 0,
                        "endpoint": "chat",
                        "source": "test",
                        "error": {"message": f"answer for {m}", "type": "x", "param": None, "code": 418},
                    }
                ),
            )
            for m in markers
        ]
        await produce(pipeline.bootstrap, output, records, partition=2)
        async with asyncio.timeout(20):
            return await asyncio.gather(*asks)

    try:
        answers = asyncio.run(go())
    finally:
        for process, _ in gateways:
            process.terminate()
    for (status, answer), marker in zip(answers, markers, strict=True):
        assert (status, answer["error"]["message"]) == (418, f"answer for {marker}")


def test_the_gateway_fails_closed_without_an_api_key(pipeline: Pipeline) -> None:
    result = cli(
        pipeline.bootstrap,
        *("gateway", "--requests-topic", pipeline.requests_topic, "--output-topic", pipeline.topics.output),
    )
    assert result.returncode == 2
    assert b"--allow-no-api-key" in result.stderr


def test_idle_slow_and_half_sent_connections_end(pipeline: Pipeline) -> None:
    """Idle connections, one byte every few seconds, and a body that never arrives stayed open
    indefinitely."""
    process, url = extra_gateway(pipeline, "--header-timeout-s", "2", "--body-timeout-s", "2")
    port = int(url.rsplit(":", 1)[1])

    async def closed_after(trickle: bool) -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        try:
            async with asyncio.timeout(15):
                while True:
                    try:
                        if trickle:
                            writer.write(b"P")  # a request line that never ends
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(1.0):
                                if not await reader.read(1):
                                    return time.monotonic() - started
                    except ConnectionError:
                        return time.monotonic() - started
        finally:
            writer.close()

    async def half_body() -> tuple[bytes, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        writer.write(head + b"Content-Length: 100\r\n\r\n" + b'{"model": ')
        async with asyncio.timeout(15):
            answer = await reader.read(4096)
        writer.close()
        return answer, time.monotonic() - started

    async def go() -> tuple[float, float, tuple[bytes, float]]:
        return await asyncio.gather(closed_after(False), closed_after(True), half_body())

    try:
        idle, trickled, (answer, body_took) = asyncio.run(go())
    finally:
        process.terminate()
    assert idle < 6 and trickled < 6, (idle, trickled)
    assert answer.startswith(b"HTTP/1.1 408") and b'"code":408' in answer, answer
    assert body_took < 6


def test_a_key_over_its_open_requests_gets_429_with_retry_after(pipeline: Pipeline) -> None:
    process, url = extra_gateway(pipeline, "--max-open-requests-per-key", "1", "--retry-after-s", "3")
    body = request_of(recording(STREAM_CASE), user="fault:stall")
    sdk = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
    try:
        stream = sdk.chat.completions.create(**body)
        next(iter(stream))  # the first request is open, generating
        with pytest.raises(openai.RateLimitError) as raised:
            sdk.chat.completions.create(**request_of(recording(ONE_SHOT_CASE)))
        assert raised.value.response.headers["Retry-After"] == "3"
        stream.close()  # the client leaves: its share comes back
        deadline = time.monotonic() + 20
        while True:
            try:
                answer = sdk.chat.completions.create(**request_of(recording(ONE_SHOT_CASE)))
                break
            except openai.RateLimitError:
                assert time.monotonic() < deadline, "the closed request's share never came back"
                time.sleep(0.2)
        assert answer.choices[0].finish_reason == "tool_calls"
    finally:
        process.terminate()
