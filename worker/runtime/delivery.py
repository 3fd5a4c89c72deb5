"""Sinks: how one input partition's outputs, state updates and offsets reach Kafka.

Exactly-once (``TransactionalSink``)
    One transactional producer per input partition, ``transactional_id =
    f"{group_id}-{input_topic}-{partition}"``. Outputs, dead letters, state snapshots and
    the input offsets go into one transaction per commit. aiokafka cannot fence zombies
    through the consumer-group generation (no KIP-447, aiokafka#844), so fencing comes
    from the stable id: the next owner's ``init_transactions`` (run by ``start``) aborts
    the previous owner's open transaction and makes its later writes fail.

At-least-once (``AtLeastOnceSink``)
    An idempotent producer per input partition; a commit flushes the outputs, *then* writes and
    flushes the state snapshots, *then* commits the offsets with the consumer. A crash
    between those steps replays records whose outputs were already written (duplicates),
    never the other way round (state ahead of outputs would turn replays into skips: loss).

Any exception out of a sink means the partition must be reset (abort, fresh sink,
restore, seek): after an error aiokafka's transaction manager may refuse further use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced

from worker.errors import DeliveryFailedError
from worker.runtime import metrics_names as m
from worker.runtime.metrics import Metrics
from worker.runtime.records import OutgoingRecord

log = logging.getLogger(__name__)

PRODUCER_BATCH_BYTES = 512 * 1024
PRODUCER_LINGER_MS = 2
PRODUCER_REQUEST_TIMEOUT_MS = 30_000
PRODUCER_RETRY_BACKOFF_MS = 10
# Snapshots carry the request and its prompt ids and can pass Kafka's 1 MiB default; the topics
# made by `topics create` allow this much (max.message.bytes).
MAX_RECORD_BYTES = 16 * 1024 * 1024
TRANSACTION_TIMEOUT_MS = 60_000
CLOSE_TIMEOUT_S = 10.0

CommitOffsets = Callable[[dict[TopicPartition, int]], Awaitable[None]]


class Sink(Protocol):
    async def start(self) -> None: ...

    async def send(self, record: OutgoingRecord) -> None: ...

    async def commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None: ...

    async def abort(self) -> None: ...

    async def close(self) -> None: ...


def producer_options(
    bootstrap_servers: str, client_id: str, security: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``AIOKafkaProducer`` keyword arguments; ``security`` is ``KafkaSecurity.client_kwargs()``."""
    return {
        **(security or {}),
        "bootstrap_servers": bootstrap_servers,
        "client_id": client_id,
        "acks": "all",
        "enable_idempotence": True,
        "max_batch_size": PRODUCER_BATCH_BYTES,
        "linger_ms": PRODUCER_LINGER_MS,
        "request_timeout_ms": PRODUCER_REQUEST_TIMEOUT_MS,
        "max_request_size": MAX_RECORD_BYTES,
        # The first request of the next transaction often meets CONCURRENT_TRANSACTIONS while the
        # broker writes the last one's markers; the 100 ms default backoff would add 100 ms per commit.
        "retry_backoff_ms": PRODUCER_RETRY_BACKOFF_MS,
    }


def _raise_first_failure(futures: list[asyncio.Future[Any]]) -> None:
    first: BaseException | None = None
    for fut in futures:  # every future is looked at, so asyncio never reports one as unretrieved
        exc: BaseException | None = (
            DeliveryFailedError("a send was cancelled") if fut.cancelled() else fut.exception()
        )
        if exc is not None and first is None:
            first = exc
    if first is not None:
        raise DeliveryFailedError(f"a send failed: {first!r}") from first


def _discard(futures: list[asyncio.Future[Any]]) -> None:
    """Forget sends of an aborted transaction without asyncio's "exception never retrieved"."""
    for fut in futures:
        if fut.done():
            if not fut.cancelled():
                fut.exception()
        else:
            fut.add_done_callback(lambda f: None if f.cancelled() else f.exception())


async def _send(producer: Any, record: OutgoingRecord) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = await producer.send(
        record.topic,
        value=record.value,
        key=record.key,
        partition=record.partition,
        headers=list(record.headers) if record.headers else None,  # trace context
    )
    return fut


