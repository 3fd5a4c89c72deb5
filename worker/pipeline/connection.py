"""Kafka connection flags and clients of the pipeline commands.

The bootstrap flag has the same environment fallbacks as ``run`` (``DERENDER_BOOTSTRAP_SERVERS``,
then ``KAFKA_BOOTSTRAP_SERVERS``); TLS and SASL come from ``worker.runtime.kafka_security``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from worker.errors import ConfigurationError
from worker.runtime.kafka_client.aiokafka_backend import compression_type
from worker.runtime.kafka_client.base import CompressionType
from worker.runtime.kafka_limits import MAX_RECORD_BYTES
from worker.runtime.kafka_security import KafkaSecurity, load_kafka
from worker.runtime.topics import LARGE_RECORDS
from worker.settings import (
    KafkaConnection,
    ProducerSettings,
    SecuritySettings,
    add_arguments,
    load,
)

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36
# As the worker's producers: records carry whole prompts.
MAX_REQUEST_BYTES = MAX_RECORD_BYTES


def add_connection_arguments(parser: argparse.ArgumentParser, *, producing: bool = False) -> None:
    """The worker's connection flags plus the security options; a command that writes records also
    takes the worker's producer settings (``--compression-type``)."""
    add_arguments(parser, KafkaConnection, SecuritySettings)
    if producing:
        add_arguments(parser, ProducerSettings)


@dataclass(frozen=True, slots=True)
class Connection:
    bootstrap_servers: str
    client_id: str
    security: KafkaSecurity
    compression: CompressionType = CompressionType.NONE

    @classmethod
    def from_args(cls, args: argparse.Namespace, role: str) -> Connection:
        kafka = load_kafka(KafkaConnection, args)
        chosen = "client_id" in kafka.model_fields_set  # by flag or environment
        client_id = kafka.client_id if chosen else f"derender-{role}-{socket.gethostname()}-{os.getpid()}"
        # A command without the producer flags reads the default here and never produces.
        compression = load(ProducerSettings, args).compression_type
        return cls(kafka.bootstrap_servers, client_id, kafka.security, compression)

    def kwargs(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            **self.security.client_kwargs(),
        }

    def producer(self, **extra: Any) -> AIOKafkaProducer:
        options: dict[str, Any] = {
            "enable_idempotence": True,
            "acks": "all",
            "max_request_size": MAX_REQUEST_BYTES,
            "compression_type": compression_type(self.compression),
        }
        options.update(extra)
        return AIOKafkaProducer(**self.kwargs(), **options)

    def consumer(self, **extra: Any) -> AIOKafkaConsumer:
        options: dict[str, Any] = {
            "isolation_level": "read_committed",
            "enable_auto_commit": False,
            "fetch_max_bytes": MAX_REQUEST_BYTES,
            "max_partition_fetch_bytes": MAX_REQUEST_BYTES,
        }
        options.update(extra)
        return AIOKafkaConsumer(**self.kwargs(), **options)

    async def ensure_topic(self, name: str, partitions: int, replication_factor: int = 1) -> bool:
        """Create ``name`` unless it exists; True when it was created."""
        admin = AIOKafkaAdminClient(**self.kwargs())
        await admin.start()
        try:
            # Request records carry whole prompts, as the worker's topics do (``topics create``).
            topic = NewTopic(name, partitions, replication_factor, topic_configs=dict(LARGE_RECORDS))
            response = await admin.create_topics([topic])
            codes = [error[1] for error in response.topic_errors]
            if any(code not in (0, _TOPIC_ALREADY_EXISTS) for code in codes):
                raise ConfigurationError(f"cannot create topic {name!r}: {response.topic_errors}")
            return all(code == 0 for code in codes)
        finally:
            await admin.close()


async def _partition_counts(connection: Connection, topics: tuple[str, ...]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(**connection.kwargs())
    await admin.start()
    try:
        described = await admin.describe_topics(list(topics))
    finally:
        await admin.close()
    return {item["topic"]: len(item["partitions"]) for item in described if item["error_code"] == 0}


async def require_topics(connection: Connection, *topics: str) -> dict[str, int]:
    """The partition count of each topic; a ConfigurationError naming the first one that is missing."""
    counts = await _partition_counts(connection, topics)
    for topic in topics:
        if not counts.get(topic):
            raise ConfigurationError(f"topic {topic!r} does not exist")
    return counts


async def wait_for_topics(connection: Connection, *topics: str, every_s: float = 2.0) -> dict[str, int]:
    """The partition count of each topic, once they all exist; one log line while some do not.

    A server started before ``topics create`` ran (or before ingest created the requests topic)
    waits instead of exiting, so an orchestrator does not crash-loop it.
    """
    said = False
    while True:
        counts = await _partition_counts(connection, topics)
        missing = [topic for topic in topics if not counts.get(topic)]
        if not missing:
            if said:
                log.info("topic(s) %s exist now", ", ".join(topics))
            return counts
        if not said:
            log.warning(
                "waiting for topic(s) %s to exist (`derender-worker topics create` creates them), "
                "checking every %gs",
                ", ".join(missing),
                every_s,
            )
            said = True
        await asyncio.sleep(every_s)


async def topic_partitions(connection: Connection, topic: str) -> list[TopicPartition]:
    """Every partition of ``topic``; a ConfigurationError when it does not exist."""
    count = (await require_topics(connection, topic))[topic]
    return [TopicPartition(topic, p) for p in range(count)]
