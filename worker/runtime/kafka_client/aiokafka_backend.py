"""The aiokafka backend: pure asyncio, the project's long-standing client.

No KIP-447 (aiokafka#844): ``send_offsets_to_transaction`` takes only the group id, so a zombie
is fenced by a stable transactional id per input partition, never by the group generation:
``supports_kip447`` is false and ``--transactional-id-mode per-worker`` is refused with it.
aiokafka keeps one produce request in flight per connection, so one producer per partition
(both modes of ``delivery``) is also what lets it use more than one request at a time.

Admin calls (``topics create``, the start-up checks) always go through aiokafka, whichever
backend serves the data path: they run a handful of times per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import aiokafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import (
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    IllegalStateError,
    InconsistentGroupProtocolError,
    InvalidGroupIdError,
    InvalidSessionTimeoutError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NoError,
    NotCoordinatorError,
    ProducerFenced,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    for_code,
)
from aiokafka.protocol.commit import OffsetFetchRequest

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
    MAX_MESSAGE_BYTES,
    AssignmentStrategy,
    ClientKind,
    CommitTimings,
    CompressionType,
    ConsumedRecord,
    ConsumerConfig,
    Offsets,
    OutgoingRecord,
    Partitions,
    PartitionsCallback,
    ProducerConfig,
    ReaderConfig,
    RebalanceCallbacks,
    TopicPartition,
)

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0
_TOPIC_ALREADY_EXISTS = 36

_GROUP_REJECTIONS: tuple[tuple[type[KafkaError], GroupRejectedError.Reason], ...] = (
    (InvalidSessionTimeoutError, GroupRejectedError.Reason.SESSION_TIMEOUT),
    (InvalidGroupIdError, GroupRejectedError.Reason.GROUP_ID),
    (InconsistentGroupProtocolError, GroupRejectedError.Reason.PROTOCOL),
    (GroupAuthorizationFailedError, GroupRejectedError.Reason.GROUP_AUTHORIZATION),
    (TopicAuthorizationFailedError, GroupRejectedError.Reason.TOPIC_AUTHORIZATION),
)


def translate(exc: KafkaError) -> KafkaClientError:
    """aiokafka's exception as the project's (the caller chains the original as the cause)."""
    if isinstance(exc, KafkaConnectionError):
        return KafkaUnreachableError(str(exc))
    if isinstance(exc, ProducerFenced):
        return ProducerFencedError(repr(exc))
    if isinstance(exc, MessageSizeTooLargeError | RecordListTooLargeError):
        return RecordTooLargeError(repr(exc))
    if isinstance(exc, IllegalStateError):
        return PartitionNotAssignedError(repr(exc))
    for kind, reason in _GROUP_REJECTIONS:
        if isinstance(exc, kind):
            return GroupRejectedError(reason, repr(exc))
    return KafkaClientError(repr(exc))


@contextlib.contextmanager
def mapped_errors() -> Iterator[None]:
    try:
        yield
    except KafkaError as exc:
        raise translate(exc) from exc


def _atp(tp: TopicPartition) -> aiokafka.TopicPartition:
    return aiokafka.TopicPartition(tp.topic, tp.partition)


def _ours(tps: Any) -> Partitions:
    return {TopicPartition(tp.topic, tp.partition) for tp in tps}


def assignor(strategy: AssignmentStrategy) -> Any:
    """aiokafka's assignor for ``strategy``; it has no cooperative one (aiokafka#1126), so
    cooperative-sticky, the default, falls back to aiokafka's own eager default, roundrobin."""
    if strategy is AssignmentStrategy.RANGE:
        return RangePartitionAssignor
    if strategy is AssignmentStrategy.COOPERATIVE_STICKY:
        log.warning(
            "aiokafka has no cooperative-sticky assignment (aiokafka#1126): using its eager roundrobin; "
            "every partition stops at each rebalance"
        )
    return RoundRobinPartitionAssignor


