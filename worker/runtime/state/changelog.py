"""One input partition's changelog in the state topic: the one owner of what the topic holds.

How the state topic is used, from writing to restoring (docs/state.md points here):

* **Records.** Per open request two keys, namespaced by consumer group (``StateKeys``): its
  *context record* (endpoint, inherited fields such as the prompt ids, the request, and the
  progress of its time), written when the request is first committed and again only if a record
  changes that context; and its small *progress record* (last ``seq``, finished choices, one
  ``stream_state`` per choice). Both carry ``offset``, the input offset of the last record they
  reflect. A closed request gets tombstones for both keys at the commit that saw it close.
* **Checkpoints, not a write per commit.** A request touched in a commit interval is *changed*;
  its progress record is written at most every ``--state-checkpoint-interval-ms`` (0: at every
  commit), so with thousands of interleaved streams the state topic grows with the requests, not
  with the records. Context records and tombstones are never deferred: every request open at a
  commit has a checkpoint, and a closed one has none.
* **Restore = last checkpoint + what came after it.** A new owner reads its state partition to
  the end (last value per key, ``state_store``), decodes each request's (context, progress) pair
  (``restore_checkpoints``), then re-reads the input partition from the oldest checkpoint's offset
  up to the committed offset and runs each restored request's later records through the processor
  again without emitting anything (``replay_after``). Derendering is deterministic given the state,
  so this rebuilds exactly the state the last owner committed. Only restored requests' records are
  replayed: a request without a checkpoint had closed (tombstoned), expired, or was refused.
* **Exactly-once.** A commit's state records ride in its transaction: docs/exactly-once.md,
  "Exactly-once, and why this design".

The records' values, their fields and format version, are ``worker.core.state_record``'s; format 1
records (no ``offset``, written at every commit) are read as checkpoints that nothing follows.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from worker.core import state_record
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.request_context import RequestContext
from worker.runtime.kafka_client.base import OutgoingRecord

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
PROGRESS_SUFFIX = b"\xffprogress"
NAMESPACE_END = b"\xfe"
REPLAY_FROM = b"\xffreplay-from"  # the partition's own key, after the namespace


class StateKeys:
    """The state-topic keys of one consumer group's requests: ``group_id`` (UTF-8), byte ``0xfe``
    (never in UTF-8, so the first one ends the namespace), the request id, and for progress records
    the suffix ``0xff progress`` (``0xff`` never occurs in UTF-8 either)."""

    def __init__(self, group_id: str) -> None:
        self.prefix = group_id.encode("utf-8") + NAMESPACE_END

    def context(self, request_id: str) -> bytes:
        return self.prefix + request_id.encode("utf-8")

    def progress(self, request_id: str) -> bytes:
        return self.prefix + request_id.encode("utf-8") + PROGRESS_SUFFIX

    @property
    def replay_from(self) -> bytes:
        return self.prefix + REPLAY_FROM

    def parse(self, key: bytes) -> tuple[str, bool] | None:
        """``(request_id, is_progress)`` for a request's key of this group, ``None`` for any other
        key (another group's, or the partition's ``replay_from``)."""
        if not key.startswith(self.prefix):
            return None
        body = key[len(self.prefix) :]
        if body == REPLAY_FROM:
            return None
        progress = body.endswith(PROGRESS_SUFFIX)
        if progress:
            body = body[: -len(PROGRESS_SUFFIX)]
        return body.decode("utf-8"), progress


# --- the codec --------------------------------------------------------------------------------


def _progress(ctx: RequestContext, offset: int | None) -> JsonDict:
    return state_record.progress_record(
        offset=offset,
        last_seq=ctx.last_seq,
        sequences=ctx.sequences,
        finished=ctx.finished,
        last_choice_index=ctx.last_choice_index,
    )


def encode_context(ctx: RequestContext, offset: int | None = None) -> bytes:
    """The context record: a complete checkpoint, also restorable alone."""
    return orjson.dumps(
        state_record.context_record(ctx.endpoint, ctx.inherited, ctx.request_raw, _progress(ctx, offset))
    )


def encode_progress(ctx: RequestContext, offset: int | None = None) -> bytes:
    return orjson.dumps(_progress(ctx, offset))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A request as its latest state records hold it, and the input offset they reflect."""

    ctx: RequestContext
    offset: int | None  # None: format 1, current as of the committed offset


