"""aiokafka's own producer, handed out unwrapped: only for ``produce``, which needs each send's own
outcome without idempotence (``worker.pipeline.records``), until the layer's ``Producer`` offers
that. Nothing new is to use it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError


def plain_producer(options: Mapping[str, Any]) -> AIOKafkaProducer:
    return AIOKafkaProducer(**options)


# What the plain producer raises (the layer's own clients raise ``worker.errors`` types instead).
PlainClientError = KafkaError
