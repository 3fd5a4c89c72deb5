"""ingest's poll loop on the client layer's ``GroupConsumer`` contract, without a broker: records
fetched before a seek are skipped by offset, and a full backlog pauses every partition but goes on
polling (librdkafka runs rebalance callbacks, and keeps the member in its group, only in a poll)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from worker.pipeline.ingest import PAUSED_POLL_MS, POLL_MS, Ingest, _Partition, _Restored
from worker.runtime.kafka_client.base import TopicPartition
from worker.settings import IngestOptions

TP = TopicPartition("req", 0)


@dataclass
class Record:
    offset: int
    key: bytes | None
    value: bytes | None
    topic: str = TP.topic
    partition: int = TP.partition
    timestamp: int = 0
    headers: Sequence[tuple[str, bytes]] = ()


class ScriptedConsumer:
    """Hands out one scripted batch per poll, then stops the ingest; records every other call."""

    def __init__(self, ingest: Ingest, batches: list[list[Record]]) -> None:
        self.ingest = ingest
        self.batches = batches
        self.calls: list[tuple[str, object]] = []

    async def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Record]]:
        self.calls.append(("poll", timeout_ms))
        if not self.batches:
            self.ingest.request_stop()
            return {}
        return {TP: self.batches.pop(0)}

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def pause(self, tp: TopicPartition) -> None:
        self.calls.append(("pause", tp.partition))

    def resume(self, tp: TopicPartition) -> None:
        self.calls.append(("resume", tp.partition))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.calls.append(("seek", offset))


def _not_a_request(offset: int) -> Record:
    # Keyed but not an envelope: ingest answers it with one error record (no vLLM call).
    return Record(offset, f"bad-{offset}".encode(), b"not json")


def _run(batches: list[list[Record]], *, held: int = 0) -> tuple[_Partition, ScriptedConsumer]:
    async def go() -> tuple[_Partition, ScriptedConsumer]:
        settings = IngestOptions(
            input_topic="in", output_topic="out", requests_topic="req", max_inflight=1, max_backlog=0
        )
        ingest = Ingest(settings, connection=None)  # type: ignore[arg-type]
        consumer = ScriptedConsumer(ingest, batches)
        ingest._consumer = consumer  # type: ignore[assignment]  # the calls the loop makes
        partition = _Partition(ingest, TP, None, _Restored())  # type: ignore[arg-type]  # never commits
        partition.next_offset = 5  # opened at its committed offset 5
        ingest.partitions[TP] = partition
        ingest._held = held
        await ingest._poll_loop()
        return partition, consumer

    return asyncio.run(go())


def _answered(partition: _Partition) -> list[str]:
    return [orjson.loads(r.value)["request_id"] for r in partition.pending]


def test_records_below_the_partition_s_offset_are_skipped() -> None:
    partition, consumer = _run([[_not_a_request(n) for n in (3, 4, 5, 6)]])
    assert _answered(partition) == ["bad-5", "bad-6"]
    assert partition.next_offset == 7
    assert ("seek", 3) not in consumer.calls


def test_a_full_backlog_pauses_keeps_polling_and_reads_nothing() -> None:
    partition, consumer = _run([[_not_a_request(7)], []], held=1)  # --max-inflight 1, taken
    assert _answered(partition) == []  # fetched before the pause took effect: read again later
    assert consumer.calls[0] == ("pause", 0)
    assert ("seek", 7) in consumer.calls
    assert [call for call in consumer.calls if call[0] == "poll"] == [("poll", PAUSED_POLL_MS)] * 3
    assert PAUSED_POLL_MS < POLL_MS
