"""The gateway's request timeout travels as the envelope's ``deadline_ms`` (real broker).

ingest here has one generate slot and room for one waiting request, so a second request fills the
backlog and pauses the requests topic: the gateway's cancel of a client that gave up cannot be read
until a slot frees. The deadline is what tells ingest then that nobody waits for the answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

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
T = TypeVar("T")


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


@dataclass
class Backlogged(Generic[T]):
    """A request sent while ingest's one slot was held: what its client saw, and how ingest ended it."""

    sent_ms: float
    waited: float  # the client's wait for its answer
    answer: T
    envelope: dict[str, Any]  # as the gateway wrote it to the requests topic
    ended: list[dict[str, Any]]  # its output records, once the slot was free again


def behind_a_held_slot(pipeline: Pipeline, marker: int, ask: Callable[[], Awaitable[T]]) -> Backlogged[T]:
    """``ask`` (a client request whose body has seed ``marker``) while a slow stream holds the slot."""

    async def go() -> Backlogged[T]:
        outputs = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        requests = await TopicReader(pipeline.bootstrap, pipeline.requests_topic).start()
        try:
            holder = await take_the_only_slot(pipeline)
            sent_ms = time.time() * 1000
            started = time.monotonic()
            answer = await ask()
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
            return Backlogged(sent_ms, waited, answer, envelope, ended)
        finally:
            await outputs.stop()
            await requests.stop()

    return run_sync(go())


def test_a_one_shot_whose_client_timed_out_in_the_backlog_is_never_generated(pipeline: Pipeline) -> None:
    marker = int(time.time() * 1000)  # a seed the fake ignores: it names the gateway's request
    sdk = OpenAI(base_url=f"{pipeline.gateway_url}/v1", api_key="x", max_retries=0, timeout=30)
    body = request_of(recording(ONE_SHOT_CASE), seed=marker)

    async def ask() -> int:
        with pytest.raises(openai.APIStatusError) as raised:
            await asyncio.to_thread(lambda: sdk.chat.completions.create(**body))
        return raised.value.status_code

    done = behind_a_held_slot(pipeline, marker, ask)
    assert REQUEST_TIMEOUT_S <= done.waited < REQUEST_TIMEOUT_S + 5
    assert done.answer == 504
    assert f"chatcmpl-{done.envelope['request_id']}" not in pipeline.fake.generations_of  # never generated
    assert [(o["seq"], o["error"]["code"]) for o in done.ended] == [(0, 504)], done.ended
    assert 0 <= done.envelope["deadline_ms"] - done.sent_ms - REQUEST_TIMEOUT_S * 1000 < 2000, done.envelope


def test_a_stream_whose_client_timed_out_in_the_backlog_is_never_started(pipeline: Pipeline) -> None:
    """A stream carries ``start_by_ms``, not ``deadline_ms``: ingest does not start it once its client
    gave up waiting for the first record, and a stream that did start may outlive the request timeout."""
    marker = int(time.time() * 1000) + 1  # a seed the fake ignores: it names the gateway's request
    body = request_of(recording(STREAM_CASE), seed=marker, stream=True)

    async def ask() -> tuple[int, bytes]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{pipeline.gateway_url}/v1/chat/completions",
                json=body,
                headers={"Authorization": "Bearer x"},
                timeout=aiohttp.ClientTimeout(total=30),
            ) as response,
        ):
            return response.status, await response.read()

    done = behind_a_held_slot(pipeline, marker, ask)
    status, answer = done.answer
    assert REQUEST_TIMEOUT_S <= done.waited < REQUEST_TIMEOUT_S + 5
    assert status == 504 or b'"code":504' in answer.replace(b" ", b""), (status, answer)
    envelope = done.envelope
    assert "deadline_ms" not in envelope, envelope
    assert 0 <= envelope["start_by_ms"] - done.sent_ms - REQUEST_TIMEOUT_S * 1000 < 2000, envelope
    assert not [key for key in pipeline.fake.generations_of if envelope["request_id"] in key]  # never started
    assert [(o["seq"], o["error"]["code"]) for o in done.ended] == [(0, 504)], done.ended
