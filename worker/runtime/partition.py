"""One owned input partition: consume, emit, commit.

A record goes through the core's processor (which also admits new requests against the worker's
``MemoryBudget``), its output or dead letter to the sink, and the request it changed to the
partition's ``StateChangelog``, which decides the state records of each commit (the state design
is explained there). Each record is also counted by the partition's dead-letter breaker
(``dead_letter_policy``): a record that trips it sets ``trip``, and the worker pauses the partition.
The open requests' live bytes (``sizes``) are added to the worker's ``MemoryBudget``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from worker.core.envelope_processor import DeadLetter, EnvelopeProcessor, ProcessResult
from worker.runtime.dead_letters.poison import ResetTracker
from worker.runtime.dead_letters.policy import DeadLetterLimits, DeadLetterPolicy, Trip
from worker.runtime.delivery import Sink
from worker.runtime.kafka_client.base import ConsumedRecord, OutgoingRecord, TopicPartition
from worker.runtime.memory import MemoryBudget
from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.metrics import Metrics
from worker.runtime.observability.observer import NO_OBSERVER, RecordObserver
from worker.runtime.observability.prometheus_export import labelled
from worker.runtime.observability.tracing import Headers, propagated
from worker.runtime.records import records_for, source_of
from worker.runtime.state.changelog import StateChangelog
from worker.runtime.topics import TopicNames

log = logging.getLogger(__name__)

# A dead letter that any dead-letter topic takes (the broker's default max.message.bytes is 1 MiB).
_FALLBACK_DEAD_LETTER = 256 * 1024


class OwnedPartition:
    def __init__(
        self,
        tp: TopicPartition,
        processor: EnvelopeProcessor,
        sink: Sink,
        topics: TopicNames,
        metrics: Metrics,
        *,
        position: int,
        changelog: StateChangelog,
        epoch: int = 0,
        dead_letters: DeadLetterPolicy | None = None,
        budget: MemoryBudget | None = None,
        resets: ResetTracker | None = None,
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
        self.changelog = changelog  # its keys name the group: no default could stand in for it
        self.uncommitted_records = 0
        self.has_pending_output = False
        # State records taken for a commit that has not ended: should it fail, the changelog
        # believes them written, so the partition must reset with it (``Worker._reset_partition``).
        self.state_taken = False
        self.oldest_timestamp_ms: int | None = None  # create time of the first uncommitted input
        self.dead_letters = dead_letters or DeadLetterPolicy(DeadLetterLimits(None, max_consecutive=None))
        self.trip: Trip | None = None  # set by the record that tripped this partition's breaker
        if processor.admission is not budget:
            # The processor refuses new requests past the budget's caps (a 503, ``memory``): it must
            # have been built with this very budget (``composition.WorkerParts.processor``).
            raise ValueError("the processor's admission is not the partition's memory budget")
        self.budget = budget if budget is not None else MemoryBudget()  # none: no caps, as the processor's
        self.resets = resets or ResetTracker()  # the worker's: it outlives this task
        self.observer = observer  # trace context, spans, GenAI metrics
        # Estimated live bytes per open request, as added to the budget (see ``memory``).
        self.sizes: dict[str, int] = {}
        self._closed_bytes = 0  # the processor's closed-request memory, as added to the budget
        for rid in processor.requests:
            self._track(rid)
        self._produced_keys: dict[str, str] = {}

    @property
    def needs_commit(self) -> bool:
        return self.position != self.committed_position or self.has_pending_output or self.changelog.due

    async def handle(self, record: ConsumedRecord) -> None:
        """Process one consumed record and send what it yields."""
        if record.offset < self.position:
            # Fetched before this partition was reset/re-opened: already processed and committed.
            self.metrics.increment(m.RECORDS_SKIPPED_STALE)
            return
        value: bytes = record.value if record.value is not None else b""
        self.metrics.timing(m.RECORD_AGE_MS, max(0.0, time.time() * 1000 - record.timestamp))
        source = source_of(record)
        skip = self.resets.skip(self.tp.partition, record.offset)
        result: ProcessResult | None
        limit = self.processor.max_output_bytes
        if skip is not None:  # a poison record that kept resetting the partition (``poison``)
            limit = _FALLBACK_DEAD_LETTER if skip.cut else limit
            result = ProcessResult(dead_letter=DeadLetter(skip.reason, value, record.key))
        else:
            started = time.perf_counter()
            result = self.processor.process(value, record.key, source=source)
            self.metrics.timing(m.DERENDER_MS, (time.perf_counter() - started) * 1000)
            if result.internal_error is not None:
                log.error(
                    "processing %s offset %d failed", self.tp, record.offset, exc_info=result.internal_error
                )
                self.metrics.increment(m.PROCESS_ERRORS)
            if result.refused is not None:
                self.metrics.increment(labelled(m.REQUESTS_REJECTED, cap=result.refused))
            if result.request_id is not None:
                self._track(result.request_id)
        headers = record.headers if self.observer.propagate else None
        trace = self._observed(self.observer.observe, record, result, fallback=headers)
        reason = result.dead_letter.reason if result.dead_letter is not None else None
        # The core caps every payload below the producer's max_request_size, so the producer's own
        # size check cannot fire; a topic that refuses a record does so at commit (see ``poison``).
        await self._emit(result, record.offset, trace, headers=record.headers, source=source, max_bytes=limit)
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

    def _track(self, rid: str) -> None:
        """Keep ``sizes`` and the budget in step with ``rid``'s live bytes after a record."""
        old = self.sizes.get(rid)
        ctx = self.processor.requests.get(rid)
        if ctx is not None:
            size = ctx.live_bytes()
            self.sizes[rid] = size
            if old is None:
                self.budget.add(size)
            else:
                self.budget.resize(old, size)
        elif old is not None:
            del self.sizes[rid]
            self.budget.remove(old)
        closed = self.processor.closed_live_bytes()
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
            await self._emit(result, self.position - 1, self._observed(self.observer.expired, result))
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

    async def _emit(
        self,
        result: ProcessResult,
        offset: int,
        trace: tuple[tuple[str, bytes], ...] = (),
        *,
        headers: Any = None,
        source: dict[str, Any] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        """Send what ``result`` yields; ``offset``: the input record's (the last one, for an expiry);
        ``headers``, ``source``: the input record's, for a dead letter of at most ``max_bytes``."""
        if result.duplicate:
            self.metrics.increment(m.RECORDS_DUPLICATE)
            return
        if result.dead_letter is not None:
            self.metrics.increment(m.RECORDS_DEAD_LETTERED)
        limit = max_bytes or self.processor.max_output_bytes
        for out in records_for(result, self.topics, trace, headers=headers, source=source, max_bytes=limit):
            await self.sink.send(out)
            self.has_pending_output = True
            self.metrics.increment(self._produced_key(out.topic))
        if result.output is not None:
            self.metrics.increment(m.OUTPUTS_PRODUCED)
            if result.sequence_gap:
                self.metrics.increment(m.SEQUENCE_GAPS)
        if result.request_id is not None and (result.output is not None or result.closed):
            self.changelog.changed(result.request_id, offset)  # a close record: its tombstones
        if result.closed:
            self.metrics.increment(m.REQUESTS_CLOSED)

    def _produced_key(self, topic: str) -> str:
        key = self._produced_keys.get(topic)
        if key is None:
            key = self._produced_keys[topic] = labelled(m.RECORDS_PRODUCED, topic=topic)
        return key

    async def commit(self) -> None:
        """Commit outputs, state and the input position together (one transaction in EOS mode)."""
        started = time.perf_counter()
        state = self.state_records()
        await self.sink.commit(state, {self.tp: self.position})
        self.committed(state, started)

    def state_records(self) -> list[OutgoingRecord]:
        """This commit's state records (``StateChangelog.records``); called once per commit."""
        self.state_taken = True
        return self.changelog.records(self.processor.requests)

    def committed(self, state: list[OutgoingRecord], started: float) -> None:
        """Book a commit of ``state`` and everything up to ``position`` (begun at ``started``)."""
        snapshots = sum(1 for r in state if r.value is not None)
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
        self.uncommitted_records = 0
        self.has_pending_output = self.state_taken = False
