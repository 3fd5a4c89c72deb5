"""One owned input partition: its processor, its sink and its not-yet-committed work.

State updates are batched per commit like Kafka Streams' record cache: a request touched
by several records in one commit interval gets one state record (its latest), a request that
opens and closes within one interval never reaches the state topic, and tombstones are
written only for a request whose state was written before (``persisted``).

The first state record of a request is its full context record (key ``request_id``); later
commits write only its small progress record (``StateKeys.progress``), unless
a record changed the context (new inherited fields or request), which rewrites the context
record and tombstones the progress key. See ``state_store`` for the two kinds.

Each record is also counted by the partition's dead-letter breaker (``dead_letter_policy``): a
record that trips it sets ``trip``, and the worker pauses the partition. The open requests' state
bytes (``sizes``) are added to the worker's ``MemoryBudget``; at a cap, a record that would open a
new request gets a 503 error output instead of being processed (``memory``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka import TopicPartition

from worker.core.envelope_processor import DeadLetter, EnvelopeProcessor, ProcessResult
from worker.runtime import metrics_names as m
from worker.runtime.config import DEFAULT_GROUP_ID, TopicNames
from worker.runtime.dead_letter_policy import DeadLetterLimits, DeadLetterPolicy, Trip
from worker.runtime.delivery import Sink
from worker.runtime.memory import (
    LiveEstimator,
    MemoryBudget,
    closed_live_bytes,
    new_stream_request,
    refusal_output,
)
from worker.runtime.metrics import Metrics
from worker.runtime.observer import NO_OBSERVER, RecordObserver
from worker.runtime.poison import ResetTracker
from worker.runtime.prometheus_export import labelled
from worker.runtime.records import OutgoingRecord, records_for, source_of
from worker.runtime.state_store import StateKeys, encode_progress, encode_snapshot
from worker.runtime.tracing import Headers, propagated

log = logging.getLogger(__name__)

# A dead letter that any dead-letter topic takes (the broker's default max.message.bytes is 1 MiB).
_FALLBACK_DEAD_LETTER = 256 * 1024


class PartitionTask:
    def __init__(
        self,
        tp: TopicPartition,
        processor: EnvelopeProcessor,
        sink: Sink,
        topics: TopicNames,
        metrics: Metrics,
        *,
        position: int,
        persisted: set[str],
        epoch: int = 0,
        dead_letters: DeadLetterPolicy | None = None,
        budget: MemoryBudget | None = None,
        resets: ResetTracker | None = None,
        keys: StateKeys | None = None,
        observer: RecordObserver = NO_OBSERVER,
    ) -> None:
        self.tp = tp
        self.epoch = epoch  # the worker's open counter when this task was made
        self.processor = processor
        self.sink = sink
        self.topics = topics
        self.metrics = metrics
        self.position = position  # next input offset to process
        self.committed_position = position
        self.persisted = persisted  # request ids with a live snapshot in the state topic
        self.dirty: set[str] = set()
        self.uncommitted_records = 0
        self.has_pending_output = False
        self.oldest_timestamp_ms: int | None = None  # create time of the first uncommitted input
        self.dead_letters = dead_letters or DeadLetterPolicy(DeadLetterLimits(None, max_consecutive=None))
        self.trip: Trip | None = None  # set by the record that tripped this partition's breaker
        self.budget = budget or MemoryBudget()
        self.resets = resets or ResetTracker()  # the worker's: it outlives this task
        self.keys = keys or StateKeys(DEFAULT_GROUP_ID)
        self.observer = observer  # trace context, spans, GenAI metrics
        # Estimated live bytes per open request, as added to the budget (see ``memory``).
        self.sizes: dict[str, int] = {}
        self._estimator = LiveEstimator()
        self._closed_bytes = 0  # the processor's closed-request memory, as added to the budget
        # The context of each request's live context record in the state topic (its request object
        # and inherited fields, compared at commit).
        self._contexts: dict[str, tuple[Any, dict[str, Any]]] = {}
        # Requests whose progress key may hold a live record. Restored ones are counted in (unknown,
        # and a tombstone of a key that was never written is harmless).
        self._progress: set[str] = set(persisted)
        for rid, ctx in processor.requests.items():
            self._track(rid)
            if rid in persisted:  # restored from its context record: it matches that record
                self._contexts[rid] = (ctx.request_raw, dict(ctx.inherited))
        self._produced_keys: dict[str, str] = {}

    @property
    def needs_commit(self) -> bool:
        return self.position != self.committed_position or self.has_pending_output or bool(self.dirty)

    async def handle(self, record: Any) -> None:
        """Process one consumed record (``aiokafka.ConsumerRecord``) and send what it yields."""
        if record.offset < self.position:
            # Fetched before this partition was reset/re-opened: already processed and committed.
            self.metrics.increment(m.RECORDS_SKIPPED_STALE)
            return
        value: bytes = record.value if record.value is not None else b""
        self.metrics.timing(m.RECORD_AGE_MS, max(0.0, time.time() * 1000 - record.timestamp))
        source = source_of(record)
        skip = self.resets.skip(self.tp.partition, record.offset)
        result: ProcessResult | None
        if skip is not None:  # a poison record that kept resetting the partition (``poison``)
            limit = _FALLBACK_DEAD_LETTER if skip.cut else None
            letter = DeadLetter(skip.reason, value, record.key)
            result = self.processor.dead_letter_result(letter, record.headers, source, max_bytes=limit)
        else:
            result = self._refused(value, record.key, source)
        if result is None:
            started = time.perf_counter()
            result = self.processor.process(value, record.key, source=source, headers=record.headers)
            self.metrics.timing(m.DERENDER_MS, (time.perf_counter() - started) * 1000)
            if result.internal_error is not None:
                log.error(
                    "processing %s offset %d failed", self.tp, record.offset, exc_info=result.internal_error
                )
                self.metrics.increment(m.PROCESS_ERRORS)
            if result.request_id is not None:
                self._track(result.request_id)
        headers = record.headers if self.observer.propagate else None
        trace = self._observed(self.observer.observe, record, result, fallback=headers)
        reason = result.dead_letter.reason if result.dead_letter is not None else None
        # The core caps every payload below the producer's max_request_size, so the producer's own
        # size check cannot fire; a topic that refuses a record does so at commit (see ``poison``).
        await self._emit(result, trace)
        if skip is not None:  # counted once it is out: a failed attempt is retried
            self.metrics.increment(m.RECORDS_POISON_SKIPPED)
        # Duplicates and error outputs count as valid: only dead letters feed the breaker. A range
        # replayed after a reset was observed already, bar its poison skip.
        if skip is not None or not self.resets.replayed(self.tp.partition, record.offset):
            trip = self.dead_letters.observe(self.tp.partition, reason, record.offset)
            if trip is not None:
                self.trip = trip
        self.position = record.offset + 1
        self.uncommitted_records += 1
        if self.oldest_timestamp_ms is None:
            self.oldest_timestamp_ms = record.timestamp
        self.metrics.increment(m.RECORDS_CONSUMED)

    def _refused(self, value: bytes, key: bytes | None, source: dict[str, Any]) -> ProcessResult | None:
        """A 503 error output instead of processing, when the record would open a request past a cap."""
        refusal = self.budget.refusal(len(value))
        if refusal is None:
            return None
        envelope = new_stream_request(value, key, self.processor)
        if envelope is None:
            return None  # an open request's record, a one-shot, or something the processor rejects
        self.metrics.increment(labelled(m.REQUESTS_REJECTED, cap=refusal.cap))
        return self.processor.output_result(
            envelope.request_id, refusal_output(envelope, refusal), source=source
        )

    def _track(self, rid: str) -> None:
        """Keep ``sizes`` and the budget in step with ``rid``'s live bytes after a record."""
        old = self.sizes.get(rid)
        ctx = self.processor.requests.get(rid)
        if ctx is not None:
            size = self._estimator.estimate(rid, ctx)
            self.sizes[rid] = size
            if old is None:
                self.budget.add(size)
            else:
                self.budget.resize(old, size)
        elif old is not None:
            del self.sizes[rid]
            self._estimator.forget(rid)
            self.budget.remove(old)
        closed = closed_live_bytes(self.processor)
        if closed != self._closed_bytes:
            self.budget.resize_closed(self._closed_bytes, closed)
            self._closed_bytes = closed

    def release(self) -> None:
        """The task is dropped (revoke, reset, shutdown): its requests leave the budget."""
        for size in self.sizes.values():
            self.budget.remove(size)
        self.sizes.clear()
        self.budget.resize_closed(self._closed_bytes, 0)
        self._closed_bytes = 0

    async def expire(self, ttl_seconds: float) -> int:
        results = self.processor.expire_idle(ttl_seconds)
        for result in results:
            if result.request_id is not None:
                self._track(result.request_id)
            await self._emit(result, self._observed(self.observer.expired, result))
        self.metrics.increment(m.REQUESTS_EXPIRED, len(results))
        return len(results)

    def _observed(self, observe: Callable[..., Headers], *args: Any, fallback: Any = None) -> Headers:
        """``observe(*args)``'s trace headers; should it fail, the record's propagated ones (or none).

        Observability must never stop a partition: a failure here would fail every retry too.
        """
        try:
            return observe(*args)
        except Exception:
            log.exception("observing a record of %s failed; it continues unobserved", self.tp)
            self.metrics.increment(m.OBSERVER_ERRORS)
        try:
            return propagated(fallback) if fallback is not None else ()
        except Exception:  # noqa: BLE001 - observability must never stop a partition
            return ()

    async def _emit(self, result: ProcessResult, trace: tuple[tuple[str, bytes], ...] = ()) -> None:
        if result.duplicate:
            self.metrics.increment(m.RECORDS_DUPLICATE)
            return
        if result.dead_letter is not None:
            self.metrics.increment(m.RECORDS_DEAD_LETTERED)
        for out in records_for(result, self.topics, trace):
            await self.sink.send(out)
            self.has_pending_output = True
            self.metrics.increment(self._produced_key(out.topic))
        if result.output is not None:
            self.metrics.increment(m.OUTPUTS_PRODUCED)
            if result.sequence_gap:
                self.metrics.increment(m.SEQUENCE_GAPS)
        if result.request_id is not None and result.output is not None:
            self.dirty.add(result.request_id)
        if result.closed:
            self.metrics.increment(m.REQUESTS_CLOSED)

    def _produced_key(self, topic: str) -> str:
        key = self._produced_keys.get(topic)
        if key is None:
            key = self._produced_keys[topic] = labelled(m.RECORDS_PRODUCED, topic=topic)
        return key

    def state_records(self) -> list[OutgoingRecord]:
        """The state records of every request touched since the last commit: its context record if
        not written yet (or changed), else its progress record; tombstones for a finished one."""
        out = []
        requests = self.processor.requests
        partition = self.tp.partition
        state = self.topics.state
        for rid in self.dirty:
            key = self.keys.context(rid)
            ctx = requests.get(rid)
            if ctx is not None:
                written = self._contexts.get(rid)
                if written is None or written[0] is not ctx.request_raw or written[1] != ctx.inherited:
                    snapshot = encode_snapshot(ctx)  # complete: supersedes any progress record
                    out.append(OutgoingRecord(state, key, snapshot, partition))
                    if rid in self._progress:
                        out.append(OutgoingRecord(state, self.keys.progress(rid), None, partition))
                        self._progress.discard(rid)
                    self._contexts[rid] = (ctx.request_raw, dict(ctx.inherited))
                else:
                    progress = encode_progress(ctx)
                    out.append(OutgoingRecord(state, self.keys.progress(rid), progress, partition))
                    self._progress.add(rid)
                self.persisted.add(rid)
            else:
                if rid in self.persisted:
                    out.append(OutgoingRecord(state, key, None, partition))
                    self.persisted.discard(rid)
                if rid in self._progress:
                    out.append(OutgoingRecord(state, self.keys.progress(rid), None, partition))
                    self._progress.discard(rid)
                self._contexts.pop(rid, None)
        return out

    async def commit(self) -> None:
        """Commit outputs, state and the input position together (one transaction in EOS mode)."""
        started = time.perf_counter()
        state = self.state_records()
        snapshots = sum(1 for r in state if r.value is not None)
        await self.sink.commit(state, {self.tp: self.position})
        if state:
            self.metrics.increment(self._produced_key(self.topics.state), len(state))
            self.metrics.increment(m.STATE_BYTES_WRITTEN, sum(len(r.value) for r in state if r.value))
        self.metrics.increment(m.STATE_SNAPSHOTS_WRITTEN, snapshots)
        self.metrics.increment(m.STATE_TOMBSTONES_WRITTEN, len(state) - snapshots)
        self.metrics.increment(m.COMMITS)
        self.metrics.timing(m.COMMIT_MS, (time.perf_counter() - started) * 1000)
        if self.oldest_timestamp_ms is not None:
            # Input create time to committed output: the worker's share of end-to-end latency.
            self.metrics.timing(m.COMMIT_LAG_MS, time.time() * 1000 - self.oldest_timestamp_ms)
            self.oldest_timestamp_ms = None
        self.committed_position = self.position
        self.dirty.clear()
        self.uncommitted_records = 0
        self.has_pending_output = False
