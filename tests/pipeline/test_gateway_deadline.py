"""The gateway's request timeout travels as the envelope's ``deadline_ms`` (real broker).

ingest here has one generate slot and room for one waiting request, so a second request fills the
backlog and pauses the requests topic: the gateway's cancel of a client that gave up cannot be read
until a slot frees. The deadline is what tells ingest then that nobody waits for the answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai import OpenAI

from tests.fake_vllm import Fault
from tests.kafka_broker import TopicFactory, run_sync
from tests.kafka_helpers import TopicReader
from tests.pipeline_helpers import ONE_SHOT_CASE, STREAM_CASE, Pipeline, new_id, recording, request_of

pytestmark = pytest.mark.kafka
REQUEST_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str) -> Iterator[Pipeline]:
    factory = TopicFactory(kafka_bootstrap)
    pipeline = Pipeline(kafka_bootstrap, factory, max_inflight=1)
    pipeline.start(workers=1, ingest_extra=("--max-backlog", "1"))
    pipeline.fake.faults["hold"] = Fault(pace_s=0.5)  # 22 chunks: ~11 s in the only slot
    pipeline.start_gateway("--request-timeout-s", str(REQUEST_TIMEOUT_S))
    with pipeline.serving() as ready:
        yield ready


async def take_the_only_slot(pipeline: Pipeline) -> str:
    """Send a slow stream and wait until it holds ingest's one generate slot; its request id."""
    holder = new_id("hold")
    hold = {
        "request_id": holder,
        "endpoint": "chat",
        "request": request_of(recording(STREAM_CASE), user="fault:hold"),
    }
    await pipeline.send([hold])
    deadline = time.monotonic() + 60
    while pipeline.fake.streams_open < 1:
        assert time.monotonic() < deadline, pipeline.logs()
        await asyncio.sleep(0.05)
    return holder


def test_a_one_shot_whose_client_timed_out_in_the_backlog_is_never_generated(pipeline: Pipeline) -> None:
    marker = int(time.time() * 1000)  # a seed the fake ignores: it names the gateway's request
    sdk = OpenAI(base_url=f"{pipeline.gateway_url}/v1", api_key="x", max_retries=0, timeout=30)

    async def go() -> tuple[float, float, dict[str, Any], list[dict[str, Any]]]:
        outputs = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        requests = await TopicReader(pipeline.bootstrap, pipeline.requests_topic).start()
        try:
            holder = await take_the_only_slot(pipeline)
            sent_ms = time.time() * 1000
            started = time.monotonic()
            body = request_of(recording(ONE_SHOT_CASE), seed=marker)
            with pytest.raises(openai.APIStatusError) as raised:
                await asyncio.to_thread(lambda: sdk.chat.completions.create(**body))
            waited = time.monotonic() - started
            assert raised.value.status_code == 504, raised.value
            assert pipeline.fake.streams_open == 1, "the holder left its slot too early for the test"
            envelope = next(
                v
                for r in requests.records
                if (v := orjson.loads(r.value)).get("request", {}).get("seed") == marker
            )
            rid = envelope["request_id"]
            await pipeline.outputs(outputs, [holder], timeout=60)  # the slot frees
            ended = (await pipeline.outputs(outputs, [rid], timeout=30))[rid]
            return sent_ms, waited, envelope, ended
        finally:
            await outputs.stop()
            await requests.stop()

    sent_ms, waited, envelope, ended = run_sync(go())
    assert REQUEST_TIMEOUT_S <= waited < REQUEST_TIMEOUT_S + 5
    assert f"chatcmpl-{envelope['request_id']}" not in pipeline.fake.generations_of  # never generated
    assert [(o["seq"], o["error"]["code"]) for o in ended] == [(0, 504)], ended
    assert 0 <= envelope["deadline_ms"] - sent_ms - REQUEST_TIMEOUT_S * 1000 < 2000, envelope


def test_a_stream_whose_client_timed_out_in_the_backlog_is_never_started(pipeline: Pipeline) -> None:
    """A stream carries ``start_by_ms``, not ``deadline_ms``: ingest does not start it once its client
    gave up waiting for the first record, and a stream that did start may outlive the request timeout."""
    marker = int(time.time() * 1000) + 1  # a seed the fake ignores: it names the gateway's request

    async def go() -> tuple[float, float, int, bytes, dict[str, Any], list[dict[str, Any]]]:
        outputs = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        requests = await TopicReader(pipeline.bootstrap, pipeline.requests_topic).start()
        try:
            holder = await take_the_only_slot(pipeline)
            sent_ms = time.time() * 1000
            started = time.monotonic()
            body = request_of(recording(STREAM_CASE), seed=marker, stream=True)
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"{pipeline.gateway_url}/v1/chat/completions",
                    json=body,
                    headers={"Authorization": "Bearer x"},
                    timeout=aiohttp.ClientTimeout(total=30),
                ) as response,
            ):
                status, answer = response.status, await response.read()
            waited = time.monotonic() - started
            assert pipeline.fake.streams_open == 1, "the holder left its slot too early for the test"
            envelope = next(
                v
                for r in requests.records
                if (v := orjson.loads(r.value)).get("request", {}).get("seed") == marker
            )
            rid = envelope["request_id"]
            await pipeline.outputs(outputs, [holder], timeout=60)  # the slot frees
            ended = (await pipeline.outputs(outputs, [rid], timeout=30))[rid]
            return sent_ms, waited, status, answer, envelope, ended
        finally:
            await outputs.stop()
            await requests.stop()

    sent_ms, waited, status, answer, envelope, ended = run_sync(go())
    assert REQUEST_TIMEOUT_S <= waited < REQUEST_TIMEOUT_S + 5
    assert status == 504 or b'"code":504' in answer.replace(b" ", b""), (status, answer)
    assert "deadline_ms" not in envelope, envelope
    assert 0 <= envelope["start_by_ms"] - sent_ms - REQUEST_TIMEOUT_S * 1000 < 2000, envelope
    assert not [key for key in pipeline.fake.generations_of if envelope["request_id"] in key]  # never started
    assert [(o["seq"], o["error"]["code"]) for o in ended] == [(0, 504)], ended
