"""The compacted state topic: per-request snapshots keyed by ``request_id``.

Layout: the state of input partition ``p`` lives in state partition ``p`` (written with an
explicit partition), so a new owner of ``p`` restores by reading one state partition from
the beginning to its end: the last value per key wins, a tombstone deletes the key.
Reads use ``read_committed``, so a restore never sees the snapshots of an aborted (or
fenced zombie's) transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.core.envelope_processor import EnvelopeProcessor, RequestContext

log = logging.getLogger(__name__)

RESTORE_TIMEOUT_S = 120.0
_POLL_MS = 200


def encode_snapshot(ctx: RequestContext) -> bytes:
    return orjson.dumps(ctx.to_snapshot())


def install_snapshots(processor: EnvelopeProcessor, snapshots: dict[str, bytes], now: float) -> int:
    """Put restored requests into a fresh processor; returns how many were readable.

    ``last_seen`` starts at ``now``: snapshots do not carry a clock, and the TTL should
    count from when this owner took over.
    """
    restored = 0
    for rid, value in snapshots.items():
        try:
            ctx = RequestContext.from_snapshot(orjson.loads(value))
        except Exception as exc:
            # One unreadable snapshot must not keep the partition from opening; the request's
            # next record then fails with vLLM's "no state" error instead.
            log.error("dropping unreadable state snapshot of request %r: %r", rid, exc)
            continue
        ctx.last_seen = now
        processor.requests[rid] = ctx
        restored += 1
    return restored


class StateRestorer:
    """Reads state partitions to their end with a group-less ``read_committed`` consumer."""

    def __init__(
        self,
        bootstrap_servers: str,
        client_id: str,
        state_topic: str,
        security: Mapping[str, Any] | None = None,
    ) -> None:
        self.state_topic = state_topic
        self._consumer = AIOKafkaConsumer(
            **(security or {}),
            bootstrap_servers=bootstrap_servers,
            client_id=f"{client_id}-restore",
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
        )

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def restore(self, partitions: Iterable[int]) -> dict[int, dict[str, bytes]]:
        """The latest snapshot per request for each state partition (tombstoned keys dropped)."""
        tps = [TopicPartition(self.state_topic, p) for p in sorted(set(partitions))]
        result: dict[int, dict[str, bytes]] = {tp.partition: {} for tp in tps}
        if not tps:
            return result
        consumer = self._consumer
        consumer.assign(tps)
        try:
            # The owner of these partitions has just run init_transactions, so no transaction of a
            # previous owner is still open: the last stable offset is the true end.
            ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
            await consumer.seek_to_beginning(*tps)
            deadline = time.monotonic() + RESTORE_TIMEOUT_S
            pending = {tp for tp in tps if ends[tp] > 0}
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"state restore of {sorted(p.partition for p in pending)} timed out")
                batches = await consumer.getmany(*pending, timeout_ms=_POLL_MS)
                for tp, records in batches.items():
                    latest = result[tp.partition]
                    for record in records:
                        if record.key is None:
                            continue
                        rid = record.key.decode("utf-8")
                        if record.value is None:
                            latest.pop(rid, None)
                        else:
                            latest[rid] = record.value
                for tp in list(pending):
                    # position() moves past commit markers too, so it reaches the end offset.
                    if await consumer.position(tp) >= ends[tp]:
                        pending.discard(tp)
        finally:
            consumer.assign([])
        return result
