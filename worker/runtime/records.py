"""From a ``ProcessResult`` to the Kafka record it sends (output or dead letter).

The bytes are the core's (``ProcessResult.payload``, serialized within the record's boundary and
the output limit); nothing is serialized here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.core.envelope_processor import ProcessResult
from worker.runtime.config import TopicNames


def source_of(record: Any) -> dict[str, Any]:
    """Where an input record (``aiokafka.ConsumerRecord``) sat; becomes ``OutputEnvelope.source``."""
    return {"topic": record.topic, "partition": record.partition, "offset": record.offset}


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    topic: str
    key: bytes | None
    value: bytes | None  # None: a tombstone
    partition: int | None = None  # None: the producer hashes the key
    headers: tuple[tuple[str, bytes], ...] = ()  # trace context (``tracing``)


def records_for(
    result: ProcessResult, topics: TopicNames, trace: tuple[tuple[str, bytes], ...] = ()
) -> list[OutgoingRecord]:
    """The output (or dead letter) for one result; a duplicate sends nothing.

    Output records are keyed by request_id, so one request's outputs share an output
    partition and, being sent in order by one producer, keep their order.
    """
    if result.payload is None:
        return []
    if result.dead_letter is not None:
        return [OutgoingRecord(topics.dlq, result.dead_letter.kafka_key, result.payload, headers=trace)]
    key = result.request_id.encode("utf-8") if result.request_id is not None else None
    return [OutgoingRecord(topics.output, key, result.payload, headers=trace)]
