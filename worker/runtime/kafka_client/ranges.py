"""The one group-less reader of offset ranges: ``[start, end)`` of explicit partitions, through
either backend's ``PartitionReader``, ``read_committed`` (an aborted or fenced zombie's
transaction is never seen), within a deadline.

A range ends when the reader's position reaches ``end``, not at the last record seen: the
position moves past transaction markers and aborted records, which are never returned.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence

from worker.errors import KafkaReadTimeoutError
from worker.runtime.kafka_client.base import (
    ConsumedRecord,
    KafkaClient,
    PartitionReader,
    ReaderConfig,
    TopicPartition,
)

RANGE_READ_TIMEOUT_S = 120.0
POLL_MS = 200

# Where a range starts: an offset, or ``None`` for the partition's first (log start) offset.
Ranges = Mapping[TopicPartition, tuple[int | None, int]]


class RangeReader:
    """Reads whole ranges; one range read at a time (the reader's assignment is the range's)."""

    def __init__(
        self, client: KafkaClient, config: ReaderConfig, timeout_s: float = RANGE_READ_TIMEOUT_S
    ) -> None:
        self._records: PartitionReader = client.reader(config)
        # Only asks for high watermarks (``high_watermarks``).
        self._ends: PartitionReader = client.reader(
            ReaderConfig(
                config.bootstrap_servers, f"{config.client_id}-ends", config.security, read_committed=False
            )
        )
        self.timeout_s = timeout_s

    async def start(self) -> None:
        await self._records.start()
        await self._ends.start()

    async def stop(self) -> None:
        try:
            await self._records.stop()
        finally:
            await self._ends.stop()

    async def high_watermarks(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's high watermark: past open transactions too, unlike a ``read_committed``
        reader's end offsets (the last stable offsets)."""
        return await self._ends.end_offsets(tps)

    async def read(self, ranges: Ranges) -> AsyncIterator[tuple[TopicPartition, list[ConsumedRecord]]]:
        """The committed records of each range, batch by batch, each partition's in offset order;
        ``KafkaReadTimeoutError`` when the ranges are not all read within ``timeout_s``."""
        pending = {tp: end for tp, (start, end) in ranges.items() if end > (start or 0)}
        if not pending:
            return
        reader = self._records
        reader.assign(list(pending))
        try:
            firsts = [tp for tp, (start, _end) in ranges.items() if tp in pending and start is None]
            starts = await reader.beginning_offsets(firsts) if firsts else {}
            for tp in pending:
                start = ranges[tp][0]
                reader.seek(tp, starts[tp] if start is None else start)
            deadline = time.monotonic() + self.timeout_s
            while pending:
                if time.monotonic() > deadline:
                    described = ", ".join(
                        f"{tp.topic}[{tp.partition}] to {end}" for tp, end in sorted(pending.items())
                    )
                    raise KafkaReadTimeoutError(
                        f"reading {described} took longer than {self.timeout_s:.0f} s"
                    )
                batches = await reader.fetch(list(pending), POLL_MS)
                for tp, records in batches.items():
                    end = pending.get(tp)
                    if end is None:
                        continue
                    wanted = [r for r in records if r.offset < end]
                    if wanted:
                        yield tp, wanted
                for tp in list(pending):
                    if await reader.position(tp) >= pending[tp]:
                        del pending[tp]
        finally:
            reader.assign([])

    async def read_range(self, tp: TopicPartition, start: int, end: int) -> list[ConsumedRecord]:
        """The committed records of ``tp`` in ``[start, end)``."""
        out: list[ConsumedRecord] = []
        async for _tp, records in self.read({tp: (start, end)}):
            out.extend(records)
        return out
