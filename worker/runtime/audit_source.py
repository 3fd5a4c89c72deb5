"""The Kafka side of ``derender-worker audit``: an input range, the recorded outputs, the backfill.

* Inputs: the input topic's selected partitions (``--partition``, default all) from ``--from`` /
  ``--from-offset`` (default: the beginning) up to ``--to`` / ``--to-offset`` (exclusive; default:
  the end offsets when the audit starts), with ``read_committed`` as the worker reads them.
* Recorded outputs: every partition of the output topic from shortly before the first input's
  timestamp (``OUTPUT_LOOKBACK_MS``, for clock skew between producers) to its end offsets once the
  inputs are read. Records whose ``source`` lies outside the input range are ignored.
* ``--emit-topic``: the re-derendered outputs, keyed by ``request_id`` as the worker writes them,
  in one transaction (all of the range or nothing), so a corrected stream can be written beside
  the old one. The transactional id is ``derender-audit-{topic}``: a second backfill into the same
  topic fences the first instead of interleaving with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, TextIO

from worker.audit import Auditor, InputRange, Progress, count_lines, feed_output_file, file_lines, finish
from worker.core.envelope_processor import EnvelopeProcessor
from worker.errors import AuditUsageError, ConfigurationError, KafkaClientError
from worker.runtime.delivery import producer_config
from worker.runtime.kafka_client import make_client
from worker.runtime.kafka_client.base import (
    ClientKind,
    OutgoingRecord,
    PartitionReader,
    ReaderConfig,
    TopicPartition,
)
from worker.runtime.topics import partition_counts
from worker.settings import (
    AuditOptions,
    AuditRange,
    KafkaTopics,
    ProducingTopics,
    SecuritySettings,
    add_arguments,
)

OUTPUT_LOOKBACK_MS = 5 * 60 * 1000
EMIT_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000  # the broker's default transaction.max.timeout.ms
IDLE_TIMEOUT_S = 60.0
_POLL_MS = 500


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """``audit``'s Kafka flags: the connection, topic and security flags of ``run``."""
    add_arguments(parser, ProducingTopics, SecuritySettings)


def audit_with_kafka(
    options: AuditOptions,
    settings: ProducingTopics,
    new_processor: Callable[[], EnvelopeProcessor],
    err: TextIO,
) -> int:
    """The audit when a topic is involved (inputs, outputs or ``--emit-topic``); the exit status."""
    # The failure is reported once, as the exception's one line: not also as aiokafka's log lines.
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())
    try:
        return asyncio.run(_audit(options, settings, new_processor, err))
    except KafkaClientError as exc:
        raise AuditUsageError(f"Kafka at {settings.bootstrap_servers}: {exc}") from exc


async def _audit(
    args: AuditOptions, settings: ProducingTopics, new_processor: Callable[[], EnvelopeProcessor], err: TextIO
) -> int:
    security = settings.security.client_kwargs()
    auditor = Auditor(new_processor)
    progress = Progress(err)
    if args.emit_topic in (settings.topics.input, settings.topics.output):
        raise ConfigurationError(
            "--emit-topic must be a topic of its own, beside the input and output topics"
        )
    # Every topic checked before any work: a wrong address or name fails at once.
    needed = [args.emit_topic] if args.emit_topic else []
    needed += [] if args.input_file else [settings.topics.input]
    needed += [] if args.output_file else [settings.topics.output]
    await _require_topics(settings, security, needed)
    emitter = None
    if args.emit_topic:
        emitter = Emitter(settings, security, args.emit_topic)
        await emitter.start()
    # Opened once, written through a buffer: no event-loop stall worth a thread hop per line.
    emit_file = open(args.emit_file, "wb") if args.emit_file else None  # noqa: SIM115, ASYNC230
    try:

        async def emit(request_id: str, data: bytes) -> None:
            if emit_file is not None:
                emit_file.write(data + b"\n")
            if emitter is not None:
                await emitter.send(request_id, data)

        if args.input_file:
            auditor.ignore_unknown_requests = not args.output_file
            progress.start("derendering inputs", count_lines(args.input_file))
            for _, value in file_lines(args.input_file):
                emitted = auditor.add_input(value)
                if emitted is not None:
                    await emit(*emitted)
                progress.advance()
            progress.stop()
        else:
            await read_input_range(args, settings, security, auditor, emit, progress)
        if emitter is not None:
            await emitter.commit()
    finally:
        if emit_file is not None:
            emit_file.close()
        if emitter is not None:
            await emitter.stop()
    if args.output_file:
        feed_output_file(auditor, args.output_file, progress)
    elif auditor.counts.inputs:
        since = auditor.first_timestamp_ms
        await read_recorded(
            settings, security, auditor, progress, None if since is None else since - OUTPUT_LOOKBACK_MS
        )
    return finish(auditor.finish(), args, err)


