"""Kafka connection flags and clients of the pipeline commands.

The bootstrap flag has the same environment fallbacks as ``run`` (``DERENDER_BOOTSTRAP_SERVERS``,
then ``KAFKA_BOOTSTRAP_SERVERS``); TLS and SASL come from ``worker.runtime.security.kafka_security``. Every
client comes from the client layer (``worker.runtime.kafka_client``): ``client`` for a group member
and transactions, ``plain_producer`` and ``reader`` for a producer and a reader of explicit
partitions, ``acked_producer`` for one shared by concurrent senders (the gateway and its APIs).
``producer`` hands out aiokafka's own producer to ``produce`` (one outcome per line) until it moves.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.errors import ConfigurationError
from worker.runtime.delivery import (
    PRODUCER_BATCH_BYTES,
    PRODUCER_REQUEST_TIMEOUT_MS,
    PRODUCER_RETRY_BACKOFF_MS,
)
from worker.runtime.kafka_client import make_client
from worker.runtime.kafka_client.base import (
    AckedProducer,
    ClientKind,
    CompressionType,
    KafkaClient,
    PartitionReader,
    Producer,
    ProducerConfig,
    ReaderConfig,
    TopicPartition,
)
from worker.runtime.kafka_client.limits import MAX_RECORD_BYTES, TRANSACTION_TIMEOUT_MS
from worker.runtime.security.from_settings import load_kafka
from worker.runtime.security.kafka_security import KafkaSecurity
from worker.runtime.topics import LARGE_RECORDS, partition_counts
from worker.settings import (
    KafkaConnection,
    ProducerSettings,
    SecuritySettings,
    add_arguments,
    load,
)

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_MS = 30_000
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

    def client(self, kind: ClientKind = ClientKind.AIOKAFKA) -> KafkaClient:
        """The client layer's backend ``kind`` (``--kafka-client`` where a command has it)."""
        return make_client(kind, self.security)

    def producer_config(self, client_id: str | None = None, *, linger_ms: int = 0) -> ProducerConfig:
        """A producer of records as large as the worker's topics take (``MAX_REQUEST_BYTES``); a
        transactional one commits within the worker's transaction timeout."""
        return ProducerConfig(
            bootstrap_servers=self.bootstrap_servers,
            client_id=client_id or self.client_id,
            max_record_bytes=MAX_REQUEST_BYTES,
            batch_bytes=PRODUCER_BATCH_BYTES,
            linger_ms=linger_ms,
            request_timeout_ms=PRODUCER_REQUEST_TIMEOUT_MS,
            retry_backoff_ms=PRODUCER_RETRY_BACKOFF_MS,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            compression=self.compression,
            security=self.security,
        )

    def reader_config(self, role: str) -> ReaderConfig:
        return ReaderConfig(self.bootstrap_servers, f"{self.client_id}-{role}", self.security)

    def plain_producer(self, kind: ClientKind = ClientKind.AIOKAFKA, *, linger_ms: int = 0) -> Producer:
        """An idempotent producer without transactions; ``flush`` after ``send`` is a send-and-wait."""
        return self.client(kind).producer(self.producer_config(linger_ms=linger_ms))

    def reader(self, role: str, kind: ClientKind = ClientKind.AIOKAFKA) -> PartitionReader:
        """A ``read_committed`` reader of explicit partitions (no group, no commits)."""
        return self.client(kind).reader(self.reader_config(role))

    def acked_producer(self) -> AckedProducer:
        """A producer whose every sender waits for its own record only (``send_and_wait``); the
        aiokafka backend's, the only one that has it."""
        from worker.runtime.kafka_client.aiokafka_backend import AiokafkaProducer

        return AiokafkaProducer(self.producer_config(), self.security.client_kwargs())

    def producer(self, **extra: Any) -> Any:
        """aiokafka's own producer, for ``produce`` until it uses ``plain_producer``."""
        from worker.runtime.kafka_client.aiokafka_backend import compression_type
        from worker.runtime.kafka_client.aiokafka_plain import plain_producer

        options: dict[str, Any] = {
            "enable_idempotence": True,
            "acks": "all",
            "max_request_size": MAX_REQUEST_BYTES,
            "compression_type": compression_type(self.compression),
        }
        return plain_producer({**self.kwargs(), **options, **extra})

    async def ensure_topic(
        self, name: str, partitions: int, replication_factor: int = 1, config: Mapping[str, str] | None = None
    ) -> bool:
        """Create ``name`` unless it exists (with ``config`` beside the large-record settings); True when
        it was created."""
        from worker.runtime.kafka_client.aiokafka_backend import create_topics

        # Request records carry whole prompts, as the worker's topics do (``topics create``).
        spec = (name, partitions, replication_factor, {**LARGE_RECORDS, **(config or {})})
        created, _existing = await create_topics(
            self.bootstrap_servers, [spec], ADMIN_TIMEOUT_MS, self.security.client_kwargs()
        )
        return name in created


async def _partition_counts(connection: Connection, topics: tuple[str, ...]) -> dict[str, int]:
    return await partition_counts(
        connection.bootstrap_servers, list(topics), connection.security.client_kwargs()
    )


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
