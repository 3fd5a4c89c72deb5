"""Reading the state topic (and, for a restore's replay, the input topic) with a group-less
``read_committed`` consumer, so a restore never sees an aborted (or fenced zombie's) transaction.

What the records mean and how a partition is restored from them: ``state_changelog``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.runtime.state_changelog import StateKeys

RESTORE_TIMEOUT_S = 120.0
_POLL_MS = 200


class StateRestorer:
    """Reads state partitions to their end with a group-less ``read_committed`` consumer."""

    def __init__(
        self,
        bootstrap_servers: str,
        client_id: str,
        state_topic: str,
        security: Mapping[str, Any] | None = None,
        keys: StateKeys | None = None,
    ) -> None:
        self.state_topic = state_topic
        self.keys = keys or StateKeys("")
        options = {
            **(security or {}),
            "bootstrap_servers": bootstrap_servers,
            "client_id": f"{client_id}-restore",
            "group_id": None,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
        }
        self._consumer = AIOKafkaConsumer(**options, isolation_level="read_committed")
        # Only asks for high watermarks: where a restore must read to (see ``restore``).
        self._ends = AIOKafkaConsumer(**options, isolation_level="read_uncommitted")

    async def start(self) -> None:
        await self._consumer.start()
        await self._ends.start()

    async def stop(self) -> None:
        await self._consumer.stop()
        await self._ends.stop()

    async def restore(self, partitions: Iterable[int]) -> dict[int, dict[bytes, bytes]]:
        """Per state partition, the latest value of each of this group's keys (tombstoned keys
        dropped): what the compacted partition holds for the group once compacted."""
        tps = [TopicPartition(self.state_topic, p) for p in sorted(set(partitions))]
        result: dict[int, dict[bytes, bytes]] = {tp.partition: {} for tp in tps}
        if not tps:
            return result
        consumer = self._consumer
        consumer.assign(tps)
        try:
            # The high watermark, not the last stable offset: the owner of these partitions has just
            # run init_transactions, so no transaction of this group is open on them, but another
            # group sharing the topic may have one. Reading (read_committed) up to the high
            # watermark waits for it to end instead of missing this group's records behind it.
            ends: dict[TopicPartition, int] = await self._ends.end_offsets(tps)
            await consumer.seek_to_beginning(*tps)
            deadline = time.monotonic() + RESTORE_TIMEOUT_S
            pending = {tp for tp in tps if ends[tp] > 0}
            prefix = self.keys.prefix
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"state restore of {sorted(p.partition for p in pending)} timed out")
                batches = await consumer.getmany(*pending, timeout_ms=_POLL_MS)
                for tp, records in batches.items():
                    latest = result[tp.partition]
                    for record in records:
                        if record.key is None or not record.key.startswith(prefix):
                            continue  # another group's record
                        if record.value is None:
                            latest.pop(record.key, None)
                        else:
                            latest[record.key] = record.value
                for tp in list(pending):
                    # position() moves past commit markers too, so it reaches the end offset.
                    if await consumer.position(tp) >= ends[tp]:
                        pending.discard(tp)
        finally:
            consumer.assign([])
        return result

    async def read_range(self, topic: str, partition: int, start: int, end: int) -> list[Any]:
        """The committed records of ``topic``/``partition`` in ``[start, end)`` (a restore's replay
        of the input after its checkpoints)."""
        tp = TopicPartition(topic, partition)
        consumer = self._consumer
        consumer.assign([tp])
        out: list[Any] = []
        try:
            consumer.seek(tp, start)
            deadline = time.monotonic() + RESTORE_TIMEOUT_S
            while await consumer.position(tp) < end:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic} partition {partition} [{start}, {end}) timed out")
                batches = await consumer.getmany(tp, timeout_ms=_POLL_MS)
                out.extend(r for r in batches.get(tp, ()) if r.offset < end)
        finally:
            consumer.assign([])
        return out
