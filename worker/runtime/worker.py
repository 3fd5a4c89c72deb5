"""The worker: poll a bounded batch, process it, commit at the interval; rebalances; shutdown.

One asyncio lock serialises the three things that touch owned partitions: a loop step
(poll + process + maybe commit), the rebalance listener and shutdown. A revocation thus
waits for the current step (at most one poll timeout plus one batch) and then finds no
half-processed batch, only committed or committable work.

Backpressure, step by step: ``poll(max_records)`` bounds a batch; awaiting
``producer.send`` blocks while the producer's buffer is full; and a commit is forced once
``max_uncommitted_records`` inputs are processed but not committed, so unflushed output
never grows without bound even when the commit interval is long. Memory is bounded by the
caps of ``memory`` (open requests, their live bytes) and one live-parser pool for all partitions.

A partition whose dead-letter breaker trips is paused (``consumer.pause``): it stops being
consumed, its committed position stays right after the tripping record, and ``/readyz`` turns
503 naming it, until the worker restarts (a re-assignment in this process pauses it again).
A record that keeps resetting its partition is dead-lettered after ``--max-record-retries``
resets (``poison``); input partitions without a state partition are not opened
(``assignment.LayoutWatch``). When to commit is ``commit_schedule``'s, how is ``committer``'s,
and opening a partition (the restore) is ``partition_opener``'s; the worker keeps the loop, the
rebalance callbacks, stop and reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import Any, Literal

from worker.errors import (
    ConfigurationError,
    GroupRejectedError,
    KafkaClientError,
    KafkaUnreachableError,
    RecordTooLargeError,
)
from worker.runtime.assignment import LayoutWatch
from worker.runtime.commit_schedule import CommitSchedule
from worker.runtime.committer import Committer, LostWork
from worker.runtime.composition import WorkerParts
from worker.runtime.dead_letters.policy import Trip
from worker.runtime.delivery import (
    AtLeastOnceSink,
    SharedSink,
    Sink,
    Transaction,
    TransactionalSink,
    producer_config,
)
from worker.runtime.kafka_client import make_client
from worker.runtime.kafka_client.base import (
    ClientKind,
    ConsumerConfig,
    GroupConsumer,
    KafkaClient,
    Offsets,
    Partitions,
    ProducerConfig,
    RebalanceCallbacks,
    TopicPartition,
)
from worker.runtime.kafka_client.limits import transaction_timeout_ms
from worker.runtime.lifecycle import Lifecycle, WorkerState
from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.prometheus_export import labelled
from worker.runtime.partition import OwnedPartition
from worker.runtime.partition_opener import PartitionOpener
from worker.runtime.preflight import check_record_limits
from worker.runtime.state.store import StateRestorer
from worker.runtime.topics import check_layout, max_message_bytes, partition_counts
from worker.settings import KafkaSettings

log = logging.getLogger(__name__)

# How long a stop request waits for the step in progress (a commit) before cancelling it.
STEP_GRACE_S = 10.0
HEAL_BACKOFF_S = 1.0
# How soon a partition count change is seen (aiokafka's default is 5 minutes).
METADATA_MAX_AGE_MS = 10_000
METRICS_LOG_INTERVAL_S = 30.0
HEARTBEAT_MAX_MS = 250
# Batching under the commit (``Worker._batches_under_commit``): the broker may hold a fetch for a
# tenth of the commit interval, at most this long, to answer with more records.
FETCH_BATCH_WAIT_MS = 10
FETCH_BATCH_BYTES = 256 * 1024


def configuration_error(exc: BaseException, settings: KafkaSettings) -> ConfigurationError | None:
    """A ``ConfigurationError`` for a fatal error that only a configuration change can fix, else ``None``.

    Either backend raises these from ``poll`` once the group coordinator gives up on joining.
    """
    if not isinstance(exc, GroupRejectedError):
        return None
    reason = GroupRejectedError.Reason
    if exc.reason is reason.SESSION_TIMEOUT:
        return ConfigurationError(
            f"the broker rejected --session-timeout-ms {settings.session_timeout_ms}: it must lie between "
            "the broker's group.min.session.timeout.ms and group.max.session.timeout.ms "
            "(Kafka's defaults: 6000 and 1800000)"
        )
    if exc.reason is reason.GROUP_ID:
        return ConfigurationError(f"the broker rejected --group-id {settings.group_id!r} as invalid")
    if exc.reason is reason.PROTOCOL:
        return ConfigurationError(
            f"group {settings.group_id!r} is used by consumers of another protocol; "
            "give the worker its own --group-id"
        )
    if exc.reason is reason.GROUP_AUTHORIZATION:
        return ConfigurationError(
            f"not authorized to use consumer group {settings.group_id!r} (Kafka ACLs; "
            f"{settings.security.describe()})"
        )
    return ConfigurationError(
        f"not authorized to use the worker's topics (Kafka ACLs; {settings.security.describe()})"
    )


class Worker:
    def __init__(self, settings: KafkaSettings, parts: WorkerParts) -> None:
        """``parts``: from ``composition.worker_parts``, which builds them from the settings."""
        self.settings = settings
        self.parts = parts
        self.model = parts.model  # the processors' limits
        self.derenderer = parts.derenderer
        self.metrics = parts.metrics
        self.lifecycle = Lifecycle()
        self.readiness = parts.readiness
        self.readiness.bind_phase(lambda: self.lifecycle.state.value)
        self.dead_letters = parts.dead_letters
        self.budget = parts.budget
        # Resets per partition and offset; like the breakers, they outlive tasks and revocations.
        self.resets = parts.resets
        self.metrics.gauge(m.REQUESTS_OPEN_LIMIT, settings.max_open_requests)  # observability
        self.metrics.gauge(m.STATE_BYTES_LIMIT, settings.max_state_bytes)  # observability
        self.observer = parts.observer  # observability
        self._security = settings.security.client_kwargs()  # one SSLContext, shared by every client
        self._client: KafkaClient = make_client(settings.kafka_client, settings.security, self._security)
        self.parsers = parts.parsers  # one pool for every partition's processor
        self._parser_evictions = 0
        self.tasks: dict[TopicPartition, OwnedPartition] = {}
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._consumer: Any = None  # a GroupConsumer once started
        self.schedule = CommitSchedule(settings.commit_interval_ms, settings.max_uncommitted_records)
        # With --transactional-id-mode per-worker, its ``shared`` is set once started.
        self.committer = Committer(self.metrics, self.resets)
        self.layout = LayoutWatch(
            settings.bootstrap_servers, settings.topics, self._security, self.metrics, self.readiness
        )
        self._restorer: StateRestorer | None = None
        self._opener: PartitionOpener | None = None
        self._next_expiry_at = 0.0
        self._next_heal_at = 0.0
        self._next_metrics_log_at = 0.0
        self._epoch = 0  # bumped whenever partitions are opened; see _step
        self._step_cancelled = False  # see _step_unless_stopped
        self._stop_requested: asyncio.Task[Literal[True]] | None = None  # self._stop.wait() as a task

    # --- public ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask for a graceful stop (SIGTERM): commit, leave the group, return from ``run``."""
        self._stop.set()

    async def run(self) -> int:
        """Run until ``request_stop``; the process exit status."""
        self.lifecycle.to(WorkerState.STARTING)
        try:
            try:
                await self._start_clients()
            except KafkaUnreachableError as exc:
                address = self.settings.bootstrap_servers
                raise ConfigurationError(
                    f"cannot reach Kafka at {address}; start a local broker with "
                    "`deploy/local/kafka start` (127.0.0.1:19092), or point --bootstrap-servers / "
                    "KAFKA_BOOTSTRAP_SERVERS at a running one"
                ) from exc
            self.lifecycle.to(WorkerState.RUNNING)
            try:
                while not self._stop.is_set():
                    await self._step_unless_stopped()
            finally:
                if self._stop_requested is not None:
                    self._stop_requested.cancel()
        except BaseException as exc:
            self.lifecycle.to(WorkerState.FAILED)
            await self._close_clients()
            self.lifecycle.to(WorkerState.STOPPED)
            error = configuration_error(exc, self.settings)
            if error is not None:
                raise error from exc
            raise
        self.lifecycle.to(WorkerState.STOPPING)
        try:
            async with asyncio.timeout(self.settings.shutdown_timeout_s):
                await self._shutdown()
        except TimeoutError:
            log.error("shutdown did not finish within %.0f s", self.settings.shutdown_timeout_s)
            self.lifecycle.to(WorkerState.FAILED)
            self.lifecycle.to(WorkerState.STOPPED)
            return 1
        self.lifecycle.to(WorkerState.STOPPED)
        self.observer.shutdown()  # observability: flushes spans
        log.info("stopped; metrics %s", self.metrics.snapshot())
        return 0

    # --- start / stop ------------------------------------------------------------------------

    async def _start_clients(self) -> None:
        s = self.settings
        consumer: GroupConsumer = self._client.consumer(self._consumer_config())
        self._consumer = consumer
        await consumer.start()
        topics = s.topics
        names = [topics.input, topics.output, topics.state, topics.dlq]
        check_layout(topics, await partition_counts(s.bootstrap_servers, names, self._security))
        check_record_limits(topics, await max_message_bytes(s.bootstrap_servers, names, self._security))
        self._restorer = StateRestorer(
            self._client, s.bootstrap_servers, s.client_id, topics.state, self.parts.keys, s.security
        )
        await self._restorer.start()
        self._opener = PartitionOpener(s, self.parts, self._restorer)
        if s.per_worker_transactions:
            producer = self._client.transactional_producer(
                self._producer_config(s.client_id, transactional=True), s.worker_transactional_id()
            )
            shared = Transaction(producer, consumer.group_metadata, self.metrics)
            self.committer.shared = shared
            await shared.start()  # init_transactions: aborts what a predecessor left open
        # Bound methods, no listener object: the consumer calls back into the worker it serves.
        consumer.subscribe(
            [topics.input],
            RebalanceCallbacks(self.partitions_assigned, self.partitions_revoked, self.partitions_lost),
        )
        log.info(
            "worker %s joined group %s on %s (%s, commit every %d ms; group protocol %s, %s, instance id %s)",
            s.client_id,
            s.group_id,
            topics.input,
            s.mode.value,
            s.commit_interval_ms,
            s.group_protocol.value,
            s.partition_assignment_strategy.value,
            s.group_instance_id or "none",
        )

    async def _step_unless_stopped(self) -> None:
        """One ``_step``; a stop request gives it ``STEP_GRACE_S`` to finish, then cancels it.

        A step can wait on a Kafka client call for that call's whole timeout (a coordinator that does
        not answer), and a stop request must not wait with it. A cancelled step may leave a partition
        half-way through a record, so nothing is committed after it: the shutdown aborts every open
        transaction and the next owners start from the last commit (reprocessed, never duplicated).
        """
        if self._stop_requested is None:  # one waiter for the whole run, not one per step
            self._stop_requested = asyncio.ensure_future(self._stop.wait())
        stop_requested = self._stop_requested
        step = asyncio.ensure_future(self._step())
        await asyncio.wait((step, stop_requested), return_when=asyncio.FIRST_COMPLETED)
        if not step.done():
            await asyncio.wait({step}, timeout=STEP_GRACE_S)
        if not step.done():
            log.warning(
                "a step outlived the stop request by %.0f s: cancelled, nothing more commits", STEP_GRACE_S
            )
            self._step_cancelled = True
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await step
            return
        step.result()

    async def _shutdown(self) -> None:
        async with self._lock:
            if not self._step_cancelled:
                await self._commit_all()
            for task in list(self.tasks.values()):
                await self._close_task(task)
            self.tasks.clear()
        # Outside the lock: stopping the consumer may wait for a listener call that waits for it.
        await self._close_clients()

    async def _close_clients(self) -> None:
        for task in list(self.tasks.values()):
            await self._close_task(task)
        self.tasks.clear()
        for client in (self._consumer, self._restorer):
            if client is None:
                continue
            try:
                await client.stop()  # the consumer's stop() leaves the group
            except Exception as exc:  # noqa: BLE001 - closing goes on; the failure is logged
                log.warning("closing %r failed: %r", client, exc)
        self._consumer = self._restorer = self._opener = None
        shared = self.committer.shared
        if shared is not None:
            await shared.abort()
            await shared.close()
            self.committer.shared = None

    # --- the loop ----------------------------------------------------------------------------

    async def _step(self) -> None:
        # Poll outside the lock: during a rebalance poll waits for the new assignment,
        # and the assignment waits for the listener, which takes the lock.
        poll_epoch = self._epoch
        batches = await self._consumer.poll(
            self.schedule.poll_timeout_ms(time.monotonic()), self.settings.max_poll_records
        )
        async with self._lock:
            for tp, records in batches.items():
                task = self.tasks.get(tp)
                if task is None:
                    # Not ours any more, or not open yet: opening seeks to the committed offset.
                    continue
                if task.epoch > poll_epoch:
                    # Re-opened while we polled: these records may predate its seek. Rewind to
                    # where the new task starts and let the fetcher deliver them again.
                    self._consumer.seek(tp, task.position)
                    continue
                if self.dead_letters.is_tripped(tp.partition):
                    continue  # paused: fetched before the pause took effect
                record = None
                committing = False  # an isolated (or poison) commit of ``record`` alone
                try:
                    for record in records:
                        await task.handle(record)
                        now = time.monotonic()
                        self.schedule.record_handled(record.timestamp, now, time.time())
                        if task.trip is not None:
                            break
                        isolating = self.resets.isolating(tp.partition, record.offset)
                        if isolating or self.resets.is_poison(tp.partition, record.offset):
                            # After a failed commit, one record per transaction names the culprit;
                            # a skipped poison record is committed at once, so it is skipped once.
                            if isolating:
                                self.metrics.increment(m.COMMITS_ISOLATED)
                            committing = True
                            if self.committer.shared is not None:  # one transaction holds every partition
                                await self._commit_shared([task], raise_errors=True)
                            else:
                                await task.commit()
                            committing = False
                            self.resets.committed(tp.partition, task.position)
                        elif self.schedule.due_within_batch(now):
                            # A long batch (a backlog, a restore) commits as it goes: an open
                            # transaction holds back every reader of the output partitions it wrote.
                            await self._commit_all()
                            if self.tasks.get(tp) is not task:
                                break  # the commit failed and reset this partition
                except Exception as exc:
                    log.exception(
                        "record %s offset %s failed; resetting the partition",
                        tp,
                        getattr(record, "offset", None),
                    )
                    # A Kafka client error is the cluster's, not the record's, unless the commit
                    # held that record alone.
                    blamed = None
                    if record is not None and (committing or not kafka_client_error(exc)):
                        blamed = record.offset
                    too_large = committing and refused_as_too_large(exc)
                    await self._reset_partition(tp, blamed, exc, too_large)
                    continue
                if task.trip is not None:
                    self._pause_tripped(task)
            self._update_gauges()
            await self._maybe_commit()
            await self._maybe_expire()
            await self._heal()
        self._maybe_log_metrics()

    def _pause_tripped(self, task: OwnedPartition) -> None:
        """Stop consuming a partition whose breaker tripped; its processed records still commit.

        Records already fetched for a paused partition are skipped by ``_step``, so nothing past the
        tripping record is processed. The breaker stays tripped in this process, also across a
        revocation: a re-assignment pauses the partition again (``_open_partitions``).
        """
        trip = task.trip
        assert trip is not None
        if task.tp not in self._consumer.paused():
            self.metrics.increment(m.DLQ_BREAKER_TRIPS)
            log.error(trip.describe(), extra={"partition": task.tp.partition})
        self._pause(task.tp, trip)

    def _pause(self, tp: TopicPartition, trip: Trip) -> None:
        if tp not in self._consumer.paused():
            self._consumer.pause(tp)
        self.readiness.breaker_tripped(trip)
        self._update_paused_gauge()

    def _update_paused_gauge(self) -> None:
        owned = {tp.partition for tp in self.tasks}
        self.metrics.gauge(m.PARTITIONS_PAUSED, len(owned & set(self.dead_letters.tripped())))

    def _update_gauges(self) -> None:
        """Per step: consumer lag per partition and the memory budget (cheap: no broker calls)."""
        for tp, task in self.tasks.items():
            lso = self._consumer.last_stable_offset(tp)
            if lso is not None:  # not known before the first fetch
                # A paused partition's lag stays frozen (no fetches update its last stable offset).
                self.metrics.gauge(
                    labelled(m.CONSUMER_LAG, partition=tp.partition), max(0, lso - task.position)
                )
        self.metrics.gauge(m.STATE_BYTES, self.budget.state_bytes)

    async def _maybe_commit(self) -> None:
        uncommitted = sum(t.uncommitted_records for t in self.tasks.values())
        self.metrics.gauge(m.UNCOMMITTED_RECORDS, uncommitted)
        forced = self.schedule.forced(uncommitted)
        due = self.schedule.due(time.monotonic())
        if forced or due:
            if forced and not due:
                self.metrics.increment(m.COMMITS_FORCED)
            await self._commit_all()

    async def _commit_all(self, tps: set[TopicPartition] | None = None) -> None:
        """Commit every task with work (or those in ``tps``); a failed one is reset."""
        if tps is None:
            self.schedule.periodic_commit_started()
        started = time.monotonic()
        outcome = await self.committer.commit(self.tasks, tps)
        await self._reset_lost(outcome.lost)
        if tps is None and outcome.committed_any:
            self.schedule.periodic_commit_took(time.monotonic() - started)

    async def _commit_shared(self, tasks: list[OwnedPartition], *, raise_errors: bool = False) -> None:
        """One per-worker transaction for ``tasks`` and every other task with work (see ``Committer``)."""
        lost = await self.committer.commit_shared(tasks, self.tasks, raise_errors=raise_errors)
        await self._reset_lost(lost)

    async def _reset_lost(self, lost: list[LostWork]) -> None:
        for work in lost:
            # Per worker, the first reset aborts the transaction and resets the others with it.
            if work.tp in self.tasks:
                await self._reset_partition(work.tp, None, work.error)

    async def _maybe_expire(self) -> None:
        now = time.monotonic()
        if now < self._next_expiry_at:
            return
        ttl = self.settings.request_ttl_s
        self._next_expiry_at = now + min(max(ttl / 4, 0.5), 10.0)
        open_requests = 0
        for tp, task in list(self.tasks.items()):
            try:
                if await task.expire(ttl):
                    self.schedule.work_without_record(now)
            except Exception as exc:
                log.exception("expiring requests of %s failed; resetting the partition", tp)
                await self._reset_partition(tp, None, exc)
                continue
            open_requests += len(task.processor.requests)
        self.metrics.gauge(m.REQUESTS_OPEN, open_requests)
        self.metrics.gauge(m.PARSERS_LIVE, len(self.parsers))
        self.metrics.increment(m.PARSER_EVICTIONS, self.parsers.evictions - self._parser_evictions)
        self._parser_evictions = self.parsers.evictions

    async def _heal(self) -> None:
        """Open assigned partitions that have no task (a failed assign or reset)."""
        # Not while rebalancing: the listener's assign opens the new assignment.
        if self.lifecycle.state is not WorkerState.RUNNING or time.monotonic() < self._next_heal_at:
            return
        missing = self.layout.missing(self._consumer.assignment(), self.tasks.keys())
        if missing:
            await self._open_partitions(missing)

    def _maybe_log_metrics(self) -> None:
        now = time.monotonic()
        if now >= self._next_metrics_log_at:
            if self._next_metrics_log_at:
                log.info("metrics %s", self.metrics.snapshot()["counters"])
            self._next_metrics_log_at = now + METRICS_LOG_INTERVAL_S

    # --- partitions --------------------------------------------------------------------------

    async def partitions_lost(self, lost: Partitions) -> None:
        """Gone already (session expired, fenced): their work is aborted, nothing is committed."""
        async with self._lock:
            mine = lost & set(self.tasks)
            log.warning("lost %s", sorted(tp.partition for tp in mine))
            for tp in mine:
                await self._reset_partition(tp, None, KafkaClientError("partition lost"))
            self.layout.lost(lost)
            for tp in lost:
                self.readiness.partitions_revoked([tp.partition])

    async def partitions_revoked(self, revoked: Partitions) -> None:
        """Commit and close the revoked partitions; with an incremental rebalance (some partitions
        stay) the others keep flowing and the worker stays running."""
        async with self._lock:
            mine = revoked & set(self.tasks)
            # By the assignment, not the tasks: a kept partition may be resetting (healed later).
            kept = self._consumer.assignment() - revoked
            if self.lifecycle.state is WorkerState.RUNNING and not kept:
                self.lifecycle.to(WorkerState.REBALANCING)
            self.metrics.increment(m.PARTITIONS_REVOKED, len(mine))
            started = time.perf_counter()
            # Commit before returning: the next owner starts right after every member's revoke.
            # A per-worker transaction also holds the kept partitions' outputs: it commits whole
            # (closing a revoked partition's sink would otherwise abort their work with it).
            await self._commit_all(None if self.committer.shared is not None else mine)
            committed = time.perf_counter()
            for tp in mine:
                task = self.tasks.pop(tp, None)
                if task is not None:
                    await self._close_task(task)
            log.info(
                "revoked %s (committed in %.0f ms, closed in %.0f ms)",
                sorted(tp.partition for tp in mine),
                (committed - started) * 1000,
                (time.perf_counter() - committed) * 1000,
            )
            # Every revoked partition, also one that never opened (it would stay "restoring").
            self.layout.revoked(revoked)
            # Their breakers and reset counts stay (see dead_letter_policy and poison).
            for tp in revoked:
                p = tp.partition
                self.readiness.partitions_revoked([p])
                self.metrics.gauges.pop(labelled(m.CONSUMER_LAG, partition=p), None)
            self.metrics.gauge(m.PARTITIONS_OWNED, len(self.tasks))
            self._update_paused_gauge()

    async def partitions_assigned(self, assigned: Partitions) -> None:
        async with self._lock:
            if not self.lifecycle.accepting_partitions:
                return
            log.info("assigned %s", sorted(tp.partition for tp in assigned))
            self.metrics.increment(m.PARTITIONS_ASSIGNED, len(assigned))
            self.metrics.increment(m.REBALANCES)
            self.readiness.partitions_assigned(tp.partition for tp in assigned)
            if self.committer.shared is not None:
                # A restore can take longer than the per-worker transaction timeout: commit what
                # the shared transaction holds rather than keep it open across the restore.
                await self._commit_all()
            await self._open_partitions(assigned - set(self.tasks))
            if self.lifecycle.state is WorkerState.REBALANCING:
                self.lifecycle.to(WorkerState.RUNNING)

    async def _open_partitions(self, tps: set[TopicPartition]) -> None:
        """Open the partitions of ``tps`` that have a state partition (``PartitionOpener``).

        Must hold the lock. On failure, nothing is opened and ``_heal`` retries later.
        """
        tps = await self.layout.placeable(tps, self._consumer.assignment())
        if not tps:
            return
        assert self._opener is not None
        started = time.perf_counter()
        try:
            opened = await self._opener.open(tps, self._consumer, self._new_sink, self._next_epoch)
        except Exception as exc:  # noqa: BLE001 - any failure: retried after a backoff
            log.warning("opening partitions %s failed, will retry: %r", sorted(t.partition for t in tps), exc)
            self._next_heal_at = time.monotonic() + HEAL_BACKOFF_S
            return
        self.readiness.partitions_revoked(tp.partition for tp in opened.dropped)
        self.tasks.update(opened.tasks)
        for tp in opened.tasks:
            trip = self.dead_letters.tripped().get(tp.partition)
            if trip is not None:  # tripped earlier in this process: it stays paused
                self._pause(tp, trip)
        # Partitions that failed to open stay "restoring": not ready until _heal opens them.
        self.readiness.partitions_restored(tp.partition for tp in opened.tasks)
        self.metrics.increment(m.STATE_RESTORED_REQUESTS, opened.restored_requests)
        self.metrics.increment(m.STATE_REPLAYED_RECORDS, opened.replayed_records)
        self.metrics.timing(m.STATE_RESTORE_MS, (time.perf_counter() - started) * 1000)
        self.metrics.gauge(m.PARTITIONS_OWNED, len(self.tasks))
        log.info(
            "opened partitions %s at %s with %d restored requests (%d input records re-read)",
            sorted(tp.partition for tp in tps),
            {tp.partition: opened.positions[tp] for tp in sorted(opened.positions)},
            opened.restored_requests,
            opened.replayed_records,
        )

    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def _consumer_config(self) -> ConsumerConfig:
        s = self.settings
        config = ConsumerConfig(
            bootstrap_servers=s.bootstrap_servers,
            client_id=s.client_id,
            group_id=s.group_id,
            session_timeout_ms=s.session_timeout_ms,
            rebalance_timeout_ms=s.rebalance_timeout_ms,
            # A member learns of a rebalance from a heartbeat, and the group (the kept partitions'
            # offset commits too) waits for the slowest to rejoin: beat often, not 1/4 session.
            heartbeat_interval_ms=max(100, min(s.session_timeout_ms // 4, HEARTBEAT_MAX_MS)),
            max_poll_records=s.max_poll_records,
            metadata_max_age_ms=METADATA_MAX_AGE_MS,
            security=s.security,
            assignment_strategy=s.partition_assignment_strategy,
            group_protocol=s.group_protocol,
            group_instance_id=s.group_instance_id,
        )
        if not self._batches_under_commit():
            return config
        wait_ms = max(1, min(FETCH_BATCH_WAIT_MS, s.commit_interval_ms // 10))
        return replace(config, fetch_min_bytes=FETCH_BATCH_BYTES, fetch_max_wait_ms=wait_ms)

    def _batches_under_commit(self) -> bool:
        """Whether to batch fetches and sends where the commit hides the wait (docs/kafka-worker.md,
        "When the worker commits"): an output visible only at its commit, on librdkafka. Not on aiokafka: its
        backend flushes before a commit (to learn which send failed), and that flush waits a linger
        out; and it fetches no partition whose records are still buffered, so a held fetch delays
        the next fetch of the partitions just handed over."""
        s = self.settings
        return s.exactly_once and s.kafka_client is ClientKind.CONFLUENT

    def _producer_config(self, client_id: str, *, transactional: bool = False) -> ProducerConfig:
        s = self.settings
        timeout = transaction_timeout_ms(s.transactional_id_mode)
        linger = transactional and self._batches_under_commit()
        return producer_config(s, client_id, timeout, linger_for_commit=linger)

    def _new_sink(self, tp: TopicPartition) -> Sink:
        s = self.settings
        if self.committer.shared is not None:
            return SharedSink(self.committer.shared)
        if s.exactly_once:
            transactional_id = s.transactional_id(tp.partition)
            config = self._producer_config(f"{s.client_id}-{transactional_id}", transactional=True)
            transactional = self._client.transactional_producer(config, transactional_id)
            return TransactionalSink(transactional, self._group_id_metadata, self.metrics)
        producer = self._client.producer(self._producer_config(f"{s.client_id}-p{tp.partition}"))
        return AtLeastOnceSink(producer, self._commit_offsets)

    def _group_id_metadata(self) -> object:
        # Per-partition producers are fenced by their transactional ids (the next owner's
        # init_transactions runs before it reads the committed offsets), so their offsets need no
        # generation; with one, a commit of a kept partition in flight when an incremental
        # rebalance bumps the generation is refused (ILLEGAL_GENERATION) and the partition resets.
        return self._consumer.group_id_metadata()

    async def _commit_offsets(self, offsets: Offsets) -> None:
        await self._consumer.commit(offsets)

    async def _close_task(self, task: OwnedPartition) -> None:
        self.observer.partition_closed(task.tp.partition)  # observability
        task.release()
        self.parsers.drop_owner(task.processor)
        await task.sink.abort()
        await task.sink.close()

    async def _reset_partition(
        self,
        tp: TopicPartition,
        offset: int | None = None,
        error: BaseException | None = None,
        too_large: bool = False,
    ) -> None:
        """Throw away the partition's uncommitted work and reopen it from committed state.

        ``offset``: the record whose handling failed (``None``: unknown, e.g. a failed commit). The
        reset counts towards that record's retries and, like a dead letter, towards the breaker; a
        reset no record is blamed for counts towards the breaker unless a Kafka client error caused
        it (the cluster's trouble: the partition simply retries, like after an outage).
        ``too_large``: a topic refused the record's output as too large; it is skipped at once.
        """
        self.metrics.increment(m.PARTITION_RESETS)
        reason = f"partition reset: {error!r}"
        counted = offset is not None or error is None or not kafka_client_error(error)
        if offset is not None:
            self.metrics.increment(m.RESETS_BY_RECORD)
            resets = self.resets.record_failed(tp.partition, offset, repr(error), too_large=too_large)
            log.warning(
                "offset %d of %s reset its partition (%d of %d in a row)",
                offset,
                tp,
                resets,
                self.resets.max_retries,
                extra={"partition": tp.partition},
            )
        trip = self.dead_letters.observe(tp.partition, reason, offset) if counted else None
        if trip is not None:
            self.metrics.increment(m.DLQ_BREAKER_TRIPS)
            log.error(trip.describe(), extra={"partition": tp.partition})
            if tp in self._consumer.assignment():
                self._pause(tp, trip)
        self.readiness.partitions_assigned([tp.partition])
        task = self.tasks.pop(tp, None)
        shared = self.committer.shared
        aborts_shared = shared is not None and shared.open
        if task is not None:
            await self._close_task(task)
        if shared is not None:
            # Closing it aborted the shared transaction, and with it every partition's uncommitted
            # work; and a failed commit took the state records of every partition it joined, even
            # one with no other work. Those reopen from committed state too (not counted).
            for other in [
                t for t in self.tasks.values() if t.state_taken or (aborts_shared and t.needs_commit)
            ]:
                self.metrics.increment(m.PARTITION_RESETS)
                self.readiness.partitions_assigned([other.tp.partition])
                del self.tasks[other.tp]
                await self._close_task(other)
        if shared is not None and shared.needs_new_producer:
            await self._renew_shared()
        # _heal reopens it (with backoff) if it is still ours.
        self._next_heal_at = time.monotonic() + HEAL_BACKOFF_S

    async def _renew_shared(self) -> None:
        """A fenced shared producer refuses every call for good, and one whose abort timed out (a
        broker outage) refuses every other call while that abort stays pending: either would stop
        every partition. Per worker it is fenced when the broker timed its transaction out (a new
        epoch) or when a process with the same client id started. A fresh producer takes the id
        (back) over; its init_transactions settles whatever the old one left open. A zombie that
        does so loses its partitions at its next poll all the same."""
        shared = self.committer.shared
        assert shared is not None
        s = self.settings
        why = "was fenced" if shared.fenced else "left its transaction unsettled"
        log.warning("the shared producer %s %s; starting a new one", shared.transactional_id, why)
        producer = self._client.transactional_producer(
            self._producer_config(s.client_id, transactional=True), s.worker_transactional_id()
        )
        try:
            await shared.renew(producer)
        except KafkaClientError as exc:  # still fenced: the next reset tries again
            log.warning("starting a new shared producer failed: %r", exc)


def kafka_client_error(error: BaseException) -> bool:
    """Whether ``error`` is the Kafka client's (broker, metadata, transaction state), not a record's."""
    return isinstance(error, KafkaClientError)


def refused_as_too_large(error: BaseException) -> bool:
    """Whether a topic refused a record of ``error``'s send or commit as too large."""
    seen: BaseException | None = error
    for _ in range(8):  # a cause chain is short; a cycle is not followed
        if seen is None:
            return False
        if isinstance(seen, RecordTooLargeError):
            return True
        seen = seen.__cause__
    return False
