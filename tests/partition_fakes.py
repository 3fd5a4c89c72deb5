"""Broker-free stand-ins around one ``OwnedPartition``: an input record, a sink that records what it is
given, and a fresh task that writes to it. Shared by the core's boundary tests and the runtime's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from aiokafka import TopicPartition

from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.runtime.metrics import Metrics
from worker.runtime.partition import OwnedPartition
from worker.runtime.records import OutgoingRecord
from worker.runtime.topics import TopicNames

TOPICS = TopicNames("in", "out", "state", "dlq")


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
    def __init__(self, offset: int, envelope: dict[str, Any]) -> None:
        self.topic, self.partition, self.offset = "in", 2, offset
        self.key = envelope["request_id"].encode()
        self.value = orjson.dumps(envelope)
        self.headers: list[tuple[str, bytes]] = []
        self.timestamp = 0


def owned_partition(derenderer: Derenderer, sink: RecordingSink) -> OwnedPartition:
    """A fresh partition-2 task with nothing persisted yet, writing to ``sink``."""
    return OwnedPartition(
        TopicPartition("in", 2),
        EnvelopeProcessor(derenderer),
        sink,
        TOPICS,
        Metrics(),
        position=0,
    )
