"""Kafka settings of ``run`` and ``topics create``: flags, environment variables, validation.

Every flag can come from the environment (``--group-id`` -> ``DERENDER_GROUP_ID``, see
``worker.settings.env_default``); the bootstrap address also falls back to the
conventional ``KAFKA_BOOTSTRAP_SERVERS``.
"""

from __future__ import annotations

import argparse
import enum
import os
import socket
from dataclasses import dataclass, field

from worker.errors import ConfigurationError
from worker.runtime.kafka_security import KafkaSecurity
from worker.settings import ENV_PREFIX, env_default

DEFAULT_GROUP_ID = "derender-worker"
DEFAULT_INPUT_TOPIC = "derender-requests"
DEFAULT_OUTPUT_TOPIC = "derender-responses"
DEFAULT_STATE_TOPIC = "derender-state"
DEFAULT_DLQ_TOPIC = "derender-dead-letters"
DEFAULT_COMMIT_INTERVAL_MS = 100
DEFAULT_REQUEST_TTL_S = 300.0
DEFAULT_SESSION_TIMEOUT_MS = 10_000
DEFAULT_REBALANCE_TIMEOUT_MS = 30_000  # a revocation's batch and commit must fit (see preflight)
DEFAULT_MAX_POLL_RECORDS = 500
DEFAULT_MAX_UNCOMMITTED_RECORDS = 5_000
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
# Memory caps per worker (0 turns one off), in estimated live bytes (see memory.py); deploy/ sets
# values sized for its 1 GiB pods (`./run bench flood`).
DEFAULT_MAX_OPEN_REQUESTS = 20_000
DEFAULT_MAX_STATE_BYTES = 128 * 1024 * 1024
FALLBACK_BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


class DeliveryMode(enum.Enum):
    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"


def _env(name: str, default: str) -> str:
    return env_default(name, default) or default


