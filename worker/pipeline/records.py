"""``derender-worker produce`` and ``consume``: JSON Lines in and out of a topic.

For a broker without Kafka's console tools. ``produce`` keys each record by its ``request_id``
(envelopes, request envelopes and cancel records all have one), so a request's records share a
partition and keep their order. ``consume`` reads with ``read_committed``, so it never shows the
output of an aborted transaction.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, TextIO

import orjson

from worker.assembly import Assembler, render_text
from worker.pipeline.connection import (
    MAX_REQUEST_BYTES,
    Connection,
    add_connection_arguments,
    require_topics,
)
from worker.runtime.kafka_client.aiokafka_plain import PlainClientError
from worker.runtime.kafka_client.base import TopicPartition
from worker.settings import ConsumeOptions, ProduceOptions, add_arguments, load


def record_key(value: Any) -> bytes | None:
    """The Kafka key of a JSON value: its ``request_id`` when it is an object that has a string one."""
    if isinstance(value, dict):
        request_id = value.get("request_id")
        if isinstance(request_id, str) and request_id:
            return request_id.encode()
    return None


# A longer line cannot be one record (the producers' request limit): it is skipped unread.
MAX_LINE_BYTES = MAX_REQUEST_BYTES
_SKIP_CHUNK = 1 << 20


def bounded_lines(source: BinaryIO, max_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes | None]:
    """The lines of ``source``; ``None`` for one longer than ``max_bytes``, which is read past in
    chunks and never held whole (a multi-gigabyte line costs no more memory than a short one)."""
    while True:
        line = source.readline(max_bytes + 1)
        if not line:
            return
        if len(line) <= max_bytes or line.endswith(b"\n"):  # the newline may be the byte past the limit
            yield line
            continue
        while not line.endswith(b"\n"):  # the rest of the oversized line
            line = source.readline(_SKIP_CHUNK)
            if not line:
                break
        yield None


async def produce_lines(
    connection: Connection, topic: str, lines: Iterable[bytes | None], err: TextIO
) -> int:
    """Send every JSON line to ``topic`` in order. Each line has one outcome: sent, or a message
    naming it (not JSON, too large, refused by the broker); exit status 1 when any was not sent."""
    await require_topics(connection, topic)
    # Not idempotent: a batch the broker refuses (too large for the topic) would leave a gap in the
    # idempotent sequence, and every later record of that partition would fail out of order.
    producer = connection.producer(linger_ms=5, enable_idempotence=False)
    await producer.start()
    sent = failed = 0
    try:
        pending: list[tuple[int, asyncio.Future[Any]]] = []
        for number, line in enumerate(lines, start=1):
            if line is None or len(line.rstrip(b"\r\n")) > MAX_LINE_BYTES:
                failed += 1
                print(f"produce: line {number}: longer than {MAX_LINE_BYTES} bytes, not sent", file=err)
                continue
            raw = line.strip()
            if not raw:
                continue
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                failed += 1
                print(f"produce: line {number}: not JSON ({exc})", file=err)
                continue
            try:
                pending.append((number, await producer.send(topic, value=raw, key=record_key(value))))
            except PlainClientError as exc:  # refused before sending: too large for the producer
                failed += 1
                print(f"produce: line {number}: not sent ({exc!r})", file=err)
        for number, future in pending:
            try:
                await future
                sent += 1
            except PlainClientError as exc:  # refused by the broker (the topic's max.message.bytes, ...)
                failed += 1
                print(f"produce: line {number}: not sent ({exc!r})", file=err)
    finally:
        await producer.stop()
    print(f"produce: {sent} record(s) to {topic}", file=err)
    return 1 if failed else 0


async def consume_records(
    connection: Connection,
    topic: str,
    out: BinaryIO,
    err: TextIO,
    *,
    follow: bool,
    from_beginning: bool,
    assemble: bool,
    max_records: int | None = None,
) -> int:
    """Print each committed record value as one line; without ``follow``, stop at the end seen at start."""
    consumer = connection.reader("consume")
    await consumer.start()
    assembler = Assembler() if assemble else None
    count = 0
    try:
        count_of = (await require_topics(connection, topic))[topic]
        partitions = [TopicPartition(topic, p) for p in range(count_of)]
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions) if from_beginning else ends
        for tp in partitions:
            consumer.seek(tp, starts[tp])
        pending = {tp for tp in partitions if starts[tp] < ends[tp]}
        while follow or pending:
            batches = await consumer.fetch(partitions, 200)
            for records in batches.values():
                for record in records:
                    if record.value is None:
                        continue
                    out.write(record.value.rstrip(b"\n") + b"\n")
                    count += 1
                    if assembler is not None:
                        _assemble(assembler, record.value)
                    if max_records is not None and count >= max_records:
                        out.flush()
                        return 0
                out.flush()
            for tp in list(pending):
                # read_committed stops at the last stable offset, which transaction markers pass.
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    finally:
        await consumer.stop()
        if assembler is not None:
            for response in assembler.responses.values():
                print(render_text(response), file=err)
    return 0


def _assemble(assembler: Assembler, raw: bytes) -> None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    is_output = isinstance(value, dict) and "seq" in value and ("body" in value or "error" in value)
    if is_output and (value.get("error") is not None or isinstance(value.get("body"), dict)):
        assembler.add(value)


def _open(path: str) -> BinaryIO:
    return sys.stdin.buffer if path == "-" else open(path, "rb")


def _produce(args: argparse.Namespace) -> int:
    options = load(ProduceOptions, args)
    connection = Connection.from_args(args, "produce")
    source = _open(args.file)
    try:
        return asyncio.run(produce_lines(connection, options.topic, bounded_lines(source), sys.stderr))
    finally:
        if source is not sys.stdin.buffer:
            source.close()


def _consume(args: argparse.Namespace) -> int:
    options = load(ConsumeOptions, args)
    connection = Connection.from_args(args, "consume")
    try:
        return asyncio.run(
            consume_records(
                connection,
                options.topic,
                sys.stdout.buffer,
                sys.stderr,
                follow=options.follow,
                from_beginning=options.from_beginning,
                assemble=options.assemble,
                max_records=options.max_records,
            )
        )
    except KeyboardInterrupt:
        return 130


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    produce = commands.add_parser("produce", help="send JSON Lines to a topic, keyed by request_id")
    produce.add_argument("file", help="JSON Lines ('-': stdin)")
    add_arguments(produce, ProduceOptions)
    add_connection_arguments(produce, producing=True)
    produce.set_defaults(handler=_produce)

    consume = commands.add_parser("consume", help="print a topic's committed records as JSON Lines")
    add_arguments(consume, ConsumeOptions)
    add_connection_arguments(consume)
    consume.set_defaults(handler=_consume)
