"""Stored responses: a compacted topic keyed by response id, read whole by every gateway replica.

A record is the latest state of one response: ``{"response": Response, "messages": [chat messages of its
input], "events": [its stream events] | null}``. ``previous_response_id`` rebuilds the conversation from
``messages`` and ``response.output``; a background response's record is rewritten as its events arrive,
so any replica can answer ``GET /v1/responses/{id}`` and follow its stream. Each replica keeps the newest
records in memory, up to ``--responses-store-max-mb``; the topic's retention bounds what the broker keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from worker.pipeline.apis.chat_source import JsonDict
from worker.pipeline.connection import MAX_REQUEST_BYTES, Connection, topic_partitions

log = logging.getLogger(__name__)

FINAL_STATUSES = ("completed", "incomplete", "failed", "cancelled")
CATCH_UP_S = 5.0  # how long a lookup waits for this replica to read what others wrote before it


class ResponsesStore:
    def __init__(self, connection: Connection, topic: str, max_bytes: int) -> None:
        self.connection = connection
        self.topic = topic
        self.max_bytes = max_bytes
        self.records: OrderedDict[str, JsonDict] = OrderedDict()
        self._sizes: dict[str, int] = {}  # each record's size as it came (a measure of what it holds)
        self.held_bytes = 0
        self._changed = asyncio.Event()
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._partitions: list[TopicPartition] = []
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._partitions = await topic_partitions(self.connection, self.topic)
        self._producer = self.connection.producer(linger_ms=0)
        await self._producer.start()
        self._consumer = self.connection.consumer()
        await self._consumer.start()
        self._consumer.assign(self._partitions)
        await self._consumer.seek_to_beginning(*self._partitions)
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    if record.key is None:
                        continue
                    key = record.key.decode(errors="replace")
                    value = None
                    with contextlib.suppress(orjson.JSONDecodeError):
                        value = orjson.loads(record.value) if record.value is not None else None
                    if isinstance(value, dict) and isinstance(value.get("response"), dict):
                        self._keep(key, value, len(record.value or b""))
                    else:
                        self._drop(key)  # a tombstone (or a record not ours)
            if batches:
                self._notify()

    def _keep(self, key: str, value: JsonDict, size: int) -> None:
        old = self.records.get(key)
        if old is not None and old["response"].get("status") == "cancelled":
            # A cancel wins over the generation's own later writes (they race on the topic).
            value = {**value, "response": {**value["response"], "status": "cancelled"}}
        self._drop(key)
        self.records[key] = value
        self._sizes[key] = size
        self.held_bytes += size
        while self.held_bytes > self.max_bytes and len(self.records) > 1:
            self._drop(next(iter(self.records)))

    def _drop(self, key: str) -> None:
        if self.records.pop(key, None) is not None:
            self.held_bytes -= self._sizes.pop(key)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, within_s: float) -> None:
        """Until a record arrives (or ``within_s`` passed)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                await self._changed.wait()

    async def put(self, response_id: str, record: JsonDict) -> None:
        """Write the response's latest state (too big for a record: without its events, then messages)."""
        assert self._producer is not None
        value = orjson.dumps(record)
        for dropped in ("events", "messages"):
            if len(value) <= MAX_REQUEST_BYTES - 1024:
                break
            log.warning("stored response %s is too big: its %s are not kept", response_id, dropped)
            record = {**record, dropped: None}
            value = orjson.dumps(record)
        self._keep(response_id, record, len(value))
        self._notify()
        await self._producer.send_and_wait(self.topic, value=value, key=response_id.encode())

    async def get(self, response_id: str) -> JsonDict | None:
        """The response's latest record, after reading up to what the topic held when asked."""
        found = self.records.get(response_id)
        if found is not None:
            return found
        await self._catch_up()
        return self.records.get(response_id)

    async def _catch_up(self) -> None:
        assert self._consumer is not None
        ends = await self._consumer.end_offsets(self._partitions)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CATCH_UP_S):
                for tp, end in ends.items():
                    while await self._consumer.position(tp) < end:
                        await self.changed(0.1)
