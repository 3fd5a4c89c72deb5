"""The compacted state topic: per-request snapshots, two kinds of records per request.

Keys are namespaced by consumer group (``StateKeys``): ``group_id`` (UTF-8), byte ``0xfe``, then
the request's own key below. So two groups that share a state topic (a blue/green pair, a
shadow deployment, a copy-pasted configuration) each restore only their own records, and one
group's tombstones cannot delete the other's snapshots. ``0xfe`` never occurs in UTF-8, so the
first one in a key ends its namespace. Sharing still costs each group the reading of the
other's records at a restore, and a restore waits for the other group's open transactions on
the partition (milliseconds; at most the transaction timeout), so a topic per group is cheaper.

* key ``request_id`` (UTF-8): the request's **context record** (``RequestContext.to_snapshot``,
  ``kind: context``): endpoint, inherited fields (model, prompt ids), the request
  (messages, tools) *and* its progress at the time. Written once, when the request is first
  persisted, and again only if a later record changes the context (a tombstone of the progress
  key goes with it then).
* key ``request_id`` + ``PROGRESS_SUFFIX``: its **progress record** (``progress_snapshot``,
  ``kind: progress``): last seq, finished choices, last choice index, one stream state per
  choice; written at every later commit that touched the request, superseding the progress
  inside the context record. The suffix starts with byte ``0xff``, which never occurs in
  UTF-8, so no request id's key can end with it (a request id may contain any character,
  NUL included).

So the big, unchanging context is written once per request, not at every commit. Both kinds go
in the same transaction as the outputs and the input offset; a finished request gets a tombstone
for each key it wrote. A restore merges them: a progress record without a context record is
unreadable (logged and dropped), a context record alone is a complete snapshot.

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


PROGRESS_SUFFIX = b"\xffprogress"
NAMESPACE_END = b"\xfe"


class StateKeys:
    """The state-topic keys of one consumer group's requests."""

    def __init__(self, group_id: str) -> None:
        self.prefix = group_id.encode("utf-8") + NAMESPACE_END

    def context(self, request_id: str) -> bytes:
        return self.prefix + request_id.encode("utf-8")

    def progress(self, request_id: str) -> bytes:
        return self.prefix + request_id.encode("utf-8") + PROGRESS_SUFFIX

    def parse(self, key: bytes) -> tuple[str, bool] | None:
        """``(request_id, is_progress)`` for a key of this group, ``None`` for any other key."""
        if not key.startswith(self.prefix):
            return None
        body = key[len(self.prefix) :]
        progress = body.endswith(PROGRESS_SUFFIX)
        if progress:
            body = body[: -len(PROGRESS_SUFFIX)]
        return body.decode("utf-8"), progress


def encode_snapshot(ctx: RequestContext) -> bytes:
    """The context record: a complete snapshot, also restorable alone."""
    return orjson.dumps(ctx.to_snapshot())


def encode_progress(ctx: RequestContext) -> bytes:
    return orjson.dumps(ctx.progress_snapshot())


def merge_records(contexts: Mapping[str, bytes], progress: Mapping[str, bytes]) -> dict[str, bytes]:
    """One restorable snapshot per request from the latest records of both kinds.

    A context record with a progress record becomes ``{"v": 1, "context": ..., "progress": ...}``
    (spliced, not re-parsed); alone it is returned as is. A progress record alone is returned as
    is too: ``install_snapshots`` then logs and drops it as unreadable.
    """
    merged = dict(progress)
    for rid, context in contexts.items():
        latest = progress.get(rid)
        if latest is None:
            merged[rid] = context
        else:
            merged[rid] = b'{"v":1,"context":' + context + b',"progress":' + latest + b"}"
    return merged


def install_snapshots(processor: EnvelopeProcessor, snapshots: dict[str, bytes], now: float) -> int:
    """Put restored requests into a fresh processor; returns how many were readable.

    ``last_seen`` starts at ``now``: snapshots do not carry a clock, and the TTL should
    count from when this owner took over.
    """
    restored = 0
    for rid, value in snapshots.items():
        try:
            ctx = RequestContext.from_snapshot(orjson.loads(value))
        except Exception as exc:  # noqa: BLE001 - one bad snapshot must not keep the partition shut
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

    async def restore(self, partitions: Iterable[int]) -> dict[int, dict[str, bytes]]:
        """The latest snapshot per request for each state partition (tombstoned keys dropped),
        both kinds merged (``merge_records``)."""
        tps = [TopicPartition(self.state_topic, p) for p in sorted(set(partitions))]
        result: dict[int, dict[str, bytes]] = {tp.partition: {} for tp in tps}
        if not tps:
            return result
        # Per partition: the latest context records and the latest progress records.
        latest: dict[int, tuple[dict[str, bytes], dict[str, bytes]]] = {tp.partition: ({}, {}) for tp in tps}
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
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"state restore of {sorted(p.partition for p in pending)} timed out")
                batches = await consumer.getmany(*pending, timeout_ms=_POLL_MS)
                for tp, records in batches.items():
                    contexts, progress = latest[tp.partition]
                    for record in records:
                        parsed = self.keys.parse(record.key) if record.key is not None else None
                        if parsed is None:
                            continue  # another group's record
                        rid, is_progress = parsed
                        kind = progress if is_progress else contexts
                        if record.value is None:
                            kind.pop(rid, None)
                        else:
                            kind[rid] = record.value
                for tp in list(pending):
                    # position() moves past commit markers too, so it reaches the end offset.
                    if await consumer.position(tp) >= ends[tp]:
                        pending.discard(tp)
        finally:
            consumer.assign([])
        for partition, (contexts, progress) in latest.items():
            result[partition] = merge_records(contexts, progress)
        return result