def consumer_options(config: ConsumerConfig, security: Mapping[str, Any]) -> dict[str, Any]:
    # --group-protocol consumer is refused with aiokafka by the settings (classic only).
    return {
        **security,
        "bootstrap_servers": config.bootstrap_servers,
        "client_id": config.client_id,
        "group_id": config.group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        # Inputs may themselves be written transactionally: never act on aborted ones.
        "isolation_level": "read_committed",
        "session_timeout_ms": config.session_timeout_ms,
        "rebalance_timeout_ms": config.rebalance_timeout_ms,
        "metadata_max_age_ms": config.metadata_max_age_ms,
        "heartbeat_interval_ms": config.heartbeat_interval_ms,
        "max_poll_records": config.max_poll_records,
        "fetch_min_bytes": config.fetch_min_bytes,
        "fetch_max_wait_ms": config.fetch_max_wait_ms,
        "partition_assignment_strategy": (assignor(config.assignment_strategy),),
        # Static membership (KIP-345); a static member leaves no group on stop.
        "group_instance_id": config.group_instance_id,
    }


def compression_type(codec: CompressionType) -> str | None:
    """aiokafka's ``compression_type`` for ``codec`` (it names no codec ``None``)."""
    return None if codec is CompressionType.NONE else codec.value


def producer_options(config: ProducerConfig, security: Mapping[str, Any]) -> dict[str, Any]:
    """``AIOKafkaProducer`` keyword arguments; ``security`` is ``KafkaSecurity.client_kwargs()``."""
    return {
        **security,
        "bootstrap_servers": config.bootstrap_servers,
        "client_id": config.client_id,
        "acks": "all",
        "enable_idempotence": True,
        "max_batch_size": config.batch_bytes,
        "linger_ms": config.linger_ms,
        "request_timeout_ms": config.request_timeout_ms,
        "max_request_size": config.max_record_bytes,
        # The first request of the next transaction often meets CONCURRENT_TRANSACTIONS while the
        # broker writes the last one's markers; the 100 ms default backoff would add 100 ms per commit.
        "retry_backoff_ms": config.retry_backoff_ms,
        "compression_type": compression_type(config.compression),
    }


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    """aiokafka awaits these before it rejoins (revoke) and before it fetches (assign)."""

    def __init__(self, on_assign: PartitionsCallback, on_revoke: PartitionsCallback) -> None:
        self._on_assign = on_assign
        self._on_revoke = on_revoke

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._on_revoke(_ours(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._on_assign(_ours(assigned))


class AiokafkaConsumer:
    def __init__(self, config: ConsumerConfig, security: Mapping[str, Any] | None = None) -> None:
        options = consumer_options(config, security or config.security.client_kwargs())
        self.group_id = config.group_id
        self._consumer = AIOKafkaConsumer(**options)

    async def start(self) -> None:
        with mapped_errors():
            await self._consumer.start()

    def subscribe(self, topics: Sequence[str], callbacks: RebalanceCallbacks) -> None:
        # aiokafka reports a lost assignment as a revocation; the revoke's commit then fails
        # (fenced or rebalance in progress) and the partition is reset, which is what lost means.
        listener = _Listener(callbacks.on_assign, callbacks.on_revoke)
        self._consumer.subscribe(list(topics), listener=listener)

    async def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[ConsumedRecord]]:
        with mapped_errors():
            batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        return {TopicPartition(tp.topic, tp.partition): records for tp, records in batches.items()}

    def assignment(self) -> Partitions:
        return _ours(self._consumer.assignment())

    def seek(self, tp: TopicPartition, offset: int) -> None:
        with mapped_errors():
            self._consumer.seek(_atp(tp), offset)

    def pause(self, tp: TopicPartition) -> None:
        self._consumer.pause(_atp(tp))

    def resume(self, tp: TopicPartition) -> None:
        self._consumer.resume(_atp(tp))

    def paused(self) -> Partitions:
        return _ours(self._consumer.paused())

    async def committed(self, tp: TopicPartition) -> int | None:
        # Not aiokafka's committed(): see fetch_committed.
        with mapped_errors():
            return await fetch_committed(self._consumer._coordinator, self.group_id, _atp(tp))

    async def beginning_offset(self, tp: TopicPartition) -> int:
        with mapped_errors():
            offsets = await self._consumer.beginning_offsets([_atp(tp)])
        return int(offsets[_atp(tp)])

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        if tp not in self._consumer.assignment():  # aiokafka asserts on an unassigned partition
            return None
        lso: int | None = self._consumer.last_stable_offset(_atp(tp))
        return lso if lso is not None and lso >= 0 else None  # -1: no fetch yet

    async def commit(self, offsets: Offsets) -> None:
        with mapped_errors():
            await self._consumer.commit({_atp(tp): offset for tp, offset in offsets.items()})

    def group_metadata(self) -> object:
        return self.group_id

    def group_id_metadata(self) -> object:
        return self.group_id  # aiokafka sends nothing more anyway

    async def stop(self) -> None:
        with mapped_errors():
            await self._consumer.stop()


COMMITTED_DEADLINE_S = 60.0


async def fetch_committed(coordinator: Any, group_id: str, tp: aiokafka.TopicPartition) -> int | None:
    """The group's committed offset of ``tp``; ``None`` only when the broker says there is none.

    aiokafka's ``committed()`` reads OffsetFetch errors per partition only. From version 2 a broker
    puts a group-level error at the top of the response with no partitions (NOT_COORDINATOR while
    it shuts down or the coordinator moves, COORDINATOR_LOAD_IN_PROGRESS as it starts), which
    aiokafka returns as "nothing committed": a partition reopened on that answer started from the
    beginning and wrote its outputs again. Here every error is read and the retriable ones retried
    (through the consumer's own coordinator connection) for at most ``COMMITTED_DEADLINE_S``.
    """
    request = OffsetFetchRequest(group_id, [(tp.topic, [tp.partition])])
    backoff_s = coordinator._retry_backoff_ms / 1000
    try:
        async with asyncio.timeout(COMMITTED_DEADLINE_S):  # the lookup itself retries without end
            while True:
                try:
                    await coordinator.ensure_coordinator_known()
                    if coordinator.coordinator_id is None:  # it returns so only once the consumer closes
                        raise KafkaError("the consumer is closing")
                    return _committed_in(await coordinator._send_req(request), tp)
                except KafkaError as exc:
                    if not exc.retriable:
                        raise
                    if isinstance(exc, NotCoordinatorError | CoordinatorNotAvailableError):
                        coordinator.coordinator_dead()
                    await asyncio.sleep(backoff_s)
    except TimeoutError as exc:
        raise KafkaTimeoutError(f"no committed offset of {tp} in {COMMITTED_DEADLINE_S:.0f} s") from exc


def _committed_in(response: Any, tp: aiokafka.TopicPartition) -> int | None:
    top = for_code(getattr(response, "error_code", 0))  # versions 0 and 1 have no top-level error
    if top is not NoError:
        raise top()
    for topic, partitions in response.topics:
        for partition, offset, _metadata, code in partitions:
            if (topic, partition) == (tp.topic, tp.partition):
                error = for_code(code)
                if error is not NoError:
                    raise error()
                return None if offset < 0 else int(offset)
    raise KafkaError(f"OffsetFetch answered without {tp.topic}-{tp.partition}")


def _first_failure(futures: list[asyncio.Future[Any]]) -> DeliveryFailedError | None:
    first: BaseException | None = None
    for fut in futures:  # every future is looked at, so asyncio never reports one as unretrieved
        exc: BaseException | None = (
            DeliveryFailedError("a send was cancelled") if fut.cancelled() else fut.exception()
        )
        if exc is not None and first is None:
            first = exc
    if first is None:
        return None
    kind = (
        RecordTooLargeError if isinstance(first, MessageSizeTooLargeError | RecordListTooLargeError) else None
    )
    error = (kind or DeliveryFailedError)(f"a send failed: {first!r}")
    error.__cause__ = first
    return error


def _discard(futures: list[asyncio.Future[Any]]) -> None:
    """Forget sends of an aborted transaction without asyncio's "exception never retrieved"."""
    for fut in futures:
        if fut.done():
            if not fut.cancelled():
                fut.exception()
        else:
            fut.add_done_callback(lambda f: None if f.cancelled() else f.exception())


async def _send(producer: Any, record: OutgoingRecord) -> asyncio.Future[Any]:
    with mapped_errors():
        fut: asyncio.Future[Any] = await producer.send(
            record.topic,
            value=record.value,
            key=record.key,
            partition=record.partition,
            headers=list(record.headers) if record.headers else None,  # trace context
        )
    return fut


async def _timed(step: Any) -> float:
    """Await ``step``; the time it finished, in ms on the perf_counter clock."""
    if step is not None:
        await step
    return asyncio.get_running_loop().time() * 1000


class AiokafkaTransactionalProducer:
    def __init__(
        self, config: ProducerConfig, transactional_id: str, security: Mapping[str, Any] | None = None
    ) -> None:
        self.transactional_id = transactional_id
        self._producer = AIOKafkaProducer(
            **producer_options(config, security or config.security.client_kwargs()),
            transactional_id=transactional_id,
            transaction_timeout_ms=config.transaction_timeout_ms,
        )
        self._futures: list[asyncio.Future[Any]] = []

    async def start(self) -> None:
        with mapped_errors():
            await self._producer.start()

    async def begin(self) -> None:
        with mapped_errors():
            await self._producer.begin_transaction()

    async def send(self, record: OutgoingRecord) -> None:
        self._futures.append(await _send(self._producer, record))

    async def commit(self, offsets: Offsets, group: object) -> CommitTimings:
        loop = asyncio.get_running_loop()
        t0 = loop.time() * 1000
        with mapped_errors():
            # commit_transaction flushes too, but does not tell which send failed; a failed send must
            # abort the transaction rather than commit a gap. The offsets travel to the coordinators
            # while the records are still being acknowledged; an aborted transaction discards both.
            added = (
                self._producer.send_offsets_to_transaction(
                    {_atp(tp): offset for tp, offset in offsets.items()}, str(group)
                )
                if offsets
                else None
            )
            flushed, offsets_added = await asyncio.gather(_timed(self._producer.flush()), _timed(added))
            futures, self._futures = self._futures, []
            failure = _first_failure(futures)
            if failure is not None:
                raise failure
            t1 = loop.time() * 1000
            await self._producer.commit_transaction()
        return CommitTimings(flushed - t0, offsets_added - t0, loop.time() * 1000 - t1)

    async def abort(self) -> None:
        _discard(self._futures)
        self._futures = []
        with mapped_errors():
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._producer.abort_transaction()

    async def stop(self) -> None:
        with mapped_errors():
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._producer.stop()


class AiokafkaProducer:
    def __init__(self, config: ProducerConfig, security: Mapping[str, Any] | None = None) -> None:
        self._producer = AIOKafkaProducer(
            **producer_options(config, security or config.security.client_kwargs())
        )
        self._futures: list[asyncio.Future[Any]] = []

    async def start(self) -> None:
        with mapped_errors():
            await self._producer.start()

    async def send(self, record: OutgoingRecord) -> None:
        self._futures.append(await _send(self._producer, record))

    async def send_and_wait(self, record: OutgoingRecord) -> None:
        # Outside ``_futures``: a concurrent ``flush`` neither waits for it nor reports its failure.
        fut = await _send(self._producer, record)
        try:
            await asyncio.wait([fut])
        except BaseException:  # cancelled: its outcome is nobody's any more
            _discard([fut])
            raise
        failure = _first_failure([fut])
        if failure is not None:
            raise failure

    async def flush(self) -> None:
        futures, self._futures = self._futures, []
        if futures:
            await asyncio.wait(futures)
        failure = _first_failure(futures)
        if failure is not None:
            raise failure

    async def stop(self) -> None:
        _discard(self._futures)
        self._futures = []
        with mapped_errors():
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._producer.stop()


class AiokafkaReader:
    def __init__(
        self,
        bootstrap_servers: str,
        client_id: str,
        security: Mapping[str, Any],
        *,
        read_committed: bool = True,
    ) -> None:
        self._consumer = AIOKafkaConsumer(
            **security,
            bootstrap_servers=bootstrap_servers,
            client_id=client_id,
            group_id=None,  # reads by explicit offsets and commits nothing
            enable_auto_commit=False,
            isolation_level="read_committed" if read_committed else "read_uncommitted",
            auto_offset_reset="earliest",
        )

    async def start(self) -> None:
        with mapped_errors():
            await self._consumer.start()

    def assign(self, tps: Sequence[TopicPartition]) -> None:
        self._consumer.assign([_atp(tp) for tp in tps])

    async def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        with mapped_errors():
            found = await self._consumer.beginning_offsets([_atp(tp) for tp in tps])
        return {TopicPartition(tp.topic, tp.partition): int(offset) for tp, offset in found.items()}

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        with mapped_errors():
            found = await self._consumer.end_offsets([_atp(tp) for tp in tps])
        return {TopicPartition(tp.topic, tp.partition): int(offset) for tp, offset in found.items()}

    async def offsets_for_time(
        self, tps: Sequence[TopicPartition], when_ms: int
    ) -> dict[TopicPartition, int | None]:
        with mapped_errors():
            found = await self._consumer.offsets_for_times({_atp(tp): max(0, when_ms) for tp in tps})
        return {tp: (found[_atp(tp)].offset if found.get(_atp(tp)) is not None else None) for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        with mapped_errors():
            self._consumer.seek(_atp(tp), offset)

    async def fetch(
        self, tps: Sequence[TopicPartition], timeout_ms: int
    ) -> dict[TopicPartition, list[ConsumedRecord]]:
        with mapped_errors():
            batches = await self._consumer.getmany(*(_atp(tp) for tp in tps), timeout_ms=timeout_ms)
        return {TopicPartition(tp.topic, tp.partition): records for tp, records in batches.items()}

    async def position(self, tp: TopicPartition) -> int:
        with mapped_errors():
            return int(await self._consumer.position(_atp(tp)))

    async def stop(self) -> None:
        with mapped_errors():
            await self._consumer.stop()


class AiokafkaClient:
    kind = ClientKind.AIOKAFKA
    supports_kip447 = False

    def __init__(self, security: Mapping[str, Any] | None = None) -> None:
        # One ``client_kwargs()`` for every client: one SSLContext, one shared OAUTHBEARER token.
        self._security = security

    def consumer(self, config: ConsumerConfig) -> AiokafkaConsumer:
        return AiokafkaConsumer(config, self._security)

    def transactional_producer(
        self, config: ProducerConfig, transactional_id: str
    ) -> AiokafkaTransactionalProducer:
        return AiokafkaTransactionalProducer(config, transactional_id, self._security)

    def producer(self, config: ProducerConfig) -> AiokafkaProducer:
        return AiokafkaProducer(config, self._security)

    def reader(self, config: ReaderConfig) -> AiokafkaReader:
        security = self._security if self._security is not None else config.security.client_kwargs()
        return AiokafkaReader(
            config.bootstrap_servers, config.client_id, security, read_committed=config.read_committed
        )


# --- admin ----------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _admin(bootstrap: str, security: Mapping[str, Any] | None) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(security or {}))
    with mapped_errors():
        await admin.start()
    try:
        with mapped_errors():
            yield admin
    finally:
        await admin.close()


async def create_topics(
    bootstrap: str,
    specs: Sequence[tuple[str, int, int, dict[str, str]]],
    timeout_ms: int,
    security: Mapping[str, Any] | None = None,
) -> tuple[list[str], list[str]]:
    """Create ``(name, partitions, replication factor, config)`` topics: ``(created, existing)``."""
    async with _admin(bootstrap, security) as admin:
        response = await admin.create_topics(
            [NewTopic(name, n, rf, topic_configs=config) for name, n, rf, config in specs],
            timeout_ms=timeout_ms,
        )
    created, existing = [], []
    for entry in response.topic_errors:
        name, code = entry[0], entry[1]
        if code == 0:
            created.append(name)
        elif code == _TOPIC_ALREADY_EXISTS:
            existing.append(name)
        else:
            message = entry[2] if len(entry) > 2 else ""
            raise ConfigurationError(f"cannot create topic {name!r}: error {code} {message}")
    return created, existing


async def partition_leaders(
    bootstrap: str, names: Sequence[str], security: Mapping[str, Any] | None = None
) -> dict[str, list[int]]:
    """The leader (-1: none) of each partition of each existing topic among ``names``."""
    async with _admin(bootstrap, security) as admin:
        described = await admin.describe_topics(list(names))
    leaders: dict[str, list[int]] = {}
    for topic in described:
        if topic.get("error_code") == 0:
            leaders[topic["topic"]] = [p.get("leader", -1) for p in topic.get("partitions", [])]
    return leaders


async def max_message_bytes(
    bootstrap: str, names: Sequence[str], security: Mapping[str, Any] | None = None
) -> dict[str, int | None]:
    """``max.message.bytes`` of each topic (``None`` where it cannot be read)."""
    async with _admin(bootstrap, security) as admin:
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, name, {MAX_MESSAGE_BYTES: None}) for name in names
        ]
        return parse_max_message_bytes(await admin.describe_configs(resources))