def _env_number(name: str, default: float, kind: type[int] | type[float]) -> float:
    raw = env_default(name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError as exc:
        var = ENV_PREFIX + name.replace("-", "_").upper()
        raise ConfigurationError(f"{var} must be a number, got {raw!r}") from exc


def add_connection_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """``--bootstrap-servers`` and ``--client-id``, in the "kafka" group of every Kafka command."""
    group = parser.add_argument_group("kafka")
    group.add_argument(
        "--bootstrap-servers",
        default=env_default("bootstrap-servers") or os.environ.get(FALLBACK_BOOTSTRAP_ENV),
        help="host:port[,host:port...] (env DERENDER_BOOTSTRAP_SERVERS, else KAFKA_BOOTSTRAP_SERVERS)",
    )
    group.add_argument("--client-id", default=env_default("client-id"), help="default: host name and pid")
    return group


def add_topic_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection and topic flags shared by ``run`` and ``topics create``."""
    group = add_connection_arguments(parser)
    group.add_argument("--input-topic", default=_env("input-topic", DEFAULT_INPUT_TOPIC))
    group.add_argument("--output-topic", default=_env("output-topic", DEFAULT_OUTPUT_TOPIC))
    group.add_argument(
        "--state-topic",
        default=_env("state-topic", DEFAULT_STATE_TOPIC),
        help="compacted; must have as many partitions as the input topic (partition p holds the "
        "state of input partition p)",
    )
    group.add_argument("--dlq-topic", default=_env("dlq-topic", DEFAULT_DLQ_TOPIC))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add_topic_arguments(parser)
    group = parser.add_argument_group("processing")
    group.add_argument("--group-id", default=_env("group-id", DEFAULT_GROUP_ID))
    group.add_argument(
        "--mode",
        choices=[m.value for m in DeliveryMode],
        default=_env("mode", DeliveryMode.EXACTLY_ONCE.value),
    )
    group.add_argument(
        "--commit-interval-ms",
        type=int,
        default=int(_env_number("commit-interval-ms", DEFAULT_COMMIT_INTERVAL_MS, int)),
        help="how long outputs may wait before their transaction commits (latency vs. throughput)",
    )
    group.add_argument(
        "--request-ttl-s",
        type=float,
        default=_env_number("request-ttl-s", DEFAULT_REQUEST_TTL_S, float),
        help="an open request idle this long is closed with a timeout error output",
    )
    group.add_argument(
        "--session-timeout-ms",
        type=int,
        default=int(_env_number("session-timeout-ms", DEFAULT_SESSION_TIMEOUT_MS, int)),
        help="consumer-group session timeout: how fast a crashed worker's partitions move",
    )
    group.add_argument(
        "--rebalance-timeout-ms",
        type=int,
        default=int(_env_number("rebalance-timeout-ms", DEFAULT_REBALANCE_TIMEOUT_MS, int)),
        help="how long the group waits for members to rejoin; must hold a batch plus a commit",
    )
    group.add_argument(
        "--max-poll-records",
        type=int,
        default=int(_env_number("max-poll-records", DEFAULT_MAX_POLL_RECORDS, int)),
    )
    group.add_argument(
        "--max-uncommitted-records",
        type=int,
        default=int(_env_number("max-uncommitted-records", DEFAULT_MAX_UNCOMMITTED_RECORDS, int)),
        help="commit early once this many input records are processed but not committed (backpressure)",
    )
    group.add_argument(
        "--shutdown-timeout-s",
        type=float,
        default=_env_number("shutdown-timeout-s", DEFAULT_SHUTDOWN_TIMEOUT_S, float),
    )
    memory = parser.add_argument_group(
        "memory caps",
        "per worker; a new request past a cap gets a 503 error output (existing requests go on); 0: off",
    )
    memory.add_argument(
        "--max-open-requests",
        type=int,
        default=int(_env_number("max-open-requests", DEFAULT_MAX_OPEN_REQUESTS, int)),
        help=f"streamed requests open at once (default {DEFAULT_MAX_OPEN_REQUESTS})",
    )
    memory.add_argument(
        "--max-state-bytes",
        type=int,
        default=int(_env_number("max-state-bytes", DEFAULT_MAX_STATE_BYTES, int)),
        help="live memory of the open requests and of closed-request memory, estimated in bytes "
        f"(default {DEFAULT_MAX_STATE_BYTES})",
    )


@dataclass(frozen=True, slots=True)
class TopicNames:
    input: str
    output: str
    state: str
    dlq: str


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    bootstrap_servers: str
    client_id: str
    topics: TopicNames
    group_id: str = DEFAULT_GROUP_ID
    mode: DeliveryMode = DeliveryMode.EXACTLY_ONCE
    commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS
    request_ttl_s: float = DEFAULT_REQUEST_TTL_S
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    rebalance_timeout_ms: int = DEFAULT_REBALANCE_TIMEOUT_MS
    max_poll_records: int = DEFAULT_MAX_POLL_RECORDS
    max_uncommitted_records: int = DEFAULT_MAX_UNCOMMITTED_RECORDS
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    max_open_requests: int = DEFAULT_MAX_OPEN_REQUESTS  # 0: no cap
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES  # 0: no cap
    security: KafkaSecurity = field(default_factory=KafkaSecurity)

    @property
    def exactly_once(self) -> bool:
        return self.mode is DeliveryMode.EXACTLY_ONCE

    def transactional_id(self, partition: int) -> str:
        """Stable per input partition, so the next owner's ``init_transactions`` fences the last one."""
        return f"{self.group_id}-{self.topics.input}-{partition}"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KafkaSettings:
        bootstrap = (args.bootstrap_servers or "").strip()
        if not bootstrap:
            env = f"{ENV_PREFIX}BOOTSTRAP_SERVERS / {FALLBACK_BOOTSTRAP_ENV}"
            raise ConfigurationError(f"--bootstrap-servers (or {env}) is required")
        topics = TopicNames(args.input_topic, args.output_topic, args.state_topic, args.dlq_topic)
        names = [topics.input, topics.output, topics.state, topics.dlq]
        if any(not name for name in names) or len(set(names)) != len(names):
            raise ConfigurationError(f"the four topics must be named and distinct, got {names}")
        client_id = args.client_id or f"derender-worker-{socket.gethostname()}-{os.getpid()}"
        security = KafkaSecurity.from_args(args) if hasattr(args, "security_protocol") else KafkaSecurity()
        settings = cls(bootstrap_servers=bootstrap, client_id=client_id, topics=topics, security=security)
        if not hasattr(args, "group_id"):  # `topics create` has no processing flags
            return settings
        settings = cls(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            topics=topics,
            group_id=args.group_id,
            mode=DeliveryMode(args.mode),
            commit_interval_ms=args.commit_interval_ms,
            request_ttl_s=args.request_ttl_s,
            session_timeout_ms=args.session_timeout_ms,
            rebalance_timeout_ms=args.rebalance_timeout_ms,
            max_poll_records=args.max_poll_records,
            max_uncommitted_records=args.max_uncommitted_records,
            shutdown_timeout_s=args.shutdown_timeout_s,
            max_open_requests=args.max_open_requests,
            max_state_bytes=args.max_state_bytes,
            security=security,
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        if not self.group_id:
            raise ConfigurationError("--group-id must not be empty")
        positive = {
            "--commit-interval-ms": self.commit_interval_ms,
            "--request-ttl-s": self.request_ttl_s,
            "--session-timeout-ms": self.session_timeout_ms,
            "--rebalance-timeout-ms": self.rebalance_timeout_ms,
            "--max-poll-records": self.max_poll_records,
            "--max-uncommitted-records": self.max_uncommitted_records,
            "--shutdown-timeout-s": self.shutdown_timeout_s,
        }
        for flag, value in positive.items():
            if value <= 0:
                raise ConfigurationError(f"{flag} must be positive, got {value}")
        caps = {"--max-open-requests": self.max_open_requests, "--max-state-bytes": self.max_state_bytes}
        for flag, cap in caps.items():
            if cap < 0:
                raise ConfigurationError(f"{flag} must be positive (or 0: no cap), got {cap}")
        from worker.runtime.preflight import check_settings  # it reads delivery's limits

        check_settings(self)
