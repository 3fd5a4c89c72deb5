"""The Kafka client layer: the runtime's one view of a Kafka client (contracts in ``base``).

``make_client`` picks the backend of ``--kafka-client``; the confluent backend (librdkafka) is
imported only when chosen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.runtime.kafka_client.base import ClientKind, KafkaClient
from worker.runtime.security.kafka_security import KafkaSecurity


def make_client(
    kind: ClientKind, security: KafkaSecurity, aiokafka_security: Mapping[str, Any] | None = None
) -> KafkaClient:
    """The backend ``kind``; ``aiokafka_security``: an already built ``security.client_kwargs()``
    to share (one SSLContext, one OAUTHBEARER token provider) between aiokafka clients."""
    if kind is ClientKind.CONFLUENT:
        from worker.runtime.kafka_client.confluent_backend import ConfluentClient

        return ConfluentClient(security)
    from worker.runtime.kafka_client.aiokafka_backend import AiokafkaClient

    return AiokafkaClient(aiokafka_security if aiokafka_security is not None else security.client_kwargs())
