"""Placement on the real broker: state namespaces per group, partition count changes, growing.

* Two consumer groups on one state topic keep separate state (``StateKeys``).
* An input topic grown without its state topic: the new partitions are not served, the worker
  says why on ``/readyz`` and stays up; growing the state topic heals it.
* The documented procedure for growing partitions (docs/operations.md) under load: no 409/408
  storm, every stream exactly once and equal to ``replay``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from aiokafka.partitioner import DefaultPartitioner

from tests.async_helpers import run_bounded
from tests.golden_cases import derenderer_for
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import (
    QWEN3_CONFIG,
    Record,
    TopicReader,
    WorkerGroup,
    WorkerTopics,
    assert_identical,
    free_port,
    generate_sequences,
    http_get,
    interleave,
    make_worker_topics,
    metric,
    produce,
    replay,
    wait_for_http,
)
from worker.runtime.topics import LARGE_RECORDS

pytestmark = pytest.mark.kafka


def run(coro: Coroutine[Any, Any, Any], timeout: float = 240.0) -> Any:
    return run_bounded(coro, timeout)


async def grow(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_partitions({topic: NewPartitions(total_count=partitions)})
    finally:
        await admin.close()


def _split(sequences: list[Any], first: int) -> tuple[list[Record], list[Record]]:
    """Each sequence's first ``first`` records, then the rest (both interleaved across sequences)."""

    def records(part: slice) -> list[Record]:
        out = []
        for step in range(10):
            for s in sequences:
                envelopes = s.envelopes[part]
                if step < len(envelopes):
                    out.append((s.request_id.encode(), orjson.dumps(envelopes[step])))
        return out

    return records(slice(0, first)), records(slice(first, None))


