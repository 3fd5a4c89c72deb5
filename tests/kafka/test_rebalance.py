"""Incremental rebalancing and static membership against a real broker.

A scale-out from one worker to two under steady load: with cooperative-sticky the first worker
gives up only the partitions that move (its log names each revocation), with an eager strategy
it gives up all of them; either way the output is exactly-once and equal to ``replay``. A worker
restarted under the same ``--group-instance-id`` gets its partitions back without the other
worker seeing a rebalance.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from tests.async_helpers import run_bounded
from tests.golden_cases import derenderer_for
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import (
    QWEN3_CONFIG,
    TopicReader,
    WorkerGroup,
    WorkerProcess,
    assert_identical,
    generate_sequences,
    interleave,
    make_worker_topics,
    produce,
    replay,
)

pytestmark = pytest.mark.kafka

PARTITIONS = 4
_PARTITION_LIST = re.compile(r"\b(revoked|assigned|opened partitions) \[([\d, ]*)\]")


def run(coro: Coroutine[Any, Any, Any], timeout: float = 240.0) -> Any:
    return run_bounded(coro, timeout)


def partition_events(worker: WorkerProcess) -> list[tuple[str, set[int]]]:
    """Each ``revoked``/``assigned``/``opened partitions`` line of a worker's log, in order."""
    events = []
    for match in _PARTITION_LIST.finditer(worker.log_path.read_text(errors="replace")):
        numbers = {int(p) for p in match.group(2).split(",") if p.strip()}
        events.append((match.group(1), numbers))
    return events


def revoked(worker: WorkerProcess) -> set[int]:
    return {p for kind, parts in partition_events(worker) if kind == "revoked" for p in parts}


def opened(worker: WorkerProcess) -> set[int]:
    return {p for kind, parts in partition_events(worker) if kind == "opened partitions" for p in parts}


async def wait_until_opened(worker: WorkerProcess, group: WorkerGroup, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not opened(worker):
        group.check_no_unexpected_exit()
        if time.monotonic() > deadline:
            raise AssertionError(f"{worker.name} opened no partition within {timeout:.0f}s\n{group.logs()}")
        await asyncio.sleep(0.2)


# KIP-848 ("consumer") assigns on the broker, always incrementally; Kafka 4 runs it.
MEMBERSHIPS = {
    "cooperative-sticky": ["--partition-assignment-strategy", "cooperative-sticky"],
    "range": ["--partition-assignment-strategy", "range"],
    "kip848": ["--group-protocol", "consumer"],
}


@pytest.mark.parametrize("membership", list(MEMBERSHIPS))
def test_scale_out_revokes_only_the_moved_partitions(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, membership: str
) -> None:
    records = interleave(generate_sequences(400, seed=41, prefix="scale"))
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=PARTITIONS)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG, extra=MEMBERSHIPS[membership])

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        first = group.start()
        try:
            await wait_until_opened(first, group)
            producing = asyncio.create_task(
                produce(kafka_bootstrap, topics.input, records, pace_per_s=len(records) / 10)
            )
            await reader.wait_for(len(records) // 5, 60, "outputs before the scale-out", group.logs)
            second = group.start()
            await wait_until_opened(second, group)
            await producing
            await reader.wait_for(reference.output_count, 120, "outputs", group.logs)
            await reader.settle(1.5)
            moved = opened(second)  # before stopping: then the other takes everything
            given_up = revoked(first)
        finally:
            statuses = group.stop_all()
            await reader.stop()
        assert all(s == 0 for s in statuses), group.logs()
        assert_identical(reader.records, reference, group.logs())
        assert moved and moved < set(range(PARTITIONS)), group.logs()
        if membership != "range":
            assert given_up == moved, group.logs()  # the partitions that stayed were never revoked
        else:
            assert given_up == set(range(PARTITIONS)), group.logs()  # eager: every one

    run(body())


def test_static_member_restart_keeps_its_partitions(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    records = interleave(generate_sequences(300, seed=43, prefix="static"))
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=PARTITIONS)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG, extra=["--session-timeout-ms", "30000"])

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        stays = group.start(["--group-instance-id", "stays"])
        restarted = group.start(["--group-instance-id", "restarts"])
        try:
            await wait_until_opened(stays, group)
            await wait_until_opened(restarted, group)
            await _settled_split(stays, restarted, group)
            before = partition_events(stays)
            producing = asyncio.create_task(
                produce(kafka_bootstrap, topics.input, records, pace_per_s=len(records) / 10)
            )
            await reader.wait_for(len(records) // 5, 60, "outputs before the restart", group.logs)
            owned = _owned(restarted)
            status = await asyncio.to_thread(restarted.terminate)
            assert status == 0, restarted.log_tail()
            again = group.start(["--group-instance-id", "restarts"])
            await wait_until_opened(again, group)
            await producing
            await reader.wait_for(reference.output_count, 120, "outputs", group.logs)
            await reader.settle(1.5)
            # The member that stayed saw no rebalance: no revocation, no new assignment.
            assert partition_events(stays) == before, group.logs()
            assert opened(again) == owned, group.logs()
        finally:
            statuses = group.stop_all()
            await reader.stop()
        assert all(s == 0 for s in statuses), group.logs()
        assert_identical(reader.records, reference, group.logs())

    run(body())


async def _settled_split(a: WorkerProcess, b: WorkerProcess, group: WorkerGroup) -> None:
    """Wait until the two workers' owned partitions cover the topic without overlap."""
    deadline = time.monotonic() + 60
    while True:
        owned_a, owned_b = _owned(a), _owned(b)
        if owned_a | owned_b == set(range(PARTITIONS)) and not owned_a & owned_b:
            await asyncio.sleep(1.0)  # and stays so
            if (_owned(a), _owned(b)) == (owned_a, owned_b):
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"the group did not settle\n{group.logs()}")
        await asyncio.sleep(0.2)


def _owned(worker: WorkerProcess) -> set[int]:
    owned: set[int] = set()
    for kind, parts in partition_events(worker):
        if kind == "opened partitions":
            owned |= parts
        elif kind == "revoked":
            owned -= parts
    return owned
