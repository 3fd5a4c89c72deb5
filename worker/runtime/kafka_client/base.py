"""What the runtime needs from a Kafka client, as typed protocols with their contracts.

The runtime (``worker``, ``partition``, ``delivery``, ``rebalance``, ``topics``) talks only to
these; a backend (``aiokafka_backend``, ``confluent_backend``) adapts one client library to them
and maps that library's errors into ``worker.errors`` (``KafkaClientError`` and its subclasses),
so no library type or exception reaches the runtime.

Contracts every backend keeps:

* **Rebalance callbacks** (``subscribe``): with an incremental protocol (cooperative-sticky, KIP-848)
  ``on_revoke`` and ``on_assign`` name only the partitions that move, and the others keep being
  polled throughout; with an eager one ``on_revoke`` names every partition. ``on_revoke`` is
  awaited before the member gives the partitions up (a revoked partition's transaction commits
  before its next owner starts),
  ``on_assign`` before the first record of the new partitions is returned by ``poll``, and
  ``on_lost`` when the partitions are already gone (session expired, fenced): nothing of theirs
  may be committed any more. A callback's exception is logged, not raised (the worker heals).
* **poll** returns at most ``max_records`` records of assigned, not paused partitions, each
  partition's in offset order; after ``seek(tp, n)`` records of ``tp`` below ``n`` may still
  come (fetched before the seek): the caller skips them by offset.
* **Transactions**: every record sent between ``begin`` and ``commit`` and the offsets passed
  to ``commit`` become visible together, or ``commit`` raises; a failed send fails the commit
  (``DeliveryFailedError``; ``RecordTooLargeError`` when a topic refused a record's size).
  After any exception the caller aborts and never reuses the transaction; after
  ``ProducerFencedError`` it does not even abort (another owner did).
* **Fencing**: ``start`` of a transactional producer aborts whatever an earlier producer with
  the same transactional id left open. With KIP-447 (``group_metadata`` carries the group's
  generation), ``commit`` with offsets of partitions this member no longer owns is refused by
  the group coordinator: that is what lets one producer serve every partition of a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

# The choices are settings' types too: they live in the leaf module the settings import.
from worker.kafka_config import AssignmentStrategy as AssignmentStrategy
from worker.kafka_config import ClientKind as ClientKind
from worker.kafka_config import CompressionType as CompressionType
from worker.kafka_config import GroupProtocol as GroupProtocol
from worker.kafka_config import TransactionalIdMode as TransactionalIdMode
from worker.kafka_config import transactional_id as transactional_id
from worker.runtime.security.kafka_security import KafkaSecurity

MAX_MESSAGE_BYTES = "max.message.bytes"  # the topic configuration that caps a record's size


class TopicPartition(NamedTuple):
    """A partition of a topic (a plain tuple: equal to either library's own)."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """A record to send (``records`` makes the worker's: outputs, dead letters)."""

    topic: str
    key: bytes | None
    value: bytes | None  # None: a tombstone
    partition: int | None = None  # None: the producer hashes the key
    headers: tuple[tuple[str, bytes], ...] = ()  # trace context (``tracing``)


class ConsumedRecord(Protocol):
    """A record from ``GroupConsumer.poll``; aiokafka's ``ConsumerRecord`` has this shape."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...  # create time, ms since the epoch
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


