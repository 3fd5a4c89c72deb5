"""``derender-worker dlq replay``: send dead-lettered records back to the input topic after a fix.

How to re-drive dead letters::

    # 1. See what would be sent (nothing is produced):
    derender-worker dlq replay --dry-run --reason-contains "malformed JSON"
    # 2. Send them (same key, headers and value bytes as the original record):
    derender-worker dlq replay --reason-contains "malformed JSON"

What it does: reads the dead-letter topic with ``isolation_level=read_committed`` (so the dead
letters of aborted transactions are never replayed) from the beginning, or from
``--from-offset`` (every partition) or ``--since`` (a time), up to the end offsets it saw when it
started (records dead-lettered while it runs are left for the next run). Each value is a
``DeadLetterRecord``; its ``original`` (UTF-8 text, or base64 when the record was not UTF-8) is
produced to ``--to-topic`` (default: ``--input-topic``) with an idempotent producer, keyed by the
dead-letter record's Kafka key (the original key's exact bytes; the JSON ``key`` is the fallback,
lossy for non-UTF-8 keys) and with the original ``headers``. Same key, same partitioner: a record
goes back to the partition it came from while the partition count is unchanged.

A truncated dead letter (its original did not fit under the worker's output limit; ``truncated``)
cannot be re-driven: it is reported and skipped as undecodable.

Caveats, by design of the worker: the replay is a new record, so a stream record whose request
went on (or was closed) meanwhile is a duplicate (skipped) or a gap (error output) when it
arrives; and running the same replay twice sends the records twice. Use ``--since`` /
``--from-offset`` to replay a range once. The dead-letter topic itself is not changed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson
from pydantic import ValidationError

from schemas.envelope import DeadLetterRecord
from worker.errors import ConfigurationError, DeliveryFailedError, ReplayError
from worker.runtime.delivery import producer_config
from worker.runtime.kafka_client import make_client
from worker.runtime.kafka_client.base import (
    ClientKind,
    ConsumedRecord,
    OutgoingRecord,
    PartitionReader,
    Producer,
    ProducerConfig,
    ReaderConfig,
    TopicPartition,
)
from worker.runtime.security.from_settings import load_kafka
from worker.runtime.security.kafka_security import KafkaSecurity
from worker.runtime.topics import partition_counts
from worker.settings import DlqReplaySelection, ProducingTopics, SecuritySettings, add_arguments, load

_POLL_MS = 500
DEFAULT_IDLE_TIMEOUT_S = 60.0


# --- decoding (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayItem:
    """One dead letter, decoded back to the record it was."""

    reason: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]


def decode_dead_letter(value: bytes | None, kafka_key: bytes | None) -> ReplayItem:
    """The original record inside a dead-letter record; ``ValueError`` when it is not one."""
    if value is None:
        raise ValueError("empty dead-letter record")
    try:
        letter = DeadLetterRecord.model_validate_json(value)
    except ValidationError as exc:
        raise ValueError(f"not a DeadLetterRecord: {exc.error_count()} validation errors") from exc
    if letter.truncated:
        raise ValueError(
            f"truncated dead letter: only part of the original {letter.original_size} bytes was kept"
        )
    if letter.original_encoding == "base64":
        try:
            original = base64.b64decode(letter.original, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"original is not valid base64: {exc}") from exc
    else:
        original = letter.original.encode("utf-8")
    key = kafka_key if kafka_key is not None else (letter.key.encode("utf-8") if letter.key else None)
    headers = [
        (entry[0], base64.b64decode(entry[1]) if len(entry) == 3 else entry[1].encode("utf-8"))
        for entry in letter.headers
    ]
    return ReplayItem(letter.reason, original, key, headers)


# --- options and report -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    bootstrap_servers: str
    client_id: str
    dlq_topic: str
    to_topic: str
    producer: ProducerConfig  # the worker's producer settings (``delivery.producer_config``)
    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    from_offset: int | None = None
    since_ms: int | None = None
    reason_contains: str | None = None
    limit: int | None = None
    dry_run: bool = False
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReplayOptions:
        settings = load_kafka(ProducingTopics, args)
        selection = load(DlqReplaySelection, args)
        client_id = f"{settings.client_id}-dlq-replay"
        return cls(
            bootstrap_servers=settings.bootstrap_servers,
            client_id=client_id,
            dlq_topic=settings.topics.dlq,
            to_topic=selection.to_topic or settings.topics.input,
            producer=producer_config(settings, client_id),
            security=settings.security,
            from_offset=selection.from_offset,
            since_ms=selection.since,
            reason_contains=selection.reason_contains,
            limit=selection.limit,
            dry_run=selection.dry_run,
        )


@dataclass(slots=True)
class ReplayReport:
    read: int = 0
    replayed: int = 0  # sent, or would be sent with --dry-run
    filtered: int = 0  # reason did not match --reason-contains
    undecodable: int = 0  # not a DeadLetterRecord: reported, skipped
    dry_run: bool = False

    def summary(self) -> str:
        verb = "would replay" if self.dry_run else "replayed"
        return (
            f"{verb} {self.replayed} of {self.read} dead letters "
            f"({self.filtered} filtered out, {self.undecodable} undecodable)"
        )


# --- the replay ---------------------------------------------------------------------------------


async def _partition_count(options: ReplayOptions, security: dict[str, Any]) -> int:
    # The admin client's metadata, not the consumer's: a consumer only knows the topics it was given.
    counts = await partition_counts(options.bootstrap_servers, [options.dlq_topic], security)
    if counts.get(options.dlq_topic):
        return counts[options.dlq_topic]
    raise ConfigurationError(f"dead-letter topic {options.dlq_topic!r} does not exist")


async def _start_offsets(
    consumer: PartitionReader, tps: list[TopicPartition], options: ReplayOptions
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    beginnings = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    starts = dict(beginnings)
    if options.from_offset is not None:
        starts = {tp: min(max(options.from_offset, beginnings[tp]), ends[tp]) for tp in tps}
    elif options.since_ms is not None:
        found = await consumer.offsets_for_time(tps, options.since_ms)
        starts = {tp: offset if (offset := found.get(tp)) is not None else ends[tp] for tp in tps}
    return starts, ends


async def replay_dead_letters(options: ReplayOptions, out: TextIO | None = None) -> ReplayReport:
    """Read the dead-letter topic to its end offsets at start and re-produce the matching originals."""
    out = out if out is not None else sys.stdout
    report = ReplayReport(dry_run=options.dry_run)
    security = options.security.client_kwargs()
    # Reads by explicit offsets and commits nothing: the DLQ is left as it is.
    client = make_client(ClientKind.AIOKAFKA, options.security, security)
    consumer = client.reader(ReaderConfig(options.bootstrap_servers, options.client_id, options.security))
    producer: Producer | None = None
    await consumer.start()
    try:
        partitions = await _partition_count(options, security)
        tps = [TopicPartition(options.dlq_topic, p) for p in range(partitions)]
        consumer.assign(tps)
        starts, ends = await _start_offsets(consumer, tps, options)
        for tp in tps:
            consumer.seek(tp, starts[tp])
        if not options.dry_run:
            # Idempotent: a retried send is not written twice.
            producer = client.producer(options.producer)
            await producer.start()
        await _copy(
            consumer, producer, {tp for tp in tps if starts[tp] < ends[tp]}, ends, options, report, out
        )
    finally:
        if producer is not None:
            await producer.stop()
        await consumer.stop()
    return report


async def _copy(
    consumer: PartitionReader,
    producer: Producer | None,
    pending: set[TopicPartition],
    ends: dict[TopicPartition, int],
    options: ReplayOptions,
    report: ReplayReport,
    out: TextIO,
) -> None:
    idle_deadline = time.monotonic() + options.idle_timeout_s
    while pending and (options.limit is None or report.replayed < options.limit):
        batches = await consumer.fetch(list(pending), _POLL_MS)
        for tp, records in batches.items():
            for record in records:
                if record.offset >= ends[tp] or (
                    options.limit is not None and report.replayed >= options.limit
                ):
                    break
                report.read += 1
                await _replay_one(record, producer, options, report, out)
        progressed = False
        for tp in list(pending):
            # position() moves past transaction markers too, so it reaches the end offset.
            if await consumer.position(tp) >= ends[tp]:
                pending.discard(tp)
                progressed = True
        if batches or progressed:
            idle_deadline = time.monotonic() + options.idle_timeout_s
        elif time.monotonic() > idle_deadline:
            raise ReplayError(
                f"no progress reading {options.dlq_topic} for {options.idle_timeout_s:.0f} s; "
                f"{report.summary()} so far"
            )
    if producer is not None:
        try:
            await producer.flush()
        except DeliveryFailedError as exc:
            raise ReplayError(f"sends failed, first: {exc}; {report.summary()}") from exc


async def _replay_one(
    record: ConsumedRecord,
    producer: Producer | None,
    options: ReplayOptions,
    report: ReplayReport,
    out: TextIO,
) -> None:
    where = {"partition": record.partition, "offset": record.offset}
    try:
        item = decode_dead_letter(record.value, record.key)
    except ValueError as exc:
        report.undecodable += 1
        print(orjson.dumps({"skipped": "undecodable", **where, "error": str(exc)}).decode(), file=out)
        return
    if options.reason_contains is not None and options.reason_contains not in item.reason:
        report.filtered += 1
        return
    report.replayed += 1
    if producer is None:  # --dry-run
        line = {
            "would_send": options.to_topic,
            "from": where,
            "key": item.key.decode("utf-8", errors="replace") if item.key is not None else None,
            "bytes": len(item.value),
            "headers": [name for name, _ in item.headers],
            "reason": item.reason,
        }
        print(orjson.dumps(line).decode(), file=out)
        return
    await producer.send(OutgoingRecord(options.to_topic, item.key, item.value, headers=tuple(item.headers)))


# --- the command --------------------------------------------------------------------------------


def register_dlq(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``dlq replay`` to ``derender-worker`` (called from ``worker.commands.run.register``)."""
    dlq = commands.add_parser("dlq", help="work with the dead-letter topic")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True)
    replay = dlq_commands.add_parser(
        "replay",
        help="re-produce dead-lettered records to the input topic (after a fix)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(replay, ProducingTopics, SecuritySettings, DlqReplaySelection)
    replay.set_defaults(handler=_dlq_replay)


def _dlq_replay(args: argparse.Namespace) -> int:
    options = ReplayOptions.from_args(args)
    report = asyncio.run(replay_dead_letters(options))
    print(report.summary())
    return 0
