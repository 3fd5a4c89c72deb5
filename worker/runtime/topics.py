"""Creating the worker's four topics and checking the one layout rule they must follow.

The rule: the state topic has at least as many partitions as the input topic (``topics create``
makes them equal), because the worker writes the state of input partition ``p`` to state
partition ``p`` (explicit partition, not key hashing) and restores partition ``p`` from there
alone.

The admin client is imported inside the calls: ``worker.settings`` imports ``TopicNames``, and
commands that never talk to Kafka (``replay``) should not import aiokafka.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.errors import ConfigurationError
from worker.kafka_config import TopicNames as TopicNames

log = logging.getLogger(__name__)


_LEADER_WAIT_S = 30.0

# Compaction keeps the last snapshot per request; tombstones of finished requests are
# dropped after a day so a restore reads little more than the open requests.
# Topics the worker writes accept records as large as its producers send (see delivery.py).
LARGE_RECORDS: Mapping[str, str] = {"max.message.bytes": str(16 * 1024 * 1024)}
STATE_TOPIC_CONFIG: Mapping[str, str] = {
    **LARGE_RECORDS,
    "cleanup.policy": "compact",
    "delete.retention.ms": "86400000",
    "min.compaction.lag.ms": "0",
    "segment.ms": "3600000",
}


@dataclass(frozen=True, slots=True)
class CreatedTopics:
    created: list[str]
    existing: list[str]


def topic_specs(
    topics: TopicNames, partitions: int, replication_factor: int, requests_topic: str | None = None
) -> list[tuple[str, int, int, dict[str, str]]]:
    specs = [
        (topics.input, partitions, replication_factor, {}),
        (topics.output, partitions, replication_factor, dict(LARGE_RECORDS)),
        (topics.state, partitions, replication_factor, dict(STATE_TOPIC_CONFIG)),
        (topics.dlq, partitions, replication_factor, dict(LARGE_RECORDS)),
    ]
    if requests_topic is not None:  # the pipeline's: request envelopes carry whole prompts
        specs.append((requests_topic, partitions, replication_factor, dict(LARGE_RECORDS)))
    return specs


async def create_topics(
    bootstrap: str,
    topics: TopicNames,
    partitions: int,
    replication_factor: int = 1,
    security: Mapping[str, Any] | None = None,
    requests_topic: str | None = None,
) -> CreatedTopics:
    """Create the four topics (and the pipeline's requests topic, when named); existing ones are
    left alone (idempotent), then checked.

    ``security``: ``KafkaSecurity.client_kwargs()`` (TLS / SASL), splatted into the admin client.
    """
    from worker.runtime.kafka_client import aiokafka_backend as admin

    if partitions <= 0 or replication_factor <= 0:
        raise ConfigurationError("--partitions and --replication-factor must be positive")
    specs = topic_specs(topics, partitions, replication_factor, requests_topic)
    created, existing = await admin.create_topics(bootstrap, specs, int(_LEADER_WAIT_S * 1000), security)
    counts = await _wait_for_leaders(bootstrap, [name for name, *_ in specs], security)
    check_layout(topics, counts)
    return CreatedTopics(created, existing)


async def _wait_for_leaders(
    bootstrap: str, names: list[str], security: Mapping[str, Any] | None
) -> dict[str, int]:
    """Partition count per topic, once every partition has a leader (clients need one)."""
    from worker.runtime.kafka_client import aiokafka_backend as admin

    deadline = time.monotonic() + _LEADER_WAIT_S
    while True:
        leaders = await admin.partition_leaders(bootstrap, names, security)
        counts = {name: len(parts) for name, parts in leaders.items() if parts and min(parts) >= 0}
        if len(counts) == len(names):
            return counts
        if time.monotonic() > deadline:
            missing = sorted(set(names) - set(counts))
            raise ConfigurationError(f"topics without leaders after {_LEADER_WAIT_S:.0f}s: {missing}")
        await asyncio.sleep(0.1)


async def partition_counts(
    bootstrap: str, names: list[str], security: Mapping[str, Any] | None = None
) -> dict[str, int]:
    """Partition count of each existing topic among ``names`` (missing topics are left out)."""
    from worker.runtime.kafka_client import aiokafka_backend as admin

    leaders = await admin.partition_leaders(bootstrap, names, security)
    return {name: len(parts) for name, parts in leaders.items()}


async def max_message_bytes(
    bootstrap: str, names: list[str], security: Mapping[str, Any] | None = None
) -> dict[str, int | None]:
    """``max.message.bytes`` of each topic (``None`` where it cannot be read)."""
    from worker.runtime.kafka_client import aiokafka_backend as admin

    return await admin.max_message_bytes(bootstrap, names, security)


def check_layout(topics: TopicNames, partition_counts: Mapping[str, int]) -> None:
    """Raise unless every topic exists and the state topic mirrors the input topic's partitions."""
    missing = [
        t for t in (topics.input, topics.output, topics.state, topics.dlq) if not partition_counts.get(t)
    ]
    if missing:
        raise ConfigurationError(
            f"missing topics {missing}: create them with `derender-worker topics create`"
        )
    problem = layout_problem(topics, partition_counts[topics.input], partition_counts[topics.state])
    if problem is not None:
        raise ConfigurationError(problem)


def layout_problem(topics: TopicNames, input_partitions: int, state_partitions: int) -> str | None:
    """Why input partitions ``>= state_partitions`` cannot be served, or ``None``.

    More state partitions than input partitions is fine: it is the middle step of growing both
    (state topic first, see deploy/README.md); the extra ones are unused until the input grows.
    """
    if state_partitions >= input_partitions:
        return None
    return (
        f"state topic {topics.state!r} has {state_partitions} partitions but input topic {topics.input!r} "
        f"has {input_partitions}: the state topic needs at least as many (state partition p holds the "
        f"state of input partition p); grow it to {input_partitions}"
    )
