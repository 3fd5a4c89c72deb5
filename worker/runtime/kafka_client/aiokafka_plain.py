"""aiokafka's own clients, handed out unwrapped: only for the gateway and its APIs, until they move
onto the client layer's ``Producer`` and ``PartitionReader`` (``Connection.plain_producer`` and
``Connection.reader``). Nothing new is to use these."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError


def plain_producer(options: Mapping[str, Any]) -> AIOKafkaProducer:
    return AIOKafkaProducer(**options)


def plain_consumer(options: Mapping[str, Any]) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(**options)


def plain_partitions(topic: str, count: int) -> list[TopicPartition]:
    """aiokafka's own partition type: its consumer's ``seek_to_*`` refuse any other."""
    return [TopicPartition(topic, p) for p in range(count)]


# What the plain clients raise (the layer's own clients raise ``worker.errors`` types instead).
PlainClientError = KafkaError
