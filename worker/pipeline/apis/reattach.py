"""Taking over a request another gateway replica sent: was it written, and its answer from the topics.

A replica that claims a background response or a batch (``lease``) knows its requests' ids and a time
before which none was sent. ``written`` reads the requests topic from that time to its end for those ids:
a request found there is never sent again (ingest would generate it a second time once the first run
ended); its answer is read from the output topic from that time on, records of its key fed to a
``Delivery`` as the gateway's own reader feeds them (``OutputTail``). Both read every partition from the
offset of that time (a topic may have grown partitions since), record by record, keeping nothing but the
wanted keys' records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from types import TracebackType

import orjson

from worker.pipeline.apis.chat_source import JsonDict
from worker.pipeline.connection import Connection, topic_partitions
from worker.pipeline.gateway_admission import admit_body
from worker.pipeline.gateway_delivery import Delivery, Mailbox
from worker.runtime.kafka_client.base import PartitionReader, TopicPartition
from worker.settings import GatewayOptions

log = logging.getLogger(__name__)

# Record timestamps are the writers' clocks (the gateway's for a request, a worker's for an output):
# reading starts this much before the time given, so clocks that far apart still find every record.
CLOCK_SKEW_MS = 60_000


@dataclass(frozen=True, slots=True)
class _Tail:
    reader: PartitionReader
    partitions: list[TopicPartition]


async def _reader_from(connection: Connection, topic: str, since_ms: int, role: str) -> _Tail:
    """A reader of every partition of ``topic``, each at its first record at or after ``since_ms``."""
    partitions = await topic_partitions(connection, topic)
    reader = connection.reader(role)
    await reader.start()
    try:
        reader.assign(partitions)
        found = await reader.offsets_for_time(partitions, max(0, since_ms - CLOCK_SKEW_MS))
        ends = await reader.end_offsets(partitions)
        for tp in partitions:
            at = found.get(tp)
            reader.seek(tp, at if at is not None else ends[tp])
    except BaseException:
        await reader.stop()
        raise
    return _Tail(reader, partitions)


async def written(connection: Connection, topic: str, ids: Iterable[str], since_ms: int) -> set[str]:
    """Which of ``ids`` have a request record on ``topic`` (the requests topic) since ``since_ms``."""
    wanted = {i.encode(): i for i in ids}
    if not wanted:
        return set()
    found: set[str] = set()
    tail = await _reader_from(connection, topic, since_ms, "written")
    try:
        ends = await tail.reader.end_offsets(tail.partitions)
        while [tp for tp, end in ends.items() if await tail.reader.position(tp) < end]:
            for records in (await tail.reader.fetch(tail.partitions, timeout_ms=200)).values():
                for record in records:
                    name = wanted.get(record.key or b"")
                    if name is None or name in found:
                        continue
                    with contextlib.suppress(orjson.JSONDecodeError):
                        value = orjson.loads(record.value or b"")
                        if isinstance(value, dict) and "request" in value:  # not a cancel or a marker
                            found.add(name)
    finally:
        await tail.reader.stop()
    return found


class OutputTail:
    """The output topic read from a time on, its records handed to the deliveries of followed requests."""

    def __init__(
        self, connection: Connection, settings: GatewayOptions, since_ms: int, request_ids: Iterable[str]
    ) -> None:
        self.connection = connection
        self.settings = settings
        self.since_ms = since_ms
        # Each request's records are kept from the first one read, whenever its reader comes.
        self._mailboxes = {rid: self._mailbox() for rid in request_ids}
        self._tail: _Tail | None = None
        self._reader: asyncio.Task[None] | None = None

    def _mailbox(self) -> Mailbox:
        return Mailbox(self.settings.max_queued_bytes, lambda _: None, lambda: None)

    async def __aenter__(self) -> OutputTail:
        self._tail = await _reader_from(self.connection, self.settings.output_topic, self.since_ms, "tail")
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._tail is not None:
            await self._tail.reader.stop()

    def follow(self, request_id: str, chat: JsonDict) -> Delivery:
        """The delivery of ``request_id`` (one of the tail's), sent as ``chat``: its records from the
        tail's start on (a chat request is one stream, keyed by its id)."""
        admitted = admit_body(orjson.dumps(chat), "chat", self.settings)
        mailbox = self._mailboxes.setdefault(request_id, self._mailbox())
        return Delivery(request_id, admitted, mailbox, self.settings.request_timeout_s)

    def unfollow(self, delivery: Delivery) -> None:
        for key in delivery.stream_ids:
            self._mailboxes.pop(key, None)

    async def _read(self) -> None:
        assert self._tail is not None
        while True:
            batches = await self._tail.reader.fetch(self._tail.partitions, timeout_ms=100)
            for records in batches.values():
                for record in records:
                    key = record.key.decode(errors="replace") if record.key else ""
                    mailbox = self._mailboxes.get(key)
                    if mailbox is not None and record.value is not None:
                        mailbox.put(key, record.value)


async def one_answer(tail: OutputTail, request_id: str, chat: JsonDict) -> JsonDict:
    """A non-streaming request's answer (or ``{"error": ...}``) from the tail."""
    delivery = tail.follow(request_id, chat)
    try:
        return await delivery.result()
    finally:
        tail.unfollow(delivery)


async def chunks(tail: OutputTail, request_id: str, chat: JsonDict) -> AsyncGenerator[JsonDict, None]:
    """A streaming request's chunks (then possibly one ``{"error": ...}``) from the tail."""
    delivery = tail.follow(request_id, chat)
    try:
        async for event in delivery.events():
            yield event
    finally:
        tail.unfollow(delivery)