async def _require_topics(
    settings: KafkaTopics, security: dict[str, Any], names: list[str]
) -> dict[str, int]:
    counts = await partition_counts(settings.bootstrap_servers, names, security)
    missing = [name for name in names if not counts.get(name)]
    if missing:
        raise ConfigurationError(f"topic(s) {missing} do not exist on {settings.bootstrap_servers}")
    return counts


def _consumer(settings: KafkaTopics, security: dict[str, Any]) -> PartitionReader:
    config = ReaderConfig(settings.bootstrap_servers, f"{settings.client_id}-audit", settings.security)
    return make_client(ClientKind.AIOKAFKA, settings.security, security).reader(config)


async def _offsets_at(
    consumer: PartitionReader, tps: list[TopicPartition], when_ms: int, fallback: dict[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """The first offset at or after ``when_ms`` per partition; ``fallback`` where there is none."""
    found = await consumer.offsets_for_time(tps, when_ms)
    return {tp: offset if (offset := found.get(tp)) is not None else fallback[tp] for tp in tps}


async def read_input_range(
    args: AuditRange,
    settings: KafkaTopics,
    security: dict[str, Any],
    auditor: Auditor,
    emit: Callable[[str, bytes], Any],
    progress: Progress,
) -> None:
    topic = settings.topics.input
    count = (await _require_topics(settings, security, [topic]))[topic]
    partitions = sorted(set(args.partitions)) if args.partitions else list(range(count))
    wrong = [p for p in partitions if not 0 <= p < count]
    if wrong:
        raise AuditUsageError(f"--partition {wrong[0]}: input topic {topic!r} has partitions 0..{count - 1}")
    consumer = _consumer(settings, security)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        first: dict[TopicPartition, int] = await consumer.beginning_offsets(tps)
        last: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        starts = dict(first)
        if args.from_offset is not None:
            starts = {tp: min(max(args.from_offset, first[tp]), last[tp]) for tp in tps}
        elif args.from_time is not None:
            starts = await _offsets_at(consumer, tps, args.from_time, last)
        stops = dict(last)
        if args.to_offset is not None:
            stops = {tp: min(args.to_offset, last[tp]) for tp in tps}
        elif args.to_time is not None:
            stops = await _offsets_at(consumer, tps, args.to_time, last)
        stops = {tp: max(stops[tp], starts[tp]) for tp in tps}
        if all(starts[tp] >= stops[tp] for tp in tps):
            # Nothing to compare is no verdict: "identical" would say the range was checked.
            resolved = ", ".join(
                f"partition {tp.partition} [{starts[tp]}, {stops[tp]}) of [{first[tp]}, {last[tp]})"
                for tp in tps
            )
            raise AuditUsageError(f"the selected range of {topic!r} holds no record: {resolved}")
        auditor.input_range = InputRange(topic, {tp.partition: (starts[tp], stops[tp]) for tp in tps})
        for tp in tps:
            consumer.seek(tp, starts[tp])
        progress.start("derendering inputs", sum(stops[tp] - starts[tp] for tp in tps))

        async def handle(record: Any) -> None:
            emitted = auditor.add_input(
                record.value if record.value is not None else b"",
                record.key,
                (record.topic, record.partition, record.offset),
                record.timestamp,
            )
            if emitted is not None:
                await emit(*emitted)
            progress.advance()

        await _read(consumer, {tp for tp in tps if starts[tp] < stops[tp]}, stops, handle)
    finally:
        progress.stop()
        await consumer.stop()


async def read_recorded(
    settings: KafkaTopics,
    security: dict[str, Any],
    auditor: Auditor,
    progress: Progress,
    since_ms: int | None,
) -> None:
    topic = settings.topics.output
    count = (await _require_topics(settings, security, [topic]))[topic]
    consumer = _consumer(settings, security)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(count)]
        consumer.assign(tps)
        first: dict[TopicPartition, int] = await consumer.beginning_offsets(tps)
        last: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        starts = dict(first) if since_ms is None else await _offsets_at(consumer, tps, since_ms, last)
        for tp in tps:
            consumer.seek(tp, starts[tp])
        progress.start("reading recorded outputs", sum(last[tp] - starts[tp] for tp in tps))

        async def handle(record: Any) -> None:
            at = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
            auditor.add_recorded(record.value if record.value is not None else b"", at, record.key)
            progress.advance()

        await _read(consumer, {tp for tp in tps if starts[tp] < last[tp]}, last, handle)
    finally:
        progress.stop()
        await consumer.stop()


async def _read(
    consumer: PartitionReader,
    pending: set[TopicPartition],
    stops: dict[TopicPartition, int],
    handle: Callable[[Any], Any],
) -> None:
    """Every record below ``stops`` of the ``pending`` partitions, through ``handle``."""
    idle_deadline = time.monotonic() + IDLE_TIMEOUT_S
    while pending:
        batches = await consumer.fetch(list(pending), _POLL_MS)
        for tp, records in batches.items():
            for record in records:
                if record.offset >= stops[tp]:
                    break
                await handle(record)
        progressed = False
        for tp in list(pending):
            # position() moves past transaction markers and aborted records, so it reaches the stop.
            if await consumer.position(tp) >= stops[tp]:
                pending.discard(tp)
                progressed = True
        if batches or progressed:
            idle_deadline = time.monotonic() + IDLE_TIMEOUT_S
        elif time.monotonic() > idle_deadline:
            names = sorted(f"{tp.topic}[{tp.partition}]" for tp in pending)
            raise AuditUsageError(f"no progress reading {', '.join(names)} for {IDLE_TIMEOUT_S:.0f} s")


class Emitter:
    """The backfill: one transactional producer, one transaction for the whole range."""

    def __init__(self, settings: ProducingTopics, security: dict[str, Any], topic: str) -> None:
        self.topic = topic
        self.sent = 0
        config = producer_config(settings, f"{settings.client_id}-audit-emit", EMIT_TRANSACTION_TIMEOUT_MS)
        client = make_client(ClientKind.AIOKAFKA, settings.security, security)
        self._producer = client.transactional_producer(config, f"derender-audit-{topic}")
        self._open = False

    async def start(self) -> None:
        await self._producer.start()
        await self._producer.begin()
        self._open = True

    async def send(self, request_id: str, value: bytes) -> None:
        await self._producer.send(OutgoingRecord(self.topic, request_id.encode("utf-8"), value))
        self.sent += 1

    async def commit(self) -> None:
        await self._producer.commit({}, None)  # raises if a send of the transaction failed
        self._open = False

    async def stop(self) -> None:
        try:
            if self._open:  # the audit failed: nothing of this range becomes visible
                with contextlib.suppress(KafkaClientError):  # the first error is the one to report
                    await self._producer.abort()
        finally:
            await self._producer.stop()
