"""Creating the worker's four topics and checking the one layout rule they must follow.

The rule: the state topic has at least as many partitions as the input topic (``topics create``
makes them equal), because the worker writes the state of input partition ``p`` to state
partition ``p`` (explicit partition, not key hashing) and restores partition ``p`` from there
alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from worker.errors import ConfigurationError
from worker.runtime.config import TopicNames

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36
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
    topics: TopicNames, partitions: int, replication_factor: int
) -> list[tuple[str, int, int, dict[str, str]]]:
    return [
        (topics.input, partitions, replication_factor, {}),
        (topics.output, partitions, replication_factor, dict(LARGE_RECORDS)),
        (topics.state, partitions, replication_factor, dict(STATE_TOPIC_CONFIG)),
        (topics.dlq, partitions, replication_factor, dict(LARGE_RECORDS)),
    ]


async def create_topics(
    bootstrap: str,
    topics: TopicNames,
    partitions: int,
    replication_factor: int = 1,
    security: Mapping[str, Any] | None = None,
) -> CreatedTopics:
    """Create the four topics; existing ones are left alone (idempotent), then checked.

    ``security``: ``KafkaSecurity.client_kwargs()`` (TLS / SASL), splatted into the admin client.
    """
    if partitions <= 0 or replication_factor <= 0:
        raise ConfigurationError("--partitions and --replication-factor must be positive")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(security or {}))
    await admin.start()
    try:
        specs = topic_specs(topics, partitions, replication_factor)
        response = await admin.create_topics(
            [NewTopic(name, n, rf, topic_configs=config) for name, n, rf, config in specs],
            timeout_ms=int(_LEADER_WAIT_S * 1000),
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
        counts = await _wait_for_leaders(admin, [name for name, *_ in specs])
        check_layout(topics, counts)
        return CreatedTopics(created, existing)
    finally:
        await admin.close()


async def _wait_for_leaders(admin: Any, names: list[str]) -> dict[str, int]:
    """Partition count per topic, once every partition has a leader (clients need one)."""
    deadline = time.monotonic() + _LEADER_WAIT_S
    while True:
        counts: dict[str, int] = {}
        for topic in await admin.describe_topics(names):
            parts = topic.get("partitions", [])
            if topic.get("error_code") == 0 and parts and all(p.get("leader", -1) >= 0 for p in parts):
                counts[topic["topic"]] = len(parts)
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
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(security or {}))
    await admin.start()
    try:
        counts = {}
        for topic in await admin.describe_topics(names):
            if topic.get("error_code") == 0:
                counts[topic["topic"]] = len(topic.get("partitions", []))
        return counts
    finally:
        await admin.close()


async def max_message_bytes(
    bootstrap: str, names: list[str], security: Mapping[str, Any] | None = None
) -> dict[str, int | None]:
    """``max.message.bytes`` of each topic (``None`` where it cannot be read)."""
    from worker.runtime.preflight import MAX_MESSAGE_BYTES, parse_max_message_bytes

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(security or {}))
    await admin.start()
    try:
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, name, {MAX_MESSAGE_BYTES: None}) for name in names
        ]
        return parse_max_message_bytes(await admin.describe_configs(resources))
    finally:
        await admin.close()


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