def test_two_groups_keep_separate_state_on_one_state_topic(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """Same request ids, different streams, one state topic: each group restores its own state.

    Group A stops (SIGTERM) with every request open; group B then runs the same request ids to
    the end, so B's snapshots and tombstones land on the same keys' partitions after A's. A
    restarted A must restore its own snapshots (before namespacing it read B's tombstones, and its
    next records failed with 409).
    """
    seqs_a = generate_sequences(30, seed=61, prefix="shared")
    seqs_b = generate_sequences(30, seed=62, prefix="shared")
    first_a, rest_a = _split(seqs_a, 2)
    records_b = interleave(seqs_b, window=10)
    reference_a = replay(derenderer_for(QWEN3_CONFIG), first_a + rest_a)
    reference_b = replay(derenderer_for(QWEN3_CONFIG), records_b)
    state = kafka_topic_factory("derender-state", 2, config={"cleanup.policy": "compact", **LARGE_RECORDS})
    dlq = kafka_topic_factory("derender-dlq", 2, config=LARGE_RECORDS)
    topics = {}
    for name in ("a", "b"):
        inp = kafka_topic_factory(f"derender-in-{name}", 2)
        out = kafka_topic_factory(f"derender-out-{name}", 2, config=LARGE_RECORDS)
        topics[name] = WorkerTopics(inp, out, state, dlq, 2)
    group_a = WorkerGroup(kafka_bootstrap, topics["a"], QWEN3_CONFIG)
    group_b = WorkerGroup(kafka_bootstrap, topics["b"], QWEN3_CONFIG)

    async def body() -> None:
        out_a = await TopicReader(kafka_bootstrap, topics["a"].output).start()
        out_b = await TopicReader(kafka_bootstrap, topics["b"].output).start()
        try:
            worker = group_a.start()
            await produce(kafka_bootstrap, topics["a"].input, first_a)
            await out_a.wait_for(len(first_a), 60, "group A's first outputs", group_a.logs)
            assert worker.terminate() == 0, group_a.logs()
            worker = group_b.start()
            await produce(kafka_bootstrap, topics["b"].input, records_b)
            await out_b.wait_for(reference_b.output_count, 60, "group B's outputs", group_b.logs)
            assert worker.terminate() == 0, group_b.logs()
            worker = group_a.start()
            await produce(kafka_bootstrap, topics["a"].input, rest_a)
            await out_a.wait_for(reference_a.output_count, 60, "group A's outputs", group_a.logs)
            await out_a.settle(1.0)
            assert worker.terminate() == 0, group_a.logs()
        finally:
            group_a.kill_all()
            group_b.kill_all()
            await out_a.stop()
            await out_b.stop()
        assert "with 30 restored requests" in group_a.workers[1].log_path.read_text(), group_a.logs()
        assert_identical(out_a.records, reference_a, group_a.logs())
        assert_identical(out_b.records, reference_b, group_b.logs())

    run(body())


def test_input_grown_without_its_state_partitions(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """The new input partition is not served and the worker is not ready, saying why; it stays up,
    and serves the partition once the state topic is grown too."""
    topics = make_worker_topics(kafka_topic_factory, partitions=2)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG)
    (seq,) = generate_sequences(1, seed=71, prefix="late")
    records = [(seq.request_id.encode(), orjson.dumps(e)) for e in seq.envelopes]
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    port = free_port()
    url = f"http://127.0.0.1:{port}/readyz"

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        worker = group.start(["--metrics-port", str(port)])
        try:
            await wait_for_http(url, 200, 60, group, "after start")
            await grow(kafka_bootstrap, topics.input, 3)
            # The rebalance may first show its partitions restoring; then the reason for partition 2.
            not_ready = await wait_for_http(
                url, 503, 60, group, "after growing the input topic alone", containing=b"not served"
            )
            reasons = " ".join(orjson.loads(not_ready)["reasons"])
            assert "input partitions [2] not served" in reasons, reasons
            assert "needs at least as many" in reasons, reasons
            await produce(kafka_bootstrap, topics.input, records, partition=2)
            await asyncio.sleep(3.0)
            assert reader.records == []  # nowhere to keep its state: not processed
            assert http_get(url)[0] == 503
            await grow(kafka_bootstrap, topics.state, 3)
            await wait_for_http(url, 200, 60, group, "after growing the state topic too")
            await reader.wait_for(reference.output_count, 60, "outputs of partition 2", group.logs)
            await reader.settle(1.0)
            group.check_no_unexpected_exit()
        finally:
            assert worker.terminate() == 0, group.logs()
            await reader.stop()
        assert_identical(reader.records, reference, group.logs())
        assert {orjson.loads(r.value)["source"]["partition"] for r in reader.records} == {2}
        log = worker.log_path.read_text()
        assert log.count("not served") == 1, log  # said once, not a retry loop

    run(body())


def test_growing_partitions_under_load(kafka_bootstrap: str, kafka_topic_factory: TopicFactory) -> None:
    """docs/operations.md's procedure ("Growing partitions"): drain (no new requests; in-flight
    ones finish; requests open reaches 0), grow the state topic, then the input topic, resume. New
    load starts at once, while the workers are still noticing the new partitions."""
    before = interleave(generate_sequences(200, seed=81, prefix="before"), window=60)
    after = interleave(generate_sequences(200, seed=82, prefix="after"), window=60)
    reference = replay(derenderer_for(QWEN3_CONFIG), before + after)
    topics = make_worker_topics(kafka_topic_factory, partitions=2)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG)
    ports = [free_port(), free_port()]

    async def open_requests() -> float:
        total = 0.0
        for port in ports:
            status, text = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            value = metric(text.decode(), "derender_requests_open")
            total += value if value is not None else float("inf")  # not reported yet
        return total

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        for port in ports:
            group.start(["--metrics-port", str(port)])
        try:
            await produce(kafka_bootstrap, topics.input, before, pace_per_s=len(before) / 6)
            # Drain: every in-flight request finished (its last record was produced above).
            await reader.wait_for(len(before), 90, "outputs before growing", group.logs)
            for _ in range(100):  # the gauge is refreshed every few seconds
                if await open_requests() == 0:
                    break
                await asyncio.sleep(0.2)
            assert await open_requests() == 0
            await grow(kafka_bootstrap, topics.state, 4)
            await grow(kafka_bootstrap, topics.input, 4)
            await produce(kafka_bootstrap, topics.input, after, pace_per_s=len(after) / 6)
            await reader.wait_for(reference.output_count, 120, "outputs after growing", group.logs)
            await reader.settle(1.5)
        finally:
            statuses = group.stop_all()
            await reader.stop()
        assert statuses == [0, 0], group.logs()
        assert_identical(reader.records, reference, group.logs())
        errors = [o for o in map(orjson.loads, (r.value for r in reader.records)) if "error" in o]
        assert errors == [], errors[:3]
        sources = {orjson.loads(r.value)["source"]["partition"] for r in reader.records}
        assert sources == {0, 1, 2, 3}

    run(body())


@pytest.mark.parametrize("client", ["aiokafka", "confluent"])
def test_outputs_are_placed_by_the_java_clients_hash(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, client: str
) -> None:
    """Both backends put a request's outputs where Java clients and aiokafka put its key (murmur2),
    so a group whose workers run different backends (a rolling change of ``--kafka-client``) keeps a
    request on one output partition, in order; and with as many output as input partitions, an
    input partition's outputs share their partition with no other worker's (librdkafka's own
    default hashed with CRC32: another partition for most keys)."""
    records = interleave(generate_sequences(40, seed=71, prefix=f"place-{client}"), window=20)
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=4)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG, client=client)
    partitioner = DefaultPartitioner()

    async def body() -> None:
        placed = await produce(kafka_bootstrap, topics.input, records)
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        worker = group.start()
        try:
            await reader.wait_for(reference.output_count, 90, "outputs", group.logs)
        finally:
            status = worker.terminate()
            await reader.stop()
        assert status == 0, group.logs()
        inputs = {key: partition for (key, _), (partition, _) in zip(records, placed, strict=True)}
        misplaced = [
            (r.key, r.partition, inputs[r.key]) for r in reader.records if r.partition != inputs[r.key]
        ]
        assert not misplaced, f"{len(misplaced)} outputs off their input's partition: {misplaced[:5]}"
        assert all(partitioner(r.key, [0, 1, 2, 3], [0, 1, 2, 3]) == r.partition for r in reader.records)
        assert_identical(reader.records, reference, group.logs())

    run(body())
