"""A group-less reader of a changing set of partitions of one topic, ``read_committed``.

The gateway reads its replies with it (``worker.pipeline.gateway_routing``): partitions are added
and removed while it reads, and each added partition is read from where it was asked to start,
the others keeping their positions. ``follow`` returns once the reader's position on every asked
partition is fixed at or below its end at the time of the call, so a record written after ``follow``
returned is read.

One task reads (``fetch``); the others only ask (``follow``, ``unfollow``). The changes are made by
the reading task between two fetches, and a fetch waiting for records is woken for them, so the
underlying client is never used from two tasks at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from worker.runtime.kafka_client.base import (
    ConsumedRecord,
    KafkaClient,
    PartitionReader,
    ReaderConfig,
    TopicPartition,
)

log = logging.getLogger(__name__)

# Where a followed partition is read from: its end (the last stable offset: what comes after), its
# beginning, or the first record at or after a time (ms since the epoch; the end when there is none).
END = "end"
BEGINNING = "beginning"
Start = str | int


@dataclass(slots=True)
class _Ask:
    start: Start
    done: asyncio.Future[None]


class PartitionFollower:
    def __init__(self, client: KafkaClient, config: ReaderConfig, topic: str) -> None:
        self.topic = topic
        self._reader: PartitionReader = client.reader(config)
        self._followed: set[int] = set()
        self._asks: dict[int, list[_Ask]] = {}
        self._drops: set[int] = set()
        self._changed = asyncio.Event()

    @property
    def followed(self) -> frozenset[int]:
        """The partitions read now (a partition asked for is in it once its ``follow`` returned)."""
        return frozenset(self._followed)

    async def start(self) -> None:
        await self._reader.start()

    async def stop(self) -> None:
        for asks in self._asks.values():
            for ask in asks:
                if not ask.done.done():
                    ask.done.set_exception(ConnectionError("the reader stopped"))
        self._asks.clear()
        await self._reader.stop()

    async def follow(self, partitions: Iterable[int], start: Start = END) -> None:
        """Read ``partitions`` too; those not read yet from ``start``. Returns once they are read."""
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[None]] = []
        for p in partitions:
            self._drops.discard(p)
            if p in self._followed and start == END:
                continue  # read already, at or below its end
            ask = _Ask(start, loop.create_future())
            self._asks.setdefault(p, []).append(ask)
            waits.append(ask.done)
        if waits:
            self._changed.set()
            await asyncio.gather(*waits)

    def unfollow(self, partitions: Iterable[int]) -> None:
        """Stop reading ``partitions`` (at the next fetch); a later ``follow`` starts them afresh."""
        dropped = set(partitions) & self._followed
        if dropped:
            self._drops |= dropped
            self._changed.set()

    async def fetch(self, timeout_ms: int) -> list[ConsumedRecord]:
        """The next records of the followed partitions (each partition's in offset order), after the
        changes asked for so far are made; returns early, maybe empty, when a change is asked."""
        await self._apply()
        if not self._followed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_ms / 1000):
                    await self._changed.wait()
            return []
        tps = [TopicPartition(self.topic, p) for p in sorted(self._followed)]
        fetching = asyncio.ensure_future(self._reader.fetch(tps, timeout_ms))
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait([fetching, changed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            if not fetching.done():
                fetching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await fetching
        if fetching.cancelled():
            return []
        batches = fetching.result()
        out: list[ConsumedRecord] = []
        for tp, records in batches.items():
            if tp.partition in self._followed:
                out.extend(records)
        return out

    async def _apply(self) -> None:
        self._changed.clear()
        if not self._asks and not self._drops:
            return
        asks, self._asks = self._asks, {}
        drops, self._drops = self._drops, set()
        try:
            await self._reassign(asks, drops)
        except BaseException as exc:
            for waiting in asks.values():
                for ask in waiting:
                    if not ask.done.done():
                        ask.done.set_exception(exc if isinstance(exc, Exception) else ConnectionError())
            raise
        for waiting in asks.values():
            for ask in waiting:
                if not ask.done.done():
                    ask.done.set_result(None)

    async def _reassign(self, asks: dict[int, list[_Ask]], drops: set[int]) -> None:
        reader = self._reader
        kept = self._followed - drops - set(asks)
        positions = {p: await reader.position(TopicPartition(self.topic, p)) for p in kept}
        starts = await self._starts(asks)
        followed = kept | set(starts)
        reader.assign([TopicPartition(self.topic, p) for p in sorted(followed)])
        for p, offset in {**positions, **starts}.items():
            reader.seek(TopicPartition(self.topic, p), offset)
        self._followed = followed

    async def _starts(self, asks: dict[int, list[_Ask]]) -> dict[int, int]:
        """Each asked partition's first offset to read: the lowest its asks need, and never past the
        position it is read from already (a partition asked from its end that is read stays put)."""
        reader = self._reader
        tps = [TopicPartition(self.topic, p) for p in asks]
        ends = await reader.end_offsets(tps)
        starts: dict[int, int] = {}
        for tp in tps:
            p = tp.partition
            wanted = [ends[tp]]
            for ask in asks[p]:
                if ask.start == BEGINNING:
                    wanted.append((await reader.beginning_offsets([tp]))[tp])
                elif isinstance(ask.start, int):
                    found = (await reader.offsets_for_time([tp], ask.start))[tp]
                    if found is not None:
                        wanted.append(found)
            if p in self._followed:  # read already: from its position unless an ask needs earlier
                wanted.append(await reader.position(tp))
            starts[p] = min(wanted)
        return starts