def parse_max_message_bytes(responses: list[Any]) -> dict[str, int | None]:
    """``max.message.bytes`` per topic from ``AIOKafkaAdminClient.describe_configs`` responses."""
    limits: dict[str, int | None] = {}
    for response in responses:
        for error_code, _message, _type, name, entries in response.resources:
            value = None
            if error_code == 0:
                value = next(
                    (int(e[1]) for e in entries if e[0] == MAX_MESSAGE_BYTES and e[1] is not None), None
                )
            limits[name] = value
    return limits


async def broker_problem(bootstrap: str, timeout_ms: int = 5000) -> str | None:
    """``None`` when a client can bootstrap and sees a broker, else why not."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        return None if cluster.get("brokers") else "no brokers in the cluster metadata"
    except Exception as exc:  # noqa: BLE001 - any connection error means "not (yet)"
        return repr(exc)
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def delete_topics_and_group(
    bootstrap: str, topics: Sequence[str], group: str, timeout_ms: int = 10_000
) -> None:
    """Delete ``topics``, then the (empty) consumer group ``group``; the group's deletion may fail."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
    await admin.start()
    try:
        await admin.delete_topics(list(topics), timeout_ms=timeout_ms)
        # aiokafka has no public delete_consumer_groups, hence the raw request.
        with contextlib.suppress(Exception):
            from aiokafka.protocol.admin import DeleteGroupsRequest

            await admin._send_request(DeleteGroupsRequest([group]), await admin.find_coordinator(group))
    finally:
        await admin.close()


def _assigned_partitions(raw: bytes) -> list[int]:
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    if not raw:
        return []
    assignment = ConsumerProtocolMemberAssignment.decode(raw)
    return sorted(p for _topic, partitions in assignment.assignment for p in partitions)


class GroupView:
    """The broker's view of a classic consumer group: its state and each member's partitions."""

    def __init__(self, bootstrap: str, timeout_ms: int = 5000) -> None:
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)

    async def start(self) -> None:
        with mapped_errors():
            await self._admin.start()

    async def members(self, group: str) -> tuple[str, dict[str, list[int]]]:
        """The group's state and each member's client id -> assigned partitions."""
        with mapped_errors():
            response = (await self._admin.describe_consumer_groups([group]))[0]
        # DescribeGroupsResponse group: (error_code, group, state, protocol_type, protocol, members, ...)
        _error, _name, state, _ptype, _protocol, members = response.groups[0][:6]
        # member: (member_id, client_id, client_host, member_metadata, member_assignment)
        return str(state), {str(m[1]): _assigned_partitions(m[4]) for m in members}

    async def stop(self) -> None:
        await self._admin.close()
