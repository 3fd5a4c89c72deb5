"""Opening assigned input partitions: the whole restore sequence in one place.

For a set of partitions: start their sinks (``init_transactions`` fences a previous owner), read
the state partition's latest records, find each committed input offset, rebuild the open requests
from the checkpoints, re-read the inputs after the last checkpoint, and hand back ready
``OwnedPartition`` tasks positioned at the committed offset.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from worker.errors import PartitionNotAssignedError
from worker.runtime.composition import WorkerParts, owned_partition
from worker.runtime.delivery import Sink
from worker.runtime.kafka_client.base import TopicPartition
from worker.runtime.partition import OwnedPartition
from worker.runtime.state import changelog as state_changelog
from worker.runtime.state.store import StateRestorer
from worker.settings import KafkaSettings

log = logging.getLogger(__name__)


@dataclass
class Opened:
    """What one ``open`` gave: the tasks, and what did not open."""

    tasks: dict[TopicPartition, OwnedPartition] = field(default_factory=dict)
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    dropped: set[TopicPartition] = field(default_factory=set)  # unassigned while opening
    restored_requests: int = 0
    replayed_records: int = 0


class PartitionOpener:
    """Builds the tasks of newly assigned partitions from committed offsets and the state topic."""

    def __init__(self, settings: KafkaSettings, parts: WorkerParts, restorer: StateRestorer) -> None:
        self.settings = settings
        self.parts = parts
        self.restorer = restorer

    async def open(
        self,
        tps: Iterable[TopicPartition],
        consumer: Any,
        new_sink: Callable[[TopicPartition], Sink],
        next_epoch: Callable[[], int],
    ) -> Opened:
        """Open ``tps``; raises (with every sink it started closed) when any step fails, to be retried.

        ``next_epoch`` is called once the restore is read, right before the seeks: records of a poll
        that started earlier carry an older epoch and are fetched again (see ``Worker._step``).
        """
        wanted = sorted(tps)
        sinks: dict[TopicPartition, Sink] = {}
        try:
            for tp in wanted:
                sinks[tp] = new_sink(tp)
            # init_transactions: aborts whatever a previous owner left open, so the committed
            # offsets and the state partition's end are stable from here on.
            await asyncio.gather(*(sink.start() for sink in sinks.values()))
            latest = await self.restorer.restore(tp.partition for tp in wanted)
            positions: dict[TopicPartition, int] = {}
            restores: dict[TopicPartition, state_changelog.Restored] = {}
            replays: dict[TopicPartition, list[Any]] = {}
            for tp in wanted:
                committed = await consumer.committed(tp)
                if committed is None:
                    committed = await consumer.beginning_offset(tp)
                positions[tp] = committed
                restored = state_changelog.restore(
                    self.parts.keys, latest[tp.partition], self.parts.derenderer
                )
                restores[tp] = restored
                start = restores[tp].replay_from
                if start is not None and start < committed:
                    replays[tp] = await self.restorer.read_range(tp.topic, tp.partition, start, committed)
        except Exception:
            for sink in sinks.values():
                await sink.close()
            raise
        opened = Opened(positions=positions)
        now = time.monotonic()
        epoch = next_epoch()
        for tp in wanted:
            try:
                # The group may have started taking partitions away while we awaited above.
                consumer.seek(tp, positions[tp])
            except PartitionNotAssignedError:
                log.info("partition %d was unassigned while opening; dropped", tp.partition)
                opened.dropped.add(tp)
                await sinks[tp].close()
                continue
            replay = replays.get(tp, [])
            opened.tasks[tp] = owned_partition(
                self.settings, self.parts, tp, sinks[tp], positions[tp], restores[tp], replay, now, epoch
            )
            opened.restored_requests += len(restores[tp].checkpoints)
            opened.replayed_records += len(replays.get(tp, []))
        return opened
