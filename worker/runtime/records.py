"""From a ``ProcessResult`` to the Kafka records it sends (output or dead letter)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.core.envelope_processor import ProcessResult, serialize
from worker.runtime.config import TopicNames


@dataclass(frozen=True, slots=True)
class Source:
    """Where an input record sat; becomes ``OutputEnvelope.source``."""

    topic: str
    partition: int
    offset: int

    def as_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    topic: str
    key: bytes | None
    value: bytes | None  # None: a tombstone
    partition: int | None = None  # None: the producer hashes the key
    headers: tuple[tuple[str, bytes], ...] = ()  # trace context (``tracing``)


def decode_headers(headers: Any) -> list[tuple[str, str]]:
    """Kafka headers (str, bytes) as the dead-letter record's (str, str) pairs."""
    out = []
    for name, value in headers or ():
        text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
        out.append((str(name), text))
    return out


def records_for(
    result: ProcessResult,
    topics: TopicNames,
    source: Source | None,
    headers: Any = None,
    trace: tuple[tuple[str, bytes], ...] = (),
) -> list[OutgoingRecord]:
    """The output (or dead letter) for one result; a duplicate sends nothing.

    Output records are keyed by request_id, so one request's outputs share an output
    partition and, being sent in order by one producer, keep their order.
    """
    if result.dead_letter is not None:
        letter = result.dead_letter
        value = serialize(letter.to_record(decode_headers(headers), source.as_json() if source else None))
        return [OutgoingRecord(topics.dlq, letter.key, value, headers=trace)]
    if result.output is None:
        return []
    output = result.output
    if source is not None:
        output = {**output, "source": source.as_json()}
    key = result.request_id.encode("utf-8") if result.request_id is not None else None
    return [OutgoingRecord(topics.output, key, serialize(output), headers=trace)]