class TransactionalSink:
    """Exactly-once: one transactional producer for one input partition."""

    def __init__(
        self,
        bootstrap_servers: str,
        client_id: str,
        transactional_id: str,
        group_id: str,
        metrics: Metrics | None = None,
        security: Mapping[str, Any] | None = None,
    ) -> None:
        self.transactional_id = transactional_id
        self._metrics = metrics or Metrics()
        self._group_id = group_id
        self._producer = AIOKafkaProducer(
            **producer_options(bootstrap_servers, f"{client_id}-{transactional_id}", security),
            transactional_id=transactional_id,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
        )
        self._in_transaction = False
        self._fenced = False
        self._futures: list[asyncio.Future[Any]] = []

    async def start(self) -> None:
        """Connect and ``init_transactions``: fences every earlier producer with this id."""
        await self._producer.start()

    async def _ensure_transaction(self) -> None:
        if not self._in_transaction:
            await self._producer.begin_transaction()
            self._in_transaction = True

    async def send(self, record: OutgoingRecord) -> None:
        await self._ensure_transaction()
        # Awaiting send() blocks while the producer's buffer for the partition is full:
        # that is the backpressure between processing and the broker.
        self._futures.append(await _send(self._producer, record))

    async def commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None:
        try:
            await self._commit(state_records, offsets)
        except Exception as exc:
            if isinstance(exc, ProducerFenced) or isinstance(exc.__cause__, ProducerFenced):
                self._fenced = True
            raise

    async def _commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None:
        await self._ensure_transaction()
        for record in state_records:
            self._futures.append(await _send(self._producer, record))
        # commit_transaction flushes too, but does not tell which send failed; a failed send
        # must abort the transaction rather than commit a gap.
        t0 = time.perf_counter() * 1000
        # The offsets travel to the coordinators while the records are still being
        # acknowledged; an aborted transaction discards both.
        flushed, offsets_added = await asyncio.gather(
            self._timed(self._producer.flush()),
            self._timed(
                self._producer.send_offsets_to_transaction(offsets, self._group_id) if offsets else None
            ),
        )
        futures, self._futures = self._futures, []
        _raise_first_failure(futures)
        t1 = time.perf_counter()
        await self._producer.commit_transaction()
        self._in_transaction = False
        self._metrics.timing(m.COMMIT_FLUSH_MS, flushed - t0)
        self._metrics.timing(m.COMMIT_OFFSETS_MS, offsets_added - t0)
        self._metrics.timing(m.COMMIT_END_TXN_MS, (time.perf_counter() - t1) * 1000)

    @staticmethod
    async def _timed(step: Awaitable[Any] | None) -> float:
        """Await ``step``; the time it finished, in ms on the perf_counter clock."""
        if step is not None:
            await step
        return time.perf_counter() * 1000

    async def abort(self) -> None:
        _discard(self._futures)
        self._futures = []
        if not self._in_transaction:
            return
        self._in_transaction = False
        self._metrics.increment(m.TRANSACTIONS_ABORTED)
        if self._fenced:
            return  # aiokafka refuses every call after ProducerFenced; the new owner aborted it
        try:
            await asyncio.wait_for(self._producer.abort_transaction(), CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - fenced or broken: the next owner's init aborts it
            log.warning(
                "abort of %s failed (the next init_transactions aborts it): %r", self.transactional_id, exc
            )

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._producer.stop(), CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - closing goes on; the failure is logged
            log.warning("producer %s did not close cleanly: %r", self.transactional_id, exc)


class AtLeastOnceSink:
    """At-least-once: an idempotent producer per input partition, offsets committed by the consumer.

    One producer per partition (like the exactly-once sink) rather than one shared: aiokafka
    keeps one produce request in flight per connection, so one producer caps throughput.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        client_id: str,
        commit_offsets: CommitOffsets,
        security: Mapping[str, Any] | None = None,
    ) -> None:
        self._producer = AIOKafkaProducer(**producer_options(bootstrap_servers, client_id, security))
        self._commit_offsets = commit_offsets
        self._futures: list[asyncio.Future[Any]] = []

    async def start(self) -> None:
        await self._producer.start()

    async def send(self, record: OutgoingRecord) -> None:
        self._futures.append(await _send(self._producer, record))

    async def commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None:
        futures, self._futures = self._futures, []
        if futures:
            await asyncio.wait(futures)
        _raise_first_failure(futures)
        # State only after its outputs are acknowledged (see the module docstring).
        state_futures = [await _send(self._producer, record) for record in state_records]
        if state_futures:
            await asyncio.wait(state_futures)
        _raise_first_failure(state_futures)
        if offsets:
            await self._commit_offsets(offsets)

    async def abort(self) -> None:
        # Nothing to take back: what was sent stays sent (the mode's duplicates on replay).
        _discard(self._futures)
        self._futures = []

    async def close(self) -> None:
        self._futures = []
        try:
            await asyncio.wait_for(self._producer.stop(), CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - closing goes on; the failure is logged
            log.warning("producer did not close cleanly: %r", exc)
