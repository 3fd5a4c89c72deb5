"""The batch topic as a table (``BatchStore``): files in chunks and batches' metadata, with the lease
rule applied to what is read. A leaf of the Batch API: ``batch`` (the HTTP routes) and ``batch_run``
(running one batch) both use it, and it imports neither.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncGenerator

import orjson

from worker.pipeline.apis.chat_source import JsonDict
from worker.pipeline.apis.compacted_table import CompactedTable
from worker.pipeline.apis.lease import accepts, same_lease
from worker.pipeline.connection import Connection
from worker.runtime.kafka_client.base import PartitionReader, TopicPartition

CHUNK_BYTES = 512 * 1024  # a file's chunk in the batch topic, and the unit a download reads
FINAL = ("completed", "failed", "expired", "cancelled")
RUNNING = ("validating", "in_progress", "finalizing")


class BatchStore(CompactedTable):
    """The batch topic as a table: every file's and batch's metadata, and where each file chunk is."""

    def __init__(self, connection: Connection, topic: str) -> None:
        super().__init__(connection, topic)
        self.meta: dict[str, JsonDict] = {}  # "file:<id>" / "batch:<id>" -> latest value
        # file id -> the partition and offset of each of its chunks (the latest of each key), under 200
        # bytes a chunk, so a download seeks to its chunks instead of reading the topic.
        self.chunk_index: dict[str, dict[int, tuple[int, int]]] = {}

    def place(self, key: bytes, partition: int, offset: int) -> None:
        name = key.decode(errors="replace")
        if name.count(":") != 2 or not name.startswith("file:"):
            return
        _, file_id, n = name.split(":")
        if n.isdigit():
            self.chunk_index.setdefault(file_id, {})[int(n)] = (partition, offset)

    def take(self, key: bytes | None, value: bytes | None) -> None:
        name = key.decode(errors="replace") if key else ""
        if name.count(":") != 1 or value is None:
            return  # a chunk (placed in the index) or a tombstone
        with contextlib.suppress(orjson.JSONDecodeError):
            meta = orjson.loads(value)
            if isinstance(meta, dict):
                self._keep(name, meta)

    def _keep(self, key: str, value: JsonDict) -> bool:
        """Whether ``value`` now stands for ``key`` (the lease rule, ``lease.accepts``, may refuse it)."""
        old = self.meta.get(key)
        if old is not None and key.startswith("batch:"):
            if value.get("status") == "cancelling" and old.get("status") not in (*FINAL, "cancelling"):
                # A cancel, from any replica: it marks the current record, whoever holds its lease.
                value = {**old, "status": "cancelling", "cancelling_at": value.get("cancelling_at")}
            elif not accepts(old, value):
                return False
            elif old.get("status") == "cancelling" and value.get("status") in RUNNING:
                # A cancel wins over the runner's progress writes that raced it on the topic.
                value = {**value, "status": "cancelling", "cancelling_at": old.get("cancelling_at")}
        self.meta[key] = value
        return True

    async def put_meta(self, key: str, value: JsonDict) -> bool:
        """Write ``value``; False when this replica already knows the lease rule refuses it."""
        kept = self._keep(key, value)
        await self.send(key, orjson.dumps(self.meta[key] if kept else value))
        return kept

    async def claim(self, key: str, value: JsonDict) -> bool:
        """Write a claim of ``key``'s lease and read the topic up to it: True when it won."""
        await self.send(key, orjson.dumps(value))
        await self.caught_up()
        return same_lease(self.meta.get(key), value)

    async def get_meta(self, key: str) -> JsonDict | None:
        """The latest metadata under ``key``, after reading up to what the topic held when asked (another
        replica may have written it a moment ago)."""
        if key not in self.meta:
            await self.caught_up()
        return self.meta.get(key)

    async def write_file(self, purpose: str, filename: str, content: bytes) -> JsonDict:
        file_id = f"file-{uuid.uuid4().hex}"
        chunks = [content[i : i + CHUNK_BYTES] for i in range(0, len(content), CHUNK_BYTES)] or [b""]
        for n, chunk in enumerate(chunks):
            await self.send(f"file:{file_id}:{n}", chunk)
        meta = file_meta(file_id, purpose, filename, len(content), len(chunks))
        await self.put_meta(f"file:{file_id}", meta)
        return meta

    async def chunks(self, file_id: str, first: int = 0) -> AsyncGenerator[bytes, None]:
        """A file's chunks from ``first`` on, each read from where the index says it is (one chunk in
        memory at a time). Ends early when a chunk is missing: check ``complete`` first."""
        meta = await self.get_meta(f"file:{file_id}")
        if meta is None or first >= meta["chunks"]:
            return
        consumer = self.connection.reader("file")
        await consumer.start()
        try:
            for n in range(first, meta["chunks"]):
                chunk = await self._read_chunk(consumer, file_id, n)
                if chunk is None:
                    return
                yield chunk
        finally:
            await consumer.stop()

    async def complete(self, file_id: str) -> bool:
        """Whether every chunk of the file is indexed (read up to the topic's end first if not)."""
        meta = await self.get_meta(f"file:{file_id}")
        if meta is None:
            return False
        if len(self.chunk_index.get(file_id, {})) < meta["chunks"]:
            await self.caught_up()
        return len(self.chunk_index.get(file_id, {})) >= int(meta["chunks"])

    async def _read_chunk(self, consumer: PartitionReader, file_id: str, n: int) -> bytes | None:
        place = self.chunk_index.get(file_id, {}).get(n)
        if place is None:
            return None
        tp = TopicPartition(self.topic, place[0])
        consumer.assign([tp])
        consumer.seek(tp, place[1])
        key = f"file:{file_id}:{n}".encode()
        end = (await consumer.end_offsets([tp]))[tp]
        while await consumer.position(tp) < end:
            for records in (await consumer.fetch([tp], timeout_ms=200)).values():
                for record in records:
                    if record.key == key and record.offset >= place[1]:
                        return record.value or b""
        return None  # compacted away under a newer copy the index has not seen yet

    async def lines(self, file_id: str, skip: int = 0) -> AsyncGenerator[bytes, None]:
        """The file's non-blank lines after the first ``skip`` of them, one chunk in memory at a time."""
        carry = b""
        seen = 0
        async for chunk in self.chunks(file_id):
            parts = (carry + chunk).split(b"\n")
            carry = parts.pop()
            for line in parts:
                if line.strip():
                    if seen >= skip:
                        yield line
                    seen += 1
        if carry.strip() and seen >= skip:
            yield carry


def file_meta(file_id: str, purpose: str, filename: str, size: int, chunks: int) -> JsonDict:
    return {
        "id": file_id,
        "bytes": size,
        "created_at": int(time.time()),
        "filename": filename,
        "object": "file",
        "purpose": purpose,
        "status": "processed",
        "chunks": chunks,
    }
