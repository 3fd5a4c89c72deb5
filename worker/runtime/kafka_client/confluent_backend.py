"""The librdkafka backend (``confluent-kafka``), bridged to asyncio on dedicated threads.

librdkafka does the protocol work on its own threads; what blocks is the calling side:
``consume`` waits for records, and ``init_transactions``, ``send_offsets_to_transaction``,
``commit_transaction`` and ``abort_transaction`` wait for the coordinators. Each client runs
those calls on its own one-thread executor (``loop.run_in_executor``), so the event loop never
blocks and one client's calls keep their order; ``produce`` only enqueues and runs inline.
``confluent_kafka.aio``'s wrappers do the same per call with more overhead: measured on this
project's benchmark machine, its ``AIOProducer``/``AIOConsumer`` pass-through reached 80.4k
records/s against 119.6k for the blocking client on a thread (docs/benchmarks.md).

Rebalance callbacks run on the consume thread, inside ``consume``. With an incremental protocol
(cooperative-sticky, KIP-848) they add and remove only the partitions named (``incremental_assign``,
``incremental_unassign``); eager ones replace the whole assignment. A revocation hands the worker's
coroutine to the event loop (``run_coroutine_threadsafe``) and waits for it, so its commit finishes
before librdkafka rejoins; the loop is free meanwhile (it is awaiting that ``consume``). An
assignment cannot be opened there: librdkafka holds back committed-offset fetches until the
callback returns. So the callback assigns the partitions paused and returns, and ``poll`` opens
them (the worker's ``on_assign``: restore, seek) before it resumes them and returns: no record of
a new partition is handed out before it is open. Every resume, librdkafka's after a callback and
the worker's after an open, is followed by a wake-up of the fetchers (``_wake_fetchers``).

Deliveries are reported only when they fail (``delivery.report.only.error``): a transaction's
commit fails anyway if one of its records did, and the first failure names why (too large, ...).
KIP-447: ``commit`` sends the offsets with the consumer's ``consumer_group_metadata()`` (per worker),
or with the group alone (per partition, whose producers their transactional ids fence).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import confluent_kafka
from confluent_kafka import Consumer, KafkaException
from confluent_kafka import KafkaError as LibKafkaError
from confluent_kafka import TopicPartition as LibTopicPartition

from worker.errors import (
    ConfigurationError,
    DeliveryFailedError,
    GroupRejectedError,
    KafkaClientError,
    KafkaUnreachableError,
    PartitionNotAssignedError,
    ProducerFencedError,
    RecordTooLargeError,
)
from worker.runtime.kafka_client.base import (
    ClientKind,
    CommitTimings,
    ConsumedRecord,
    ConsumerConfig,
    GroupProtocol,
    Offsets,
    OutgoingRecord,
    Partitions,
    PartitionsCallback,
    ProducerConfig,
    ReaderConfig,
    RebalanceCallbacks,
    TopicPartition,
)
from worker.runtime.security.kafka_oauth import MskIamTokenProvider, OidcTokenProvider
from worker.runtime.security.kafka_security import KafkaSecurity, SaslMechanism

log = logging.getLogger(__name__)

T = TypeVar("T")

CALL_TIMEOUT_S = 30.0  # a coordinator call (committed offsets, offsets to a transaction, EndTxn)
CLOSE_TIMEOUT_S = 10.0
# A wake-up's ListOffsets (``ConfluentConsumer._wake_fetchers``): past it, librdkafka's own one-second
# timer wakes the fetchers anyway, and the wake-ups queued behind it and ``stop`` wait no longer.
WAKE_TIMEOUT_S = 1.0
STUCK_MARGIN_S = 5.0  # past a call's own timeout: it is not coming back (see _txn_call)
_NO_OFFSET = confluent_kafka.OFFSET_INVALID
_FENCED = {LibKafkaError._FENCED, LibKafkaError.PRODUCER_FENCED, LibKafkaError.INVALID_PRODUCER_EPOCH}
_TOO_LARGE = {LibKafkaError.MSG_SIZE_TOO_LARGE, LibKafkaError.RECORD_LIST_TOO_LARGE}
_UNREACHABLE = {LibKafkaError._TRANSPORT, LibKafkaError._ALL_BROKERS_DOWN, LibKafkaError._RESOLVE}
_GROUP_REJECTIONS = {
    LibKafkaError.INVALID_SESSION_TIMEOUT: GroupRejectedError.Reason.SESSION_TIMEOUT,
    LibKafkaError.INVALID_GROUP_ID: GroupRejectedError.Reason.GROUP_ID,
    LibKafkaError.INCONSISTENT_GROUP_PROTOCOL: GroupRejectedError.Reason.PROTOCOL,
    LibKafkaError.GROUP_AUTHORIZATION_FAILED: GroupRejectedError.Reason.GROUP_AUTHORIZATION,
    LibKafkaError.TOPIC_AUTHORIZATION_FAILED: GroupRejectedError.Reason.TOPIC_AUTHORIZATION,
}


def translate(error: LibKafkaError) -> KafkaClientError:
    """librdkafka's error as the project's (the caller chains the original as the cause)."""
    code = error.code()
    text = f"{error.name()}: {error.str()}"
    if code in _UNREACHABLE:
        return KafkaUnreachableError(text)
    if code in _FENCED:
        return ProducerFencedError(text)
    if code in _TOO_LARGE:
        return RecordTooLargeError(text)
    if code == LibKafkaError._STATE:
        return PartitionNotAssignedError(text)
    reason = _GROUP_REJECTIONS.get(code)
    if reason is not None:
        return GroupRejectedError(reason, text)
    return KafkaClientError(text)


def _translated(exc: KafkaException) -> KafkaClientError:
    error = exc.args[0] if exc.args and isinstance(exc.args[0], LibKafkaError) else None
    if error is None:
        return KafkaClientError(repr(exc))
    return translate(error)


def security_config(security: KafkaSecurity) -> dict[str, Any]:
    """``KafkaSecurity`` as librdkafka configuration (the same flags as for aiokafka)."""
    config: dict[str, Any] = {"security.protocol": security.protocol.value}
    if security.protocol.uses_ssl:
        if security.ssl_cafile:
            config["ssl.ca.location"] = security.ssl_cafile
        if security.ssl_certfile:
            config["ssl.certificate.location"] = security.ssl_certfile
        if security.ssl_keyfile:
            config["ssl.key.location"] = security.ssl_keyfile
        if security.ssl_key_password is not None:
            config["ssl.key.password"] = security.ssl_key_password.reveal()
        # Off: the chain is still verified (enable.ssl.certificate.verification stays true).
        config["ssl.endpoint.identification.algorithm"] = "https" if security.ssl_check_hostname else "none"
    if not security.protocol.uses_sasl:
        return config
    mechanism = security.sasl_mechanism
    # Both token kinds come from the providers aiokafka uses, through librdkafka's ``oauth_cb``
    # (called on the client's own thread when the token needs a refresh). librdkafka's built-in
    # OIDC grant is not used: it sends the client credentials without the form encoding RFC 6749
    # (2.3.1) asks for, so a secret with ``:``, ``/`` or ``&`` is refused by a conforming endpoint.
    provider: OidcTokenProvider | MskIamTokenProvider | None = None
    if mechanism is SaslMechanism.OAUTHBEARER:
        assert security.oauth is not None  # KafkaSecurity.validate()
        provider = OidcTokenProvider(security.oauth)
    elif mechanism is SaslMechanism.AWS_MSK_IAM:
        assert security.aws_region is not None  # KafkaSecurity.validate()
        provider = MskIamTokenProvider(security.aws_region)
    if provider is not None:
        fetch = provider.fetch
        config["sasl.mechanism"] = "OAUTHBEARER"
        config["oauth_cb"] = lambda _config: fetch()
        return config
    if mechanism is None or security.sasl_password is None:
        raise ConfigurationError(f"--kafka-client confluent cannot map {security.describe()}")
    config["sasl.mechanism"] = mechanism.value
    config["sasl.username"] = security.sasl_username
    config["sasl.password"] = security.sasl_password.reveal()
    return config


def _lib(tp: TopicPartition, offset: int | None = None) -> LibTopicPartition:
    if offset is None:
        return LibTopicPartition(tp.topic, tp.partition)
    return LibTopicPartition(tp.topic, tp.partition, offset)


def _ours(partitions: Sequence[LibTopicPartition]) -> Partitions:
    return {TopicPartition(p.topic, p.partition) for p in partitions}


class _Record:
    """A consumed record with the attributes of ``ConsumedRecord`` (librdkafka's are methods)."""

    __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(self, message: Any) -> None:
        self.topic: str = message.topic()
        self.partition: int = message.partition()
        self.offset: int = message.offset()
        self.timestamp: int = message.timestamp()[1]
        self.key: bytes | None = message.key()
        self.value: bytes | None = message.value()
        self.headers: Sequence[tuple[str, bytes]] = message.headers() or ()


class _Thread:
    """One daemon thread: the client's blocking calls, in order, off the event loop.

    A daemon, unlike a ``ThreadPoolExecutor``'s worker, is not joined when the interpreter exits: a
    call given up after its timeout (``ConfluentTransactionalProducer._txn_call``) may still be
    inside librdkafka, and a stopped worker must not wait for it.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]
        self._calls = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            future, call, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                future.set_exception(exc)
            else:
                future.set_result(result)

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        future: Future[T] = Future()
        self._calls.put((future, call, args))
        return await asyncio.wrap_future(future)

    def submit(self, call: Callable[..., Any], *args: Any) -> None:
        """Run ``call`` without waiting for it; a failure is logged, a result dropped."""
        future: Future[Any] = Future()
        future.add_done_callback(_log_failure)
        self._calls.put((future, call, args))

    def shutdown(self) -> None:
        self._calls.put(None)  # the thread ends after the calls already queued


def _log_failure(future: Future[Any]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.debug("a background client call failed: %r", exc)


async def _call(thread: _Thread, call: Callable[..., T], *args: Any) -> T:
    try:
        return await thread.run(call, *args)
    except KafkaException as exc:
        raise _translated(exc) from exc


def consumer_settings(config: ConsumerConfig) -> dict[str, Any]:
    """librdkafka's consumer configuration for ``config`` (without the callbacks)."""
    settings: dict[str, Any] = {
        **security_config(config.security),
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": config.client_id,
        "group.id": config.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # Inputs may themselves be written transactionally: never act on aborted ones.
        "isolation.level": "read_committed",
        # librdkafka's rebalance timeout (JoinGroup) is its max poll interval.
        "max.poll.interval.ms": max(config.rebalance_timeout_ms, config.session_timeout_ms),
        "topic.metadata.refresh.interval.ms": config.metadata_max_age_ms,
        "fetch.min.bytes": config.fetch_min_bytes,
        "fetch.wait.max.ms": config.fetch_max_wait_ms,
    }
    if config.group_protocol is GroupProtocol.CONSUMER:
        # KIP-848: assignment, session timeout and heartbeats are the broker's
        # (group.consumer.* broker settings); librdkafka refuses the client-side properties.
        settings["group.protocol"] = "consumer"
    else:
        settings["partition.assignment.strategy"] = config.assignment_strategy.value
        settings["session.timeout.ms"] = config.session_timeout_ms
        settings["heartbeat.interval.ms"] = config.heartbeat_interval_ms
    if config.group_instance_id is not None:
        settings["group.instance.id"] = config.group_instance_id
    return settings


def group_id_metadata(group_id: str) -> bytes:
    """librdkafka's metadata of ``group_id`` alone: that of a consumer that never joined and has no
    instance id (the coordinator would check a static member's instance id), made by librdkafka."""
    probe = Consumer({"group.id": group_id, "log_level": 0})  # never connects: no brokers, no poll
    try:
        metadata: bytes = probe.consumer_group_metadata()
        return metadata
    finally:
        probe.close()


def incremental(config: ConsumerConfig) -> bool:
    """Whether rebalances add and remove partitions one by one (cooperative-sticky, or KIP-848)."""
    return config.group_protocol is GroupProtocol.CONSUMER or config.assignment_strategy.incremental


class ConfluentConsumer:
    def __init__(self, config: ConsumerConfig) -> None:
        self._config = config
        if config.group_protocol is GroupProtocol.CONSUMER:
            log.info(
                "group protocol consumer (KIP-848): the broker assigns partitions and sets the session "
                "timeout (group.consumer.session.timeout.ms); --session-timeout-ms is not used"
            )
        self._consumer = Consumer({**consumer_settings(config), "error_cb": self._on_error})
        # The Python client has no rebalance_protocol(); a group's members share one protocol
        # (librdkafka refuses to join a group whose other members' assignor differs).
        self._incremental = incremental(config)
        self._group_id_metadata = group_id_metadata(config.group_id)
        self._poll_thread = _Thread("kafka-consume")
        self._call_thread = _Thread("kafka-consumer-call")  # not behind a consume (or its callbacks)
        self._wake_thread = _Thread("kafka-consumer-wake")  # see _wake_fetchers
        self._closing = False  # no more wake-ups: close() must neither wait for one nor meet one
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused: Partitions = set()  # by the caller (a tripped breaker, a full backlog)
        self._assigned: Partitions = set()
        self._opening: Partitions = set()  # assigned (paused) by the callback, not open yet
        self._fatal: KafkaClientError | None = None
        self._callbacks: tuple[PartitionsCallback, PartitionsCallback, PartitionsCallback] | None = None

    def _on_error(self, error: LibKafkaError) -> None:
        # Reported on librdkafka's thread; only what can never heal stops the worker.
        if error.code() in _GROUP_REJECTIONS or error.fatal():
            self._fatal = translate(error)
        else:
            log.warning("kafka consumer: %s", error.str())

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        # librdkafka connects lazily: ask for metadata to find out whether a broker answers.
        await _call(self._call_thread, self._consumer.list_topics, None, CALL_TIMEOUT_S)

    def subscribe(self, topics: Sequence[str], callbacks: RebalanceCallbacks) -> None:
        self._callbacks = (callbacks.on_assign, callbacks.on_revoke, callbacks.on_lost)
        self._consumer.subscribe(
            list(topics), on_assign=self._assigned_cb, on_revoke=self._revoked_cb, on_lost=self._lost_cb
        )

    # Rebalance callbacks: on the consume thread, inside consume() or close().

    def _run_callback(self, which: int, partitions: Partitions) -> None:
        assert self._callbacks is not None and self._loop is not None
        future: Future[None] = asyncio.run_coroutine_threadsafe(
            self._callbacks[which](partitions), self._loop
        )
        try:
            future.result(timeout=self._config.rebalance_timeout_ms / 1000)
        except Exception:
            log.exception("the rebalance callback failed; the worker heals its partitions")

    def _assigned_cb(self, consumer: Any, partitions: list[LibTopicPartition]) -> None:
        # Paused until ``poll`` has opened them (see the module docstring).
        added = _ours(partitions)
        if self._incremental:
            # Only the newly added partitions; the ones kept go on being fetched.
            consumer.incremental_assign(partitions)
            self._assigned |= added
        else:
            consumer.assign(partitions)
            self._assigned = added
            self._opening = set()
        if partitions:
            consumer.pause(partitions)
        self._opening |= added
        self._wake_fetchers(consumer, self._assigned - self._opening)  # the kept ones (eager: none)

    def _revoked_cb(self, consumer: Any, partitions: list[LibTopicPartition]) -> None:
        self._give_up(consumer, partitions, 1)

    def _lost_cb(self, consumer: Any, partitions: list[LibTopicPartition]) -> None:
        self._give_up(consumer, partitions, 2)

    def _give_up(self, consumer: Any, partitions: list[LibTopicPartition], which: int) -> None:
        gone = _ours(partitions)
        self._opening -= gone
        self._run_callback(which, gone)
        if self._incremental:
            if partitions:
                consumer.incremental_unassign(partitions)
            self._assigned -= gone
            self._paused -= gone
        else:
            consumer.unassign()
            self._assigned = set()
            self._paused = set()
        self._wake_fetchers(consumer, self._assigned - self._opening)  # the kept ones (eager: none)

    async def _open_assigned(self) -> None:
        opening, self._opening = self._opening, set()
        assert self._callbacks is not None
        try:
            await self._callbacks[0](opening)
        except Exception:
            log.exception("opening partitions failed; the worker heals them")
        ready = [_lib(tp) for tp in opening & self._assigned if tp not in self._paused]
        if ready:
            self._consumer.resume(ready)
            self._wake_fetchers(self._consumer, _ours(ready))

    def _wake_fetchers(self, consumer: Any, partitions: Partitions) -> None:
        """Have librdkafka fetch ``partitions`` again now that they are resumed, not up to a second later.

        librdkafka pauses the whole assignment while a rebalance callback runs and resumes it in
        ``incremental_assign``/``incremental_unassign``; a resume clears a flag but does not wake
        the broker thread that fetches the partition, and one left with nothing to fetch sleeps
        until a request, an answer or its one-second timer wakes it. In a cooperative scale-out
        that held the kept partitions' records back 350-400 ms at each rebalance (docs/benchmarks.md,
        "Kafka, scale-out"). A request to the partitions' leaders wakes their threads: ListOffsets of their
        ends (one per leader, the answer unused), on a thread of its own, so that neither the
        consume thread nor a callback waits for it.
        """
        fetched = [_lib(tp, confluent_kafka.OFFSET_END) for tp in partitions - self._paused]
        if fetched and not self._closing:
            self._wake_thread.submit(self._wake, consumer, fetched)

    def _wake(self, consumer: Any, fetched: list[LibTopicPartition]) -> None:
        if not self._closing:  # queued before stop: librdkafka is not to meet calls while it closes
            consumer.offsets_for_times(fetched, WAKE_TIMEOUT_S)

    def _consume(self, max_records: int, timeout_s: float) -> dict[TopicPartition, list[ConsumedRecord]]:
        # librdkafka's batch call waits out its whole timeout unless it fills the batch, holding
        # records that are already here for up to a poll timeout: take what is queued at once,
        # and when nothing is, wait for the first record only.
        messages = self._consumer.consume(max_records, 0)
        if not messages and timeout_s > 0:
            first = self._consumer.poll(timeout_s)
            if first is not None:
                messages = [first]
                if max_records > 1:
                    messages += self._consumer.consume(max_records - 1, 0)
        batches: dict[TopicPartition, list[ConsumedRecord]] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() in _GROUP_REJECTIONS or error.fatal():
                    raise KafkaException(error)
                log.warning("kafka consumer: %s", error.str())
                continue
            record = _Record(message)
            tp = TopicPartition(record.topic, record.partition)
            batch = batches.get(tp)
            if batch is None:
                batches[tp] = [record]
            else:
                batch.append(record)
        return batches

    async def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[ConsumedRecord]]:
        if self._fatal is not None:
            raise self._fatal
        batches = await _call(self._poll_thread, self._consume, max_records, timeout_ms / 1000)
        if self._opening:
            # Records of these from this very batch predate the seek: the worker skips them.
            await self._open_assigned()
        return batches

    def assignment(self) -> Partitions:
        return set(self._assigned)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if tp not in self._assigned:
            raise PartitionNotAssignedError(f"{tp} is not assigned")
        try:
            self._consumer.seek(_lib(tp, offset))
        except KafkaException as exc:
            raise _translated(exc) from exc

    def pause(self, tp: TopicPartition) -> None:
        self._consumer.pause([_lib(tp)])
        self._paused.add(tp)

    def resume(self, tp: TopicPartition) -> None:
        self._paused.discard(tp)
        if tp in self._assigned and tp not in self._opening:  # an opening one resumes once open
            self._consumer.resume([_lib(tp)])
            self._wake_fetchers(self._consumer, {tp})

    def paused(self) -> Partitions:
        return set(self._paused)

    async def committed(self, tp: TopicPartition) -> int | None:
        (found,) = await _call(self._call_thread, self._consumer.committed, [_lib(tp)], CALL_TIMEOUT_S)
        if found.error is not None:  # the partition's own error: its offset says nothing
            raise translate(found.error)
        offset: int = found.offset
        return None if offset < 0 else offset

    async def beginning_offset(self, tp: TopicPartition) -> int:
        low, _high = await _call(
            self._call_thread, self._consumer.get_watermark_offsets, _lib(tp), CALL_TIMEOUT_S
        )
        return int(low)

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        # Cached from the last fetch, no broker call; under read_committed librdkafka keeps the
        # last stable offset there.
        try:
            _low, high = self._consumer.get_watermark_offsets(_lib(tp), cached=True)
        except KafkaException:
            return None
        return int(high) if high >= 0 else None

    async def commit(self, offsets: Offsets) -> None:
        partitions = [_lib(tp, offset) for tp, offset in offsets.items()]
        await _call(self._call_thread, lambda: self._consumer.commit(offsets=partitions, asynchronous=False))

    def group_metadata(self) -> object:
        return self._consumer.consumer_group_metadata()

    def group_id_metadata(self) -> object:
        return self._group_id_metadata

    async def stop(self) -> None:
        self._closing = True
        try:
            # A wake-up under way would hold close() up; it ends within its timeout.
            async with asyncio.timeout(WAKE_TIMEOUT_S + 1):
                await self._wake_thread.run(lambda: None)
        except TimeoutError:
            log.warning("a fetcher wake-up outlived its timeout; closing the consumer anyway")
        try:
            # close() leaves the group, running the revoke callback on this thread.
            await _call(self._poll_thread, self._consumer.close)
        finally:
            self._poll_thread.shutdown()
            self._call_thread.shutdown()
            self._wake_thread.shutdown()


