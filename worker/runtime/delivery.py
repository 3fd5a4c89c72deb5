"""Sinks: how one input partition's outputs, state updates and offsets reach Kafka.

Why exactly-once works this way (transactions, fencing, restore): docs/exactly-once.md,
"Exactly-once, and why this design". Here, what each sink does:

* ``TransactionalSink`` (``--transactional-id-mode per-partition``): a transactional producer per
  input partition, id ``KafkaSettings.transactional_id``; one transaction per commit.
* ``SharedTransaction`` + ``SharedSink`` (``per-worker``): one transactional producer for all of the
  worker's partitions, id ``KafkaSettings.worker_transactional_id``, offsets sent with the group
  metadata (KIP-447). An aborted transaction takes every partition's work with it, so the worker
  resets them all (``Worker._reset_partition``).
* ``AtLeastOnceSink``: an idempotent producer; a commit flushes outputs, *then* state, *then*
  commits offsets, so a crash between them duplicates and never loses.

Any exception out of a sink means the partition must be reset (abort, fresh sink, restore, seek):
after an error a client's transaction state may refuse further use.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from worker.errors import KafkaClientError, ProducerFencedError
from worker.runtime.kafka_client.base import (
    CommitTimings,
    Offsets,
    OutgoingRecord,
    Producer,
    ProducerConfig,
    TopicPartition,
    TransactionalProducer,
)
from worker.runtime.kafka_client.limits import MAX_RECORD_BYTES, TRANSACTION_TIMEOUT_MS
from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.metrics import Metrics

if TYPE_CHECKING:
    from worker.settings import ProducingTopics

log = logging.getLogger(__name__)

PRODUCER_BATCH_BYTES = 512 * 1024
PRODUCER_LINGER_MS = 2
# A transaction's outputs become visible at its commit, and librdkafka's commit sends every
# lingering batch at once: there a longer linger costs no latency and makes fewer, larger produce
# requests (``Worker._batches_under_commit``).
COMMIT_LINGER_MS = 20
PRODUCER_REQUEST_TIMEOUT_MS = 30_000
PRODUCER_RETRY_BACKOFF_MS = 10
CLOSE_TIMEOUT_S = 10.0

CommitOffsets = Callable[[Offsets], Awaitable[None]]
GroupMetadata = Callable[[], object]


def producer_config(
    settings: ProducingTopics,
    client_id: str,
    transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS,
    *,
    linger_for_commit: bool = False,
) -> ProducerConfig:
    """Every producer's settings: the worker's, ``audit``'s and ``dlq replay``'s; ``linger_for_commit``
    for a transactional producer whose commit sends what lingers at once (``COMMIT_LINGER_MS``)."""
    return ProducerConfig(
        bootstrap_servers=settings.bootstrap_servers,
        client_id=client_id,
        max_record_bytes=MAX_RECORD_BYTES,
        batch_bytes=PRODUCER_BATCH_BYTES,
        linger_ms=COMMIT_LINGER_MS if linger_for_commit else PRODUCER_LINGER_MS,
        request_timeout_ms=PRODUCER_REQUEST_TIMEOUT_MS,
        retry_backoff_ms=PRODUCER_RETRY_BACKOFF_MS,
        transaction_timeout_ms=transaction_timeout_ms,
        compression=settings.compression_type,
        security=settings.security,
    )


class Sink(Protocol):
    async def start(self) -> None: ...

    async def send(self, record: OutgoingRecord) -> None: ...

    async def commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None: ...

    async def abort(self) -> None: ...

    async def close(self) -> None: ...


class Transaction:
    """One transactional producer's open transaction: begun on the first send, ended by commit or abort."""

    def __init__(
        self, producer: TransactionalProducer, group: GroupMetadata, metrics: Metrics | None = None
    ) -> None:
        self.producer = producer
        self.transactional_id = producer.transactional_id
        self._group = group
        self._metrics = metrics or Metrics()
        self._open = False
        self._fenced = False
        self._unsettled = False

    @property
    def open(self) -> bool:
        return self._open

    @property
    def fenced(self) -> bool:
        """The producer was fenced: it refuses every call from now on."""
        return self._fenced

    @property
    def needs_new_producer(self) -> bool:
        """Fenced, or its transaction's state is unknown: a begin or abort failed (a timed-out abort
        stays in progress in librdkafka, and every other call then conflicts with it), or a renewal
        did not finish. Only a new producer's ``init_transactions`` settles that transaction."""
        return self._fenced or self._unsettled

    async def start(self) -> None:
        """Connect and ``init_transactions``: fences every earlier producer with this id."""
        await self.producer.start()

    async def renew(self, producer: TransactionalProducer) -> None:
        """Replace a fenced producer with a fresh one of the same id and start it."""
        await self.close()
        self.producer = producer
        self._open = self._fenced = False
        self._unsettled = True  # until init_transactions succeeds
        await self.producer.start()
        self._unsettled = False

    async def _begin(self) -> None:
        try:
            await self.producer.begin()
        except ProducerFencedError:
            raise
        except KafkaClientError:
            self._unsettled = True
            raise
        self._open = True

    async def send(self, record: OutgoingRecord) -> None:
        try:
            if not self._open:
                await self._begin()
            # Awaiting send() blocks while the client's buffer is full: that is the backpressure
            # between processing and the broker.
            await self.producer.send(record)
        except ProducerFencedError:
            self._fenced = True
            raise

    async def commit(self, state_records: Sequence[OutgoingRecord], offsets: Offsets) -> None:
        try:
            for record in state_records:
                await self.send(record)
            if not self._open:
                if not offsets:
                    return
                await self._begin()
            # The group metadata is read at commit: it carries the generation the offsets belong to.
            timings = await self.producer.commit(offsets, self._group())
        except ProducerFencedError:
            self._fenced = True
            raise
        self._open = False
        self._observe(timings)

    def _observe(self, timings: CommitTimings) -> None:
        if timings.flushed_ms is not None:
            self._metrics.timing(m.COMMIT_FLUSH_MS, timings.flushed_ms)
        if timings.offsets_ms is not None:
            self._metrics.timing(m.COMMIT_OFFSETS_MS, timings.offsets_ms)
        if timings.end_txn_ms is not None:
            self._metrics.timing(m.COMMIT_END_TXN_MS, timings.end_txn_ms)

    async def abort(self) -> None:
        if not self._open:
            return
        self._open = False
        self._metrics.increment(m.TRANSACTIONS_ABORTED)
        if self._fenced:
            return  # a fenced producer refuses every call; the new owner aborted it
        try:
            await self.producer.abort()
        except Exception as exc:  # noqa: BLE001 - fenced or broken: the next init_transactions (or the timeout) aborts it
            self._unsettled = True
            log.warning("abort of %s failed (it is aborted later): %r", self.transactional_id, exc)

    async def close(self) -> None:
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.producer.stop()
        except Exception as exc:  # noqa: BLE001 - closing goes on; the failure is logged
            log.warning("producer %s did not close cleanly: %r", self.transactional_id, exc)


