"""The API stores with their topic held in memory: every write is read back at once, in order, through the
store's own ``place``/``take`` (as its reader would read it), so the stores' rules run unchanged."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import cast

from worker.pipeline.apis.batch_store import BatchStore
from worker.pipeline.apis.responses_store import ResponsesStore
from worker.pipeline.connection import Connection

NO_CONNECTION = cast(Connection, None)  # never used: nothing here reaches Kafka


class MemoryBatchStore(BatchStore):
    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        super().__init__(NO_CONNECTION, "batches")
        self.log: list[tuple[str, bytes]] = []  # the topic: every record written, in order
        self.values: dict[str, bytes] = {}  # its latest value of each key (what compaction keeps)
        for file_id, content in (files or {}).items():
            self._upload(file_id, content)

    def _upload(self, file_id: str, content: bytes) -> None:
        self._append(f"file:{file_id}:0", content)
        meta = b'{"id":"%s","bytes":%d,"object":"file","purpose":"batch","chunks":1}' % (
            file_id.encode(),
            len(content),
        )
        self._append(f"file:{file_id}", meta)

    def _append(self, key: str, value: bytes) -> None:
        self.log.append((key, value))
        self.values[key] = value
        self.place(key.encode(), 0, len(self.log) - 1)
        self.take(key.encode(), value)

    async def send(self, key: str, value: bytes) -> None:
        self._append(key, value)

    async def caught_up(self) -> None:
        pass

    async def chunks(self, file_id: str, first: int = 0) -> AsyncGenerator[bytes, None]:
        meta = self.meta.get(f"file:{file_id}")
        for n in range(first, meta["chunks"] if meta else 0):
            place = self.chunk_index.get(file_id, {}).get(n)
            if place is None:
                return
            yield self.log[place[1]][1]  # read where the index says it is


class MemoryResponsesStore(ResponsesStore):
    def __init__(self, max_bytes: int = 1 << 30) -> None:
        super().__init__(NO_CONNECTION, "responses", max_bytes)

    async def send(self, key: str, value: bytes) -> None:
        self.take(key.encode(), value)

    async def caught_up(self) -> None:
        pass
