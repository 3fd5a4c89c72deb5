"""Gateway replicas read only their share of the output topic (key steering), on a real broker:
client -> gateway replicas (in this process, to count what each read) -> Kafka -> ingest -> fake
vLLM -> workers. Each replica's requests are answered whole, through a replica joining and leaving
mid-stream and a grown output topic."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from openai import AsyncOpenAI

from tests.fake_vllm import Fault
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import TopicReader, free_port
from tests.pipeline_helpers import (
    ONE_SHOT_CASE,
    STREAM_CASE,
    Pipeline,
    assemble,
    case,
    comparable,
    recording,
    request_of,
    same_answer,
)
from worker.assembly import AssembledResponse
from worker.pipeline.connection import Connection
from worker.pipeline.gateway import Gateway
from worker.runtime.kafka_client.placement import partition_of
from worker.runtime.security.kafka_security import KafkaSecurity
from worker.settings import GatewayOptions, ReplyRoutingMode

pytestmark = pytest.mark.kafka

PARTITIONS = 3


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str) -> Iterator[Pipeline]:
    factory = TopicFactory(kafka_bootstrap)
    pipeline = Pipeline(kafka_bootstrap, factory, partitions=PARTITIONS, max_inflight=32).start(workers=2)
    # 22 chunks, 0.8 s apart: streams open long enough for a rebalance to happen under them.
    pipeline.fake.faults["steady"] = Fault(pace_s=0.8)
    try:
        yield pipeline
    finally:
        pipeline.stop()
        factory.cleanup()


@dataclass
class Replica:
    gateway: Gateway
    url: str
    runner: web.AppRunner

    @property
    def owned(self) -> frozenset[int]:
        return self.gateway.routing.owned

    @property
    def followed(self) -> frozenset[int]:
        return self.gateway.routing.followed

    def client(self) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60)

    async def stop(self) -> None:
        await self.gateway.shut_down()
        await self.runner.cleanup()
        await self.gateway.stop()


async def start_replica(
    pipeline: Pipeline, group: str, mode: ReplyRoutingMode = ReplyRoutingMode.OWNED
) -> Replica:
    settings = GatewayOptions(
        requests_topic=pipeline.requests_topic,
        output_topic=pipeline.topics.output,
        allow_no_api_key=True,
        served_model_names=("test-model",),
        request_timeout_s=30,
        output_partition_refresh_s=1,
        reply_group_id=group,
        reply_routing=mode,
    )
    gateway = Gateway(settings, Connection(pipeline.bootstrap, f"gw-{uuid.uuid4().hex[:6]}", KafkaSecurity()))
    await gateway.start()
    runner = web.AppRunner(gateway.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return Replica(gateway, f"http://127.0.0.1:{port}", runner)


@contextlib.asynccontextmanager
async def replicas(pipeline: Pipeline, count: int, group: str) -> AsyncIterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for _ in range(count):
            started.append(await start_replica(pipeline, group))
        yield started
    finally:
        for replica in started:
            with contextlib.suppress(Exception):
                await replica.stop()


async def shared_out(replicas: Sequence[Replica], partitions: int, timeout: float = 60) -> None:
    """Until the replicas own (and read) disjoint shares covering every partition, none empty."""
    deadline = time.monotonic() + timeout
    while True:
        owned = [r.owned for r in replicas]
        whole = frozenset().union(*owned) == frozenset(range(partitions))
        disjoint = sum(len(o) for o in owned) == partitions
        if whole and disjoint and all(o and o <= r.followed for o, r in zip(owned, replicas, strict=True)):
            return
        assert time.monotonic() < deadline, f"never shared out: {owned}"
        await asyncio.sleep(0.1)


def golden() -> AssembledResponse:
    return assemble(case(STREAM_CASE).expected)


async def stream(replica: Replica, user: str | None = None) -> AssembledResponse:
    """One streaming chat through ``replica``, assembled from what the SDK parsed."""
    body: dict[str, Any] = request_of(recording(STREAM_CASE))
    if user is not None:
        body["user"] = user
    chunks = [c async for c in await replica.client().chat.completions.create(**body)]
    outputs = [
        {"request_id": "r", "seq": i, "endpoint": "chat", "body": {"chunk": c.model_dump()}}
        for i, c in enumerate(chunks)
    ]
    return assemble(outputs)


async def request_ids(pipeline: Pipeline, user: str, count: int, timeout: float = 30) -> list[str]:
    """The ids of the ``count`` requests marked ``user`` on the requests topic."""
    reader = await TopicReader(pipeline.bootstrap, pipeline.requests_topic).start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            found = []
            for record in reader.records:
                value = orjson.loads(record.value)
                if isinstance(value, dict) and value.get("request", {}).get("user") == user:
                    found.append(value["request_id"])
            if len(found) >= count or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.1)
    finally:
        await reader.stop()


async def output_records(pipeline: Pipeline, keys: set[str], count: int, timeout: float = 30) -> int:
    """How many output records the requests ``keys`` have: ``count``, or fewer if they never came."""
    reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            mine = sum(1 for r in reader.records if r.key and r.key.decode() in keys)
            if mine >= count or time.monotonic() > deadline:
                return mine
            await asyncio.sleep(0.1)
    finally:
        await reader.stop()


def test_each_replica_reads_only_its_share(pipeline: Pipeline) -> None:
    """Two replicas in one group each steer their requests' replies onto the partitions they own
    and read nothing else: between them they read each reply once, and none of another's. A
    replica reading everything (``--reply-routing all``) reads both shares, for comparison."""

    async def go() -> None:
        group = f"gw-{uuid.uuid4().hex[:8]}"
        everything = await start_replica(pipeline, f"{group}-all", ReplyRoutingMode.ALL)
        try:
            async with replicas(pipeline, 2, group) as (a, b):
                await shared_out([a, b], PARTITIONS)
                users = {id(a): f"share-a-{uuid.uuid4().hex[:6]}", id(b): f"share-b-{uuid.uuid4().hex[:6]}"}
                per = 6
                answers = await asyncio.gather(*(stream(r, users[id(r)]) for r in (a, b) for _ in range(per)))
                want = golden()
                for answer in answers:
                    same_answer(answer, want)
                for replica in (a, b):
                    ids = await request_ids(pipeline, users[id(replica)], per)
                    assert len(ids) == per
                    # Every id it minted hashes to a partition it owns: its replies came to it.
                    assert {partition_of(i.encode(), PARTITIONS) for i in ids} <= replica.owned
                    assert replica.followed == replica.owned  # nothing read for anyone else
                ids = [
                    *await request_ids(pipeline, users[id(a)], per),
                    *await request_ids(pipeline, users[id(b)], per),
                ]
                expected = 2 * per * len(case(STREAM_CASE).expected)  # one output per generate chunk
                total = await output_records(pipeline, set(ids), expected)
                assert total == expected
                await asyncio.sleep(1)  # the last records reach the all-reader too
                stats = [a.gateway.routing.stats, b.gateway.routing.stats]
                assert [s.foreign for s in stats] == [0, 0]
                assert sum(s.read for s in stats) == total  # each reply read once, by its replica
                assert everything.gateway.routing.stats.read >= total
                assert everything.gateway.routing.stats.delivered == 0
        finally:
            await everything.stop()

    asyncio.run(go())


def test_replicas_joining_and_leaving_mid_stream_answer_every_request(pipeline: Pipeline) -> None:
    """A rebalance moves partitions under open requests: a replica keeps reading a partition its
    requests are on until they end, so each gets exactly its answer; the one that leaves ends its
    own with an error and a cancel (its clients retry elsewhere)."""

    async def go() -> None:
        group = f"gw-{uuid.uuid4().hex[:8]}"
        async with replicas(pipeline, 1, group) as (a,):
            await shared_out([a], PARTITIONS)
            want = golden()
            first = [asyncio.create_task(stream(a, "fault:steady")) for _ in range(6)]
            await asyncio.sleep(2)  # under way
            b = await start_replica(pipeline, group)
            try:
                await shared_out([a, b], PARTITIONS)  # a gave partitions up with streams open on them
                assert not all(t.done() for t in first), "the streams ended before the rebalance"
                second = [asyncio.create_task(stream(r, "fault:steady")) for r in (a, b) for _ in range(3)]
                admitted_by = time.monotonic() + 60  # b's three admitted (a loaded machine takes a while)
                while len(b.gateway.open) < 3:
                    assert time.monotonic() < admitted_by, "b's streams were not admitted within 60 s"
                    await asyncio.sleep(0.05)
                await asyncio.sleep(2)
            finally:
                await b.stop()  # leaves the group: a is given everything back, streams still open
            await shared_out([a], PARTITIONS)
            async with asyncio.timeout(60):
                firsts = await asyncio.gather(*first)
                seconds = await asyncio.gather(*second, return_exceptions=True)
            for answer in firsts:
                same_answer(answer, want)
            for outcome in seconds[:3]:  # a's
                assert isinstance(outcome, AssembledResponse), outcome
                same_answer(outcome, want)
            for outcome in seconds[3:]:  # b's: ended by its shutdown, with an error, not silence
                assert isinstance(outcome, Exception) and "shutting down" in str(outcome), outcome
            assert a.gateway.routing.stats.delivered > 0

    asyncio.run(go())


def test_an_id_the_replica_did_not_choose_is_read_where_it_lands(pipeline: Pipeline) -> None:
    """A request named by its caller (a Batch line) may hash to another replica's partition: the
    replica reads that partition too, from before the request is written, while it runs (and a
    little after), and the answer arrives whole."""

    async def go() -> None:
        group = f"gw-{uuid.uuid4().hex[:8]}"
        async with replicas(pipeline, 2, group) as (a, b):
            await shared_out([a, b], PARTITIONS)
            elsewhere = min(b.owned)
            candidates = (f"line-{uuid.uuid4().hex}" for _ in range(10_000))
            rid = next(r for r in candidates if partition_of(r.encode(), PARTITIONS) == elsewhere)
            golden_case = case(ONE_SHOT_CASE)
            body = request_of(recording(ONE_SHOT_CASE))
            async with asyncio.timeout(60):
                answers = [event async for event in a.gateway.chat(body, request_id=rid)]
            (answer,) = answers
            assert comparable([{"seq": 0, "endpoint": "chat", "body": answer}]) == comparable(
                golden_case.expected
            )
            assert elsewhere not in a.owned and elsewhere in a.followed  # read for it, lingering
            assert a.gateway.routing.stats.delivered >= 1

    asyncio.run(go())


def test_two_replicas_share_a_grown_output_topic(pipeline: Pipeline) -> None:
    """Partitions added to the output topic are shared out between the replicas, requests open
    across the growth are answered whole, and later requests too (runs last: it grows the topic)."""

    async def go() -> None:
        group = f"gw-{uuid.uuid4().hex[:8]}"
        async with replicas(pipeline, 2, group) as (a, b):
            await shared_out([a, b], PARTITIONS)
            want = golden()
            open_ = [asyncio.create_task(stream(r, "fault:steady")) for r in (a, b) for _ in range(3)]
            await asyncio.sleep(2)
            admin = AIOKafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
            await admin.start()
            try:
                await admin.create_partitions(
                    {pipeline.topics.output: NewPartitions(total_count=2 * PARTITIONS)}
                )
            finally:
                await admin.close()
            await shared_out([a, b], 2 * PARTITIONS)
            assert not all(t.done() for t in open_), "the streams ended before the topic grew"
            assert a.gateway.routing.count == b.gateway.routing.count == 2 * PARTITIONS
            later = [asyncio.create_task(stream(r)) for r in (a, b) for _ in range(3)]
            async with asyncio.timeout(60):
                answers = await asyncio.gather(*open_, *later)
            for answer in answers:
                same_answer(answer, want)

    asyncio.run(go())