def decode(derenderer: Derenderer, context: bytes, progress: bytes | None = None) -> Checkpoint:
    """A request's checkpoint from its context record and, when newer, its progress record.

    Each choice's state is read in the form it was stored in (a record of a worker that matched
    another vLLM version included) and written on in ``derenderer``'s."""
    stored = state_record.read_request(context, progress)
    ctx = RequestContext.resume(
        stored.endpoint,
        stored.inherited,
        stored.request,
        last_seq=stored.last_seq,
        sequences=stored.sequences,
        finished=stored.finished,
        last_choice_index=stored.last_choice_index,
        derenderer=derenderer,
    )
    return Checkpoint(ctx, stored.offset)


@dataclass(frozen=True, slots=True)
class Restored:
    checkpoints: dict[str, Checkpoint]
    replay_from: int | None
    """Input records before this offset are all in checkpoints; ``None``: every record is."""


def restore(keys: StateKeys, latest: Mapping[bytes, bytes], derenderer: Derenderer) -> Restored:
    """The checkpoints of one state partition's latest records (``state_store``'s compaction),
    and where the input must be re-read from to bring them up to the committed offset.

    Keys of other groups are ignored. An unreadable record (or a progress record whose context
    record is gone) is logged and dropped: it must not keep the partition from opening, and the
    request's next record then fails with vLLM's "no state" error instead.
    """
    contexts: dict[str, bytes] = {}
    progress: dict[str, bytes] = {}
    for key, value in latest.items():
        parsed = keys.parse(key)
        if parsed is not None:
            (progress if parsed[1] else contexts)[parsed[0]] = value
    for rid in progress.keys() - contexts.keys():
        log.error("dropping the progress record of request %r: its context record is missing", rid)
    out: dict[str, Checkpoint] = {}
    for rid, context in contexts.items():
        try:
            out[rid] = decode(derenderer, context, progress.get(rid))
        except Exception as exc:  # noqa: BLE001 - one bad checkpoint must not keep the partition shut
            log.error("dropping unreadable state of request %r: %r", rid, exc)
    replay_from = None
    marker = latest.get(keys.replay_from)
    if marker is not None:
        try:
            replay_from = state_record.read_replay_from(marker)
        except Exception as exc:  # noqa: BLE001 - then nothing is replayed: the next records fail loudly
            log.error("dropping an unreadable replay-from record: %r", exc)
    return Restored(out, replay_from)


# --- restoring --------------------------------------------------------------------------------


def install(processor: EnvelopeProcessor, checkpoints: Mapping[str, Checkpoint], now: float) -> None:
    """Put restored requests into a fresh processor. ``last_seen`` starts at ``now``: checkpoints
    carry no clock, and the TTL counts from when this owner took over."""
    for rid, checkpoint in checkpoints.items():
        checkpoint.ctx.last_seen = now
        processor.requests[rid] = checkpoint.ctx


def replay_after(
    processor: EnvelopeProcessor, checkpoints: Mapping[str, Checkpoint], records: Iterable[Any]
) -> dict[str, tuple[int, int]]:
    """Run each restored request's input records after its checkpoint through ``processor``,
    emitting nothing; returns the offsets of each replayed request's first and last record.

    ``records``: consumed input records (``key``, ``value``, ``offset``) up to the committed offset.
    """
    replayed: dict[str, tuple[int, int]] = {}
    for record in records:
        if record.key is None or record.value is None:
            continue
        rid = record.key.decode("utf-8", errors="replace")
        checkpoint = checkpoints.get(rid)
        if checkpoint is None or checkpoint.offset is None or record.offset <= checkpoint.offset:
            continue  # another request's, or already in the checkpoint
        processor.process(record.value, record.key)
        replayed[rid] = (replayed.get(rid, (record.offset, 0))[0], record.offset)
    return replayed


# --- writing ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Written:
    """What the topic holds for a request: its context record's context, whether its progress key
    may hold a record, and when its last checkpoint was written."""

    request: Any  # the request object (identity) of the context record
    inherited: JsonDict
    progress: bool
    at: float


