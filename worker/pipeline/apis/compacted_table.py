"""A compacted topic that every gateway replica reads whole into memory and writes to.

The stores of the other APIs (stored responses, batch files and batches) are each one such table: a
reader task reads the topic from its beginning and hands every record to the store's ``take``, and a
lookup of a key this replica has not seen yet first reads up to what the topic held when it was asked
(another replica may have written it a moment ago).
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from worker.pipeline.connection import Connection, topic_partitions
from worker.runtime.kafka_client.base import AckedProducer, OutgoingRecord, PartitionReader, TopicPartition

CATCH_UP_S = 5.0  # how long a lookup waits for this replica to read what others wrote before it


class CompactedTable:
    def __init__(self, connection: Connection, topic: str) -> None:
        self.connection = connection
        self.topic = topic
        self.partitions: list[TopicPartition] = []
        self._producer: AckedProducer | None = None
        self._consumer: PartitionReader | None = None
        self._reader: asyncio.Task[None] | None = None
        self._fetched = asyncio.Event()  # replaced after each fetch: set means "the reader moved on"

    def take(self, key: bytes | None, value: bytes | None) -> None:
        """One record read from the topic (``value`` None: a tombstone)."""
        raise NotImplementedError

    def place(self, key: bytes, partition: int, offset: int) -> None:
        """Where a record read from the topic is (before its ``take``): for a store that indexes them."""

    def fetched(self, any_records: bool) -> None:
        """After each fetch of the reader, with or without records."""

    async def start(self) -> None:
        self.partitions = await topic_partitions(self.connection, self.topic)
        self._producer = self.connection.acked_producer()
        await self._producer.start()
        self._consumer = self.connection.reader(f"table-{self.topic}")
        await self._consumer.start()
        self._consumer.assign(self.partitions)
        for tp, first in (await self._consumer.beginning_offsets(self.partitions)).items():
            self._consumer.seek(tp, first)
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()

    async def send(self, key: str, value: bytes) -> None:
        assert self._producer is not None
        await self._producer.send_and_wait(OutgoingRecord(self.topic, key=key.encode(), value=value))

    async def caught_up(self) -> None:
        """Until this replica has read what the topic held when asked (at most ``CATCH_UP_S``)."""
        assert self._consumer is not None
        ends = await self._consumer.end_offsets(self.partitions)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CATCH_UP_S):
                for tp, end in ends.items():
                    while await self._consumer.position(tp) < end:
                        await self._fetched.wait()

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.fetch(self.partitions, timeout_ms=100)
            for records in batches.values():
                for record in records:
                    if record.key is not None:
                        self.place(record.key, record.partition, record.offset)
                    self.take(record.key, record.value)
            self.fetched(bool(batches))
            self._fetched.set()
            self._fetched = asyncio.Event()

    def runs_with(self, app: web.Application) -> None:
        """Start with ``app`` and stop with it."""

        async def start(_: web.Application) -> None:
            await self.start()

        async def stop(_: web.Application) -> None:
            await self.stop()

        app.on_startup.append(start)
        app.on_cleanup.append(stop)
