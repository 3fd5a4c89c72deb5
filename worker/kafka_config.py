"""The types the Kafka settings are made of, and the limits every Kafka client of the worker is held
to: client and group choices, security protocol and SASL mechanism, ``Secret``, topic names.

A leaf module (no Kafka library, no runtime import), so ``worker.settings`` declares its fields with
these types while the runtime (``kafka_client``, ``kafka_security``, ``topics``, ``delivery``) uses
the same ones.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# --- client and group choices -------------------------------------------------------------------


class ClientKind(enum.Enum):
    AIOKAFKA = "aiokafka"
    CONFLUENT = "confluent"


def transactional_id(group_id: str, topic: str, owner: int | str) -> str:
    """A transactional producer's id, for the input partition (or the worker) ``owner`` of ``topic``
    in ``group_id``: stable across restarts, so a new producer with it fences the last one."""
    return f"{group_id}-{topic}-{owner}"


class TransactionalIdMode(enum.Enum):
    # One transactional producer per input partition, id "{group}-{topic}-{partition}": the next
    # owner's init_transactions fences the last one. Works without KIP-447 (aiokafka, Redpanda).
    PER_PARTITION = "per-partition"
    # One per worker; zombies are fenced by the group generation in the offsets (KIP-447).
    PER_WORKER = "per-worker"


class AssignmentStrategy(enum.Enum):
    # Incremental (KIP-429): a rebalance revokes only the partitions that move.
    COOPERATIVE_STICKY = "cooperative-sticky"
    # Eager: every member gives up every partition at each rebalance.
    RANGE = "range"
    ROUNDROBIN = "roundrobin"

    @property
    def incremental(self) -> bool:
        return self is AssignmentStrategy.COOPERATIVE_STICKY


class CompressionType(enum.Enum):
    """A producer's batch codec; both backends take every one (aiokafka through cramjam)."""

    NONE = "none"
    GZIP = "gzip"
    SNAPPY = "snappy"
    LZ4 = "lz4"
    ZSTD = "zstd"


class GroupProtocol(enum.Enum):
    CLASSIC = "classic"  # JoinGroup/SyncGroup; the client assigns
    CONSUMER = "consumer"  # KIP-848: the broker assigns, always incrementally


# --- security -----------------------------------------------------------------------------------


class SecurityProtocol(enum.StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_ssl(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


class SaslMechanism(enum.StrEnum):
    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"
    OAUTHBEARER = "OAUTHBEARER"
    AWS_MSK_IAM = "AWS_MSK_IAM"  # OAUTHBEARER with a token signed by the AWS MSK IAM signer

    @property
    def uses_password(self) -> bool:
        return self not in (SaslMechanism.OAUTHBEARER, SaslMechanism.AWS_MSK_IAM)


class Secret:
    """A string that never shows itself in ``repr``/``str`` (argparse namespaces, dataclasses, logs)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)


# --- topics -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicNames:
    input: str
    output: str
    state: str
    dlq: str


# --- limits: what the settings must leave room for ----------------------------------------------

# Snapshots carry the request and its prompt ids and can pass Kafka's 1 MiB default; the topics
# made by `topics create` allow this much (max.message.bytes).
MAX_RECORD_BYTES = 16 * 1024 * 1024
TRANSACTION_TIMEOUT_MS = 60_000
# Per worker, a crashed worker's transactional id is not taken over by the partitions' next owner:
# its open transaction holds back read_committed readers of every partition it wrote until the
# broker times it out (Kafka Streams' exactly-once v2 uses 10 s for the same reason).
PER_WORKER_TRANSACTION_TIMEOUT_MS = 15_000
# What one record and one commit may take, at most, inside a transaction and a rebalance.
RECORD_BUDGET_MS = 10
COMMIT_BUDGET_MS = 10_000


def transaction_timeout_ms(mode: TransactionalIdMode) -> int:
    if mode is TransactionalIdMode.PER_WORKER:
        return PER_WORKER_TRANSACTION_TIMEOUT_MS
    return TRANSACTION_TIMEOUT_MS