def producer_config(config: ProducerConfig) -> dict[str, Any]:
    return {
        **security_config(config.security),
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": config.client_id,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": config.linger_ms,
        "batch.size": config.batch_bytes,
        "message.max.bytes": config.max_record_bytes + 64 * 1024,  # a batch's framing on top
        "request.timeout.ms": config.request_timeout_ms,
        # The first produce of the next transaction can meet the last one's markers still being
        # written (CONCURRENT_TRANSACTIONS); retry it soon.
        "retry.backoff.ms": config.retry_backoff_ms,
        "compression.type": config.compression.value,
        "delivery.report.only.error": True,
        # Keys hashed as Java clients and aiokafka hash them (librdkafka's default is CRC32): a
        # request keeps one output partition whichever backend writes it, the partition of its
        # input when the counts match (docs/kafka-worker.md, "Output placement").
        "partitioner": "murmur2_random",
    }


class _Deliveries:
    """The first failed delivery since the last ``take`` (reported on a librdkafka thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: LibKafkaError | None = None

    def failed(self, error: LibKafkaError | None, _message: Any) -> None:
        if error is None:
            return
        with self._lock:
            if self._first is None:
                self._first = error

    def take(self) -> DeliveryFailedError | None:
        with self._lock:
            error, self._first = self._first, None
        if error is None:
            return None
        kind = RecordTooLargeError if error.code() in _TOO_LARGE else DeliveryFailedError
        return kind(f"a send failed: {error.name()}: {error.str()}")


class _ProducerBase:
    def __init__(self, settings: dict[str, Any], name: str) -> None:
        self._deliveries = _Deliveries()
        self._producer = confluent_kafka.Producer({**settings, "on_delivery": self._deliveries.failed})
        self._thread = _Thread(name)
        # How long a full queue may hold a send: past it, the broker is not taking records (an
        # outage, a producer in an error state) and the caller's reset beats waiting forever.
        self._queue_full_s = settings["request.timeout.ms"] / 1000

    async def send(self, record: OutgoingRecord) -> None:
        waited_until: float | None = None
        while True:
            try:
                self._producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    partition=record.partition if record.partition is not None else -1,
                    headers=list(record.headers) if record.headers else None,
                )
                return
            except BufferError:
                # The client's queue is full: wait for the broker to take some (backpressure).
                now = time.monotonic()
                if waited_until is None:
                    waited_until = now + self._queue_full_s
                elif now > waited_until:
                    raise DeliveryFailedError(
                        f"the client's queue stayed full for {self._queue_full_s:.0f} s"
                    ) from None
                await self._thread.run(self._producer.poll, 0.05)
            except KafkaException as exc:
                raise _translated(exc) from exc

    async def _stop(self) -> None:
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S + 1):
                await self._thread.run(self._producer.flush, CLOSE_TIMEOUT_S)
        finally:
            self._thread.shutdown()


class ConfluentTransactionalProducer(_ProducerBase):
    def __init__(self, config: ProducerConfig, transactional_id: str) -> None:
        super().__init__(
            {
                **producer_config(config),
                "transactional.id": transactional_id,
                "transaction.timeout.ms": config.transaction_timeout_ms,
            },
            "kafka-txn",
        )
        self.transactional_id = transactional_id
        self._stuck = False
        self._begun_ahead = False  # see _commit

    async def _txn_call(self, timeout_s: float, call: Callable[..., T], *args: Any) -> T:
        """``call`` on the producer's thread, waited for at most ``timeout_s`` plus a margin.

        librdkafka's transactional calls take a timeout, but one was seen not to keep it:
        ``send_offsets_to_transaction`` blocked for minutes while the group rebalanced, holding the
        worker's loop step, its consumer's poll and a stop request. Past the margin the call is
        given up and the producer with it: every later call fails at once, so the worker replaces
        the producer (per partition by reopening it; per worker, ``Transaction.needs_new_producer``),
        and the new one's ``init_transactions`` fences the stuck one.
        """
        self._refuse_if_given_up()
        try:
            async with asyncio.timeout(timeout_s + STUCK_MARGIN_S):
                return await self._thread.run(call, *args)
        except KafkaException as exc:
            raise _translated(exc) from exc
        except asyncio.CancelledError:
            self._stuck = True  # the call runs on; whether it ends the transaction is unknown
            raise
        except TimeoutError:
            self._stuck = True
            raise KafkaClientError(
                f"{self.transactional_id}: a transactional call did not return within "
                f"{timeout_s + STUCK_MARGIN_S:.0f} s; the producer is given up"
            ) from None

    def _refuse_if_given_up(self) -> None:
        if self._stuck:
            raise KafkaClientError(f"{self.transactional_id}: an earlier call never returned")

    async def start(self) -> None:
        await self._txn_call(CALL_TIMEOUT_S, self._producer.init_transactions, CALL_TIMEOUT_S)

    async def begin(self) -> None:
        self._refuse_if_given_up()
        if self._begun_ahead:
            self._begun_ahead = False
            return
        try:
            self._producer.begin_transaction()  # no broker round trip, but one to librdkafka's thread
        except KafkaException as exc:
            raise _translated(exc) from exc

    def _commit(self, offsets: list[LibTopicPartition], group: object) -> CommitTimings:
        t0 = _perf_ms()
        offsets_ms = None
        if offsets:
            self._producer.send_offsets_to_transaction(offsets, group, CALL_TIMEOUT_S)
            offsets_ms = _perf_ms() - t0
        t1 = _perf_ms()
        self._producer.commit_transaction(CALL_TIMEOUT_S)  # flushes first
        end_txn_ms = _perf_ms() - t1
        # The next transaction begins here, off the loop (docs/kafka-worker.md, "The Kafka client layer"); a
        # failure is left for begin() to meet again and report.
        try:
            self._producer.begin_transaction()
            self._begun_ahead = True
        except KafkaException:
            self._begun_ahead = False
        return CommitTimings(None, offsets_ms, end_txn_ms)

    async def commit(self, offsets: Offsets, group: object) -> CommitTimings:
        partitions = [_lib(tp, offset) for tp, offset in offsets.items()]
        try:
            return await self._txn_call(2 * CALL_TIMEOUT_S, self._commit, partitions, group)
        except KafkaClientError as exc:
            failed = self._deliveries.take()  # the first failed send says why (too large, ...)
            if failed is not None:
                raise failed from exc
            raise

    async def abort(self) -> None:
        self._deliveries.take()
        self._begun_ahead = False  # whichever transaction is open, this ends it
        await self._txn_call(CLOSE_TIMEOUT_S, self._producer.abort_transaction, CLOSE_TIMEOUT_S)

    async def stop(self) -> None:
        # Whatever is still queued belongs to a transaction that was aborted, fenced or never
        # committed: drop it rather than wait for deliveries a fenced producer can never make. No
        # flush either: a fenced (fatal) producer's flush waits out its whole timeout, and a
        # worker closing six of them kept SIGTERM waiting a minute.
        self._producer.purge()
        self._thread.shutdown()


class ConfluentProducer(_ProducerBase):
    def __init__(self, config: ProducerConfig) -> None:
        super().__init__(producer_config(config), "kafka-produce")

    async def start(self) -> None:
        pass  # librdkafka connects on the first produce

    async def flush(self) -> None:
        remaining = await self._thread.run(self._producer.flush, CALL_TIMEOUT_S)
        failed = self._deliveries.take()
        if failed is not None:
            raise failed
        if remaining:
            raise DeliveryFailedError(f"{remaining} records not acknowledged within {CALL_TIMEOUT_S:.0f} s")

    async def stop(self) -> None:
        await self._stop()


def _perf_ms() -> float:
    return time.perf_counter() * 1000


class ConfluentReader:
    """A group-less reader (``PartitionReader``) on librdkafka.

    librdkafka wants a ``group.id`` even for a consumer that only assigns: this one is given a
    name of its own, never joins it and never commits to it. A seek right after an assignment
    is refused by librdkafka (the assignment is applied on its own thread later), so ``seek``
    reassigns the one partition at the new offset instead. Its position is librdkafka's (which
    moves past transaction markers and aborted records) once a fetch has run since the seek,
    the seek's offset before.
    """

    def __init__(self, config: ReaderConfig) -> None:
        self._consumer = Consumer(
            {
                **security_config(config.security),
                "bootstrap.servers": config.bootstrap_servers,
                "client.id": config.client_id,
                "group.id": f"{config.client_id}-unjoined",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed" if config.read_committed else "read_uncommitted",
                "error_cb": lambda error: log.warning("kafka reader: %s", error.str()),
            }
        )
        self._thread = _Thread("kafka-reader")
        self._seeked: dict[TopicPartition, int] = {}  # each partition's last seek
        self._unfetched: set[TopicPartition] = set()  # no fetch since the last seek yet

    async def start(self) -> None:
        # librdkafka connects lazily: ask for metadata to find out whether a broker answers.
        await _call(self._thread, self._consumer.list_topics, None, CALL_TIMEOUT_S)

    def assign(self, tps: Sequence[TopicPartition]) -> None:
        self._seeked = {tp: 0 for tp in tps}
        self._unfetched = set(tps)
        self._consumer.assign([_lib(tp, confluent_kafka.OFFSET_BEGINNING) for tp in tps])

    async def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: (await self._watermarks(tp))[0] for tp in tps}

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: (await self._watermarks(tp))[1] for tp in tps}

    async def _watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        watermarks = self._consumer.get_watermark_offsets
        try:
            low, high = await _call(self._thread, watermarks, _lib(tp), CALL_TIMEOUT_S)
        except KafkaClientError:
            # A partition added since this client last read the topic's metadata is unknown to it
            # until its next refresh (minutes): refresh the topic now and ask once more.
            await _call(self._thread, self._consumer.list_topics, tp.topic, CALL_TIMEOUT_S)
            low, high = await _call(self._thread, watermarks, _lib(tp), CALL_TIMEOUT_S)
        return int(low), int(high)

    async def offsets_for_time(
        self, tps: Sequence[TopicPartition], when_ms: int
    ) -> dict[TopicPartition, int | None]:
        query = [_lib(tp, max(0, when_ms)) for tp in tps]
        found = await _call(self._thread, self._consumer.offsets_for_times, query, CALL_TIMEOUT_S)
        return {TopicPartition(p.topic, p.partition): (p.offset if p.offset >= 0 else None) for p in found}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        try:
            self._consumer.incremental_unassign([_lib(tp)])
            self._consumer.incremental_assign([_lib(tp, offset)])
        except KafkaException as exc:
            raise _translated(exc) from exc
        self._seeked[tp] = offset
        self._unfetched.add(tp)

    def _fetch(
        self, wanted: set[TopicPartition], timeout_s: float
    ) -> dict[TopicPartition, list[ConsumedRecord]]:
        batches: dict[TopicPartition, list[ConsumedRecord]] = {}
        for message in self._consumer.consume(10_000, timeout_s):
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                log.warning("kafka reader: %s", error.str())
                continue
            record = _Record(message)
            tp = TopicPartition(record.topic, record.partition)
            if tp in wanted:
                batches.setdefault(tp, []).append(record)
        return batches

    async def fetch(
        self, tps: Sequence[TopicPartition], timeout_ms: int
    ) -> dict[TopicPartition, list[ConsumedRecord]]:
        wanted = set(tps)
        batches = await _call(self._thread, self._fetch, wanted, timeout_ms / 1000)
        self._unfetched -= wanted
        return batches

    async def position(self, tp: TopicPartition) -> int:
        seeked = self._seeked.get(tp, 0)
        if tp in self._unfetched:
            return seeked
        (found,) = self._consumer.position([_lib(tp)])
        offset: int = found.offset
        return max(offset, seeked)  # librdkafka's is invalid (negative) until a record is consumed

    async def stop(self) -> None:
        try:
            await _call(self._thread, self._consumer.close)
        finally:
            self._thread.shutdown()


class ConfluentClient:
    kind = ClientKind.CONFLUENT
    supports_kip447 = True

    def __init__(self, security: KafkaSecurity) -> None:
        security_config(security)  # refuses what it cannot map, at start-up
        self._security = security

    def consumer(self, config: ConsumerConfig) -> ConfluentConsumer:
        return ConfluentConsumer(config)

    def transactional_producer(
        self, config: ProducerConfig, transactional_id: str
    ) -> ConfluentTransactionalProducer:
        return ConfluentTransactionalProducer(config, transactional_id)

    def producer(self, config: ProducerConfig) -> ConfluentProducer:
        return ConfluentProducer(config)

    def reader(self, config: ReaderConfig) -> ConfluentReader:
        return ConfluentReader(config)
