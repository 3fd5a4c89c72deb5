"""From a ``ProcessResult`` to the Kafka record it sends (output or dead letter).

An output's bytes are the core's (``ProcessResult.payload``, serialized within the record's
boundary and the output limit); a dead letter is written here, with the record's Kafka headers
and source (``dead_letter_record``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.core.envelope_processor import ProcessResult
from worker.runtime.dead_letters import record as dead_letter_record
from worker.runtime.kafka_client.base import OutgoingRecord
from worker.runtime.topics import TopicNames


def source_of(record: Any) -> dict[str, Any]:
    """Where an input record (``kafka_client.base.ConsumedRecord``) sat; becomes ``OutputEnvelope.source``."""
    return {"topic": record.topic, "partition": record.partition, "offset": record.offset}


def records_for(
    result: ProcessResult,
    topics: TopicNames,
    trace: tuple[tuple[str, bytes], ...] = (),
    *,
    headers: Sequence[tuple[str, bytes | str]] | None = None,
    source: dict[str, Any] | None = None,
    max_bytes: int,
) -> list[OutgoingRecord]:
    """The output (or dead letter) for one result; a duplicate sends nothing. ``headers`` and
    ``source``: the input record's, for a dead letter, written within ``max_bytes``.

    Output records are keyed by request_id, so one request's outputs share an output
    partition and, being sent in order by one producer, keep their order.
    """
    letter = result.dead_letter
    if letter is not None:
        value = dead_letter_record.encode(letter, headers, source, max_bytes=max_bytes)
        return [OutgoingRecord(topics.dlq, dead_letter_record.kafka_key(letter), value, headers=trace)]
    if result.payload is None:
        return []
    key = result.request_id.encode("utf-8") if result.request_id is not None else None
    return [OutgoingRecord(topics.output, key, result.payload, headers=trace)]