class TransactionalSink:
    """Exactly-once, per partition: the partition's own transactional producer."""

    def __init__(
        self, producer: TransactionalProducer, group: GroupMetadata, metrics: Metrics | None = None
    ) -> None:
        self.transaction = Transaction(producer, group, metrics)
        self.transactional_id = producer.transactional_id

    async def start(self) -> None:
        await self.transaction.start()

    async def send(self, record: OutgoingRecord) -> None:
        await self.transaction.send(record)

    async def commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None:
        await self.transaction.commit(state_records, offsets)

    async def abort(self) -> None:
        await self.transaction.abort()

    async def close(self) -> None:
        await self.transaction.close()


class SharedSink:
    """Exactly-once, per worker: one partition's view of the worker's shared transaction.

    Sends go into the shared transaction; commits are the worker's (``Worker._commit_all``
    commits every partition in one transaction), so ``commit`` here is a bug. ``abort`` aborts
    the shared transaction (the worker then resets every partition that had work in it);
    ``start`` and ``close`` leave the shared producer to the worker.
    """

    def __init__(self, transaction: Transaction) -> None:
        self.transaction = transaction

    async def start(self) -> None:
        pass

    async def send(self, record: OutgoingRecord) -> None:
        await self.transaction.send(record)

    async def commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None:
        raise AssertionError("a per-worker transaction commits every partition at once (Worker._commit_all)")

    async def abort(self) -> None:
        await self.transaction.abort()

    async def close(self) -> None:
        pass


class AtLeastOnceSink:
    """At-least-once: an idempotent producer per input partition, offsets committed by the consumer.

    One producer per partition (like the exactly-once sink) rather than one shared: aiokafka
    keeps one produce request in flight per connection, so one producer caps throughput.
    """

    def __init__(self, producer: Producer, commit_offsets: CommitOffsets) -> None:
        self._producer = producer
        self._commit_offsets = commit_offsets

    async def start(self) -> None:
        await self._producer.start()

    async def send(self, record: OutgoingRecord) -> None:
        await self._producer.send(record)

    async def commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None:
        await self._producer.flush()
        # State only after its outputs are acknowledged (see the module docstring).
        for record in state_records:
            await self._producer.send(record)
        await self._producer.flush()
        if offsets:
            await self._commit_offsets(offsets)

    async def abort(self) -> None:
        pass  # nothing to take back: what was sent stays sent (the mode's duplicates on replay)

    async def close(self) -> None:
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._producer.stop()
        except Exception as exc:  # noqa: BLE001 - closing goes on; the failure is logged
            log.warning("producer did not close cleanly: %r", exc)
