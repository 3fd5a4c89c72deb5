"""Broker-free stand-ins around one ``OwnedPartition``: an input record, a sink that records what it is
given, a fresh task that writes to it, and consumers a ``Worker`` can poll. Shared by the core's
boundary tests and the runtime's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from aiokafka import TopicPartition

from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.runtime.dead_letters.poison import ResetTracker
from worker.runtime.dead_letters.policy import DeadLetterPolicy
from worker.runtime.kafka_client.base import OutgoingRecord
from worker.runtime.memory import MemoryBudget
from worker.runtime.observability.metrics import Metrics
from worker.runtime.observability.observer import NO_OBSERVER, RecordObserver
from worker.runtime.partition import OwnedPartition
from worker.runtime.security.from_settings import load_kafka
from worker.runtime.state.changelog import StateChangelog, StateKeys
from worker.runtime.topics import TopicNames
from worker.settings import KafkaSettings

TOPICS = TopicNames("in", "out", "state", "dlq")
TEST_KEYS = StateKeys("test-group")  # the group of every partition these fakes make


def changelog_for(tp: TopicPartition, topics: TopicNames = TOPICS) -> StateChangelog:
    """A fresh changelog of ``tp``'s state partition, keyed for ``TEST_KEYS``' group."""
    return StateChangelog(topics.state, tp.partition, TEST_KEYS)


def run_settings(*argv: str) -> KafkaSettings:
    """``run``'s Kafka settings from these flags (a tokenizer and a bootstrap address are given)."""
    from worker.cli import build_parser  # the CLI imports every command: only when settings are built

    args = build_parser().parse_args(["run", "--tokenizer", "x", "--bootstrap-servers", "k:9092", *argv])
    return load_kafka(KafkaSettings, args)


class RecordingSink:
    def __init__(self) -> None:
        self.sent: list[OutgoingRecord] = []
        self.commits: list[tuple[list[OutgoingRecord], dict[TopicPartition, int]]] = []

    async def start(self) -> None:
        pass

    async def send(self, record: OutgoingRecord) -> None:
        self.sent.append(record)

    async def commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None:
        self.commits.append((list(state_records), dict(offsets)))

    async def abort(self) -> None:
        pass

    async def close(self) -> None:
        pass


class FakeRecord:
    """A consumed record (``ConsumedRecord``'s shape) of topic "in": ``envelope`` serialized and
    keyed by its request id, or the raw ``value`` and ``key``."""

    def __init__(
        self,
        offset: int,
        envelope: dict[str, Any] | None = None,
        *,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = 2,
    ) -> None:
        self.topic, self.partition, self.offset = "in", partition, offset
        if envelope is not None:
            key, value = envelope["request_id"].encode(), orjson.dumps(envelope)
        if value is None:
            raise TypeError("a FakeRecord needs an envelope or a value")
        self.key: bytes | None = key
        self.value: bytes = value
        self.headers: list[tuple[str, bytes]] = []
        self.timestamp = 0


def owned_partition(
    derenderer: Derenderer,
    sink: RecordingSink,
    *,
    changelog: StateChangelog | None = None,
    dead_letters: DeadLetterPolicy | None = None,
    budget: MemoryBudget | None = None,
    resets: ResetTracker | None = None,
    metrics: Metrics | None = None,
    observer: RecordObserver = NO_OBSERVER,
) -> OwnedPartition:
    """A fresh partition-2 task with nothing persisted yet, writing to ``sink``; the keyword
    options go to ``OwnedPartition`` as they are."""
    return OwnedPartition(
        TopicPartition("in", 2),
        EnvelopeProcessor(derenderer, admission=budget),  # the budget's caps refuse new requests
        sink,
        TOPICS,
        metrics or Metrics(),
        position=0,
        changelog=changelog or changelog_for(TopicPartition("in", 2)),
        dead_letters=dead_letters,
        budget=budget,
        resets=resets,
        observer=observer,
    )


class StubConsumer:
    """The consumer calls a reset and a revocation make (no broker involved)."""

    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.paused_tps: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    def paused(self) -> set[TopicPartition]:
        return self.paused_tps

    def pause(self, tp: TopicPartition) -> None:
        self.paused_tps.add(tp)


class PollingConsumer(StubConsumer):
    """Hands out ``batches`` one per poll; seeks and lag reads are no-ops (no broker)."""

    def __init__(self, tp: TopicPartition, *batches: list[FakeRecord]) -> None:
        super().__init__({tp})
        self.tp = tp
        self.batches = list(batches)

    async def poll(self, timeout_ms: int, max_records: int) -> dict[Any, Any]:
        return {self.tp: self.batches.pop(0)} if self.batches else {}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        pass

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        return None