class StateChangelog:
    """Tracks one partition's changed requests and turns them into the state records of a commit."""

    def __init__(
        self,
        topic: str,
        partition: int,
        keys: StateKeys,
        *,
        checkpoint_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.keys = keys
        self.interval = checkpoint_interval_s
        self._clock = clock
        self._written: dict[str, _Written] = {}
        # Per request not fully checkpointed: the offsets of its first and last such records.
        self._changed: dict[str, tuple[int, int]] = {}
        self._next_due = math.inf  # when the earliest deferred checkpoint is due
        self._replay_from: int | None = None  # as the topic holds it
        self._replay_from_at = -math.inf

    def restored(self, restored: Restored, replayed: Mapping[str, tuple[int, int]]) -> None:
        """What a restore installed; requests ``replayed`` past their checkpoint (first and last
        offset replayed) are changed."""
        now = self._clock()
        self._replay_from = restored.replay_from
        for rid, checkpoint in restored.checkpoints.items():
            # The progress key is counted in (unknown; a tombstone of a missing key is harmless).
            ctx = checkpoint.ctx
            self._written[rid] = _Written(ctx.request_raw, dict(ctx.inherited), True, now)
        for rid, (first, last) in replayed.items():
            self.changed(rid, first)
            self.changed(rid, last)

    def changed(self, request_id: str, offset: int) -> None:
        """A record at input ``offset`` changed (or closed) the request."""
        known = self._changed.get(request_id)
        self._changed[request_id] = (known[0] if known is not None else offset, offset)
        written = self._written.get(request_id)
        due = written.at + self.interval if written is not None else -math.inf
        self._next_due = min(self._next_due, due)

    @property
    def due(self) -> bool:
        """Whether a deferred checkpoint is due (commit even without new input)."""
        return bool(self._changed) and self._clock() >= self._next_due

    def records(self, requests: Mapping[str, RequestContext]) -> list[OutgoingRecord]:
        """The state records of this commit: for each changed request, its context record if not
        written yet (or changed), its progress record when its checkpoint is due, or tombstones
        for a closed one. Called once per commit; a failed commit drops the whole owned partition."""
        now = self._clock()
        out: list[OutgoingRecord] = []
        next_due = math.inf
        replay_from: int | None = None
        for rid, (first, offset) in list(self._changed.items()):
            ctx = requests.get(rid)
            written = self._written.get(rid)
            if ctx is None:
                if written is not None:
                    out.append(self._record(self.keys.context(rid), None))
                    if written.progress:
                        out.append(self._record(self.keys.progress(rid), None))
                    del self._written[rid]
            elif (
                written is None
                or written.request is not ctx.request_raw
                or written.inherited != ctx.inherited
            ):
                # Complete: supersedes any progress record.
                out.append(self._record(self.keys.context(rid), encode_context(ctx, offset)))
                if written is not None and written.progress:
                    out.append(self._record(self.keys.progress(rid), None))
                self._written[rid] = _Written(ctx.request_raw, dict(ctx.inherited), False, now)
            elif now - written.at >= self.interval:
                out.append(self._record(self.keys.progress(rid), encode_progress(ctx, offset)))
                written.progress, written.at = True, now
            else:
                next_due = min(next_due, written.at + self.interval)
                replay_from = first if replay_from is None else min(replay_from, first)
                continue
            del self._changed[rid]
        self._next_due = next_due
        # Records before the topic's replay-from are all in checkpoints. A later value may wait up
        # to an interval (the old one stays a true, if older, bound: deferred records only get
        # newer); a first deferral, or none left, is written at once.
        if replay_from != self._replay_from and (
            replay_from is None or self._replay_from is None or now - self._replay_from_at >= self.interval
        ):
            marker = orjson.dumps(state_record.replay_from_record(replay_from))
            out.append(self._record(self.keys.replay_from, marker))
            self._replay_from, self._replay_from_at = replay_from, now
        return out

    def _record(self, key: bytes, value: bytes | None) -> OutgoingRecord:
        return OutgoingRecord(self.topic, key, value, self.partition)
