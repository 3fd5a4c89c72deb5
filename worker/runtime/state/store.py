"""Reading the state topic (and, for a restore's replay, the input topic) with the client layer's
group-less ``read_committed`` range reader, so a restore never sees an aborted (or fenced
zombie's) transaction, through whichever backend ``--kafka-client`` chose.

What the records mean and how a partition is restored from them: ``state_changelog``.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker.runtime.kafka_client.base import ConsumedRecord, KafkaClient, ReaderConfig, TopicPartition
from worker.runtime.kafka_client.ranges import RANGE_READ_TIMEOUT_S, RangeReader
from worker.runtime.security.kafka_security import KafkaSecurity
from worker.runtime.state.changelog import StateKeys


class StateRestorer:
    """Reads state partitions to their end, and input ranges to replay; ``KafkaReadTimeoutError``
    when one is not read within ``timeout_s``."""

    def __init__(
        self,
        client: KafkaClient,
        bootstrap_servers: str,
        client_id: str,
        state_topic: str,
        keys: StateKeys,
        security: KafkaSecurity | None = None,
        timeout_s: float = RANGE_READ_TIMEOUT_S,
    ) -> None:
        self.state_topic = state_topic
        self.keys = keys
        config = ReaderConfig(bootstrap_servers, f"{client_id}-restore", security or KafkaSecurity())
        self._reader = RangeReader(client, config, timeout_s)

    async def start(self) -> None:
        await self._reader.start()

    async def stop(self) -> None:
        await self._reader.stop()

    async def restore(self, partitions: Iterable[int]) -> dict[int, dict[bytes, bytes]]:
        """Per state partition, the latest value of each of this group's keys (tombstoned keys
        dropped): what the compacted partition holds for the group once compacted."""
        tps = [TopicPartition(self.state_topic, p) for p in sorted(set(partitions))]
        result: dict[int, dict[bytes, bytes]] = {tp.partition: {} for tp in tps}
        if not tps:
            return result
        # The high watermark, not the last stable offset: the owner of these partitions has just
        # run init_transactions, so no transaction of this group is open on them, but another
        # group sharing the topic may have one. Reading (read_committed) up to the high
        # watermark waits for it to end instead of missing this group's records behind it.
        ends = await self._reader.high_watermarks(tps)
        prefix = self.keys.prefix
        async for tp, records in self._reader.read({tp: (None, ends[tp]) for tp in tps}):
            latest = result[tp.partition]
            for record in records:
                if record.key is None or not record.key.startswith(prefix):
                    continue  # another group's record
                if record.value is None:
                    latest.pop(record.key, None)
                else:
                    latest[record.key] = record.value
        return result

    async def read_range(self, topic: str, partition: int, start: int, end: int) -> list[ConsumedRecord]:
        """The committed records of ``topic``/``partition`` in ``[start, end)`` (a restore's replay
        of the input after its checkpoints)."""
        return await self._reader.read_range(TopicPartition(topic, partition), start, end)