Partitions = set[TopicPartition]
PartitionsCallback = Callable[[Partitions], Coroutine[Any, Any, None]]
Offsets = Mapping[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    bootstrap_servers: str
    client_id: str
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    heartbeat_interval_ms: int
    max_poll_records: int
    metadata_max_age_ms: int
    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    assignment_strategy: AssignmentStrategy = AssignmentStrategy.COOPERATIVE_STICKY
    group_protocol: GroupProtocol = GroupProtocol.CLASSIC
    group_instance_id: str | None = None  # static membership (KIP-345)
    # How long the broker may hold a fetch for ``fetch_min_bytes`` (the defaults of both libraries:
    # answer as soon as there is a byte).
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    bootstrap_servers: str
    client_id: str
    max_record_bytes: int
    batch_bytes: int
    linger_ms: int
    request_timeout_ms: int
    retry_backoff_ms: int
    transaction_timeout_ms: int
    compression: CompressionType
    security: KafkaSecurity = field(default_factory=KafkaSecurity)


@dataclass(frozen=True, slots=True)
class RebalanceCallbacks:
    """What a group member is told as partitions move: given, given up in order, or lost (another
    member may own them already: their work must not be committed)."""

    on_assign: PartitionsCallback
    on_revoke: PartitionsCallback
    on_lost: PartitionsCallback


@dataclass(frozen=True, slots=True)
class CommitTimings:
    """Where a transaction's commit spent its time, in ms from its start (what a backend knows)."""

    flushed_ms: float | None = None  # every record acknowledged
    offsets_ms: float | None = None  # the offsets added to the transaction
    end_txn_ms: float | None = None  # EndTxn itself


class GroupConsumer(Protocol):
    """A consumer-group member (``read_committed``, manual offsets, earliest when none)."""

    async def start(self) -> None:
        """Connect; raises ``KafkaUnreachableError`` when no broker answers."""

    def subscribe(self, topics: Sequence[str], callbacks: RebalanceCallbacks) -> None: ...

    async def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[ConsumedRecord]]:
        """A batch; raises ``GroupRejectedError`` for what only a configuration change fixes."""

    def assignment(self) -> Partitions: ...

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Next record of ``tp`` to fetch; ``PartitionNotAssignedError`` if ``tp`` is not assigned."""

    def pause(self, tp: TopicPartition) -> None: ...

    def resume(self, tp: TopicPartition) -> None:
        """Fetch ``tp`` again; a partition still being opened stays paused until it is open."""

    def paused(self) -> Partitions: ...

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp``, ``None`` when it has none."""

    async def beginning_offset(self, tp: TopicPartition) -> int: ...

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        """As of the last fetch, without a broker call; ``None`` when not known yet."""

    async def commit(self, offsets: Offsets) -> None:
        """Commit offsets directly (at-least-once)."""

    def group_metadata(self) -> object:
        """What ``TransactionalProducer.commit`` needs to add offsets for this group (opaque)."""

    def group_id_metadata(self) -> object:
        """The group alone, without generation or member (pre-KIP-447): the coordinator takes such
        offsets at any time, so a commit never races a rebalance's generation bump; only for
        producers fenced by their transactional id (one per input partition)."""

    async def stop(self) -> None:
        """Leave the group (running ``on_revoke``) and close."""


class TransactionalProducer(Protocol):
    transactional_id: str

    async def start(self) -> None:
        """Connect and ``init_transactions`` (fences earlier producers with this id)."""

    async def begin(self) -> None: ...

    async def send(self, record: OutgoingRecord) -> None:
        """Queue one record into the open transaction; blocks while the client's buffer is full."""

    async def commit(self, offsets: Offsets, group: object) -> CommitTimings:
        """Flush, add ``offsets`` for ``group`` (``GroupConsumer.group_metadata()``), EndTxn(commit)."""

    async def abort(self) -> None: ...

    async def stop(self) -> None: ...


class Producer(Protocol):
    """An idempotent producer without transactions (at-least-once)."""

    async def start(self) -> None: ...

    async def send(self, record: OutgoingRecord) -> None: ...

    async def flush(self) -> None:
        """Wait for every record sent so far; ``DeliveryFailedError`` if one failed."""

    async def stop(self) -> None: ...


class AckedProducer(Producer, Protocol):
    """A producer shared by concurrent senders, each waiting for its own record only (the
    gateway: ``flush`` would wait for, and report the failures of, everyone's records)."""

    async def send_and_wait(self, record: OutgoingRecord) -> None:
        """Send ``record`` and wait until it is acknowledged; ``DeliveryFailedError`` if it failed."""


@dataclass(frozen=True, slots=True)
class ReaderConfig:
    bootstrap_servers: str
    client_id: str
    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    # False only to ask for high watermarks: a read_committed reader's end offsets are the last
    # stable offsets (the first offset of the oldest open transaction).
    read_committed: bool = True


class PartitionReader(Protocol):
    """A group-less reader of explicit partitions and offset ranges (a restore, ``audit``,
    ``dlq replay``, the demo); joins no group and commits nothing. ``ranges.RangeReader`` reads
    whole ranges with it."""

    async def start(self) -> None: ...

    def assign(self, tps: Sequence[TopicPartition]) -> None: ...

    async def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def offsets_for_time(
        self, tps: Sequence[TopicPartition], when_ms: int
    ) -> dict[TopicPartition, int | None]:
        """The first offset at or after ``when_ms`` per partition, ``None`` where there is none."""

    def seek(self, tp: TopicPartition, offset: int) -> None: ...

    async def fetch(
        self, tps: Sequence[TopicPartition], timeout_ms: int
    ) -> dict[TopicPartition, list[ConsumedRecord]]: ...

    async def position(self, tp: TopicPartition) -> int:
        """Next offset to read; moves past transaction markers and aborted records too."""

    async def stop(self) -> None: ...


class KafkaClient(Protocol):
    """A backend: builds the clients of one library."""

    kind: ClientKind
    supports_kip447: bool  # offsets carry the group generation: per-worker transactions are safe

    def consumer(self, config: ConsumerConfig) -> GroupConsumer: ...

    def transactional_producer(
        self, config: ProducerConfig, transactional_id: str
    ) -> TransactionalProducer: ...

    def producer(self, config: ProducerConfig) -> Producer: ...

    def reader(self, config: ReaderConfig) -> PartitionReader: ...
