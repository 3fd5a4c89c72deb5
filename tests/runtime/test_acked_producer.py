"""``AckedProducer.send_and_wait``: each concurrent sender learns its own record's outcome only (the
gateway shares one producer between requests)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from worker.errors import RecordTooLargeError
from worker.runtime.kafka_client.aiokafka_backend import AiokafkaProducer, create_topics
from worker.runtime.kafka_client.base import CompressionType, OutgoingRecord, ProducerConfig
from worker.runtime.security.kafka_security import KafkaSecurity

pytestmark = pytest.mark.kafka


def test_a_refused_record_fails_its_own_sender_only(kafka_bootstrap: str) -> None:
    topic = f"acked-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[BaseException | None, BaseException | None]:
        # The topic refuses records over 2 KB; the producer would send up to 1 MB.
        await create_topics(kafka_bootstrap, [(topic, 1, 1, {"max.message.bytes": "2048"})], 30_000)
        config = ProducerConfig(
            bootstrap_servers=kafka_bootstrap,
            client_id="acked-test",
            max_record_bytes=1024 * 1024,
            batch_bytes=16 * 1024,
            linger_ms=0,
            request_timeout_ms=30_000,
            retry_backoff_ms=100,
            transaction_timeout_ms=60_000,
            compression=CompressionType.NONE,
            security=KafkaSecurity(),
        )
        producer = AiokafkaProducer(config)
        await producer.start()
        try:
            big = producer.send_and_wait(OutgoingRecord(topic, b"big", b"x" * 100_000))
            small = producer.send_and_wait(OutgoingRecord(topic, b"small", b"ok"))
            outcomes = await asyncio.gather(big, small, return_exceptions=True)
        finally:
            await producer.stop()
        return outcomes[0], outcomes[1]

    big, small = asyncio.run(scenario())
    assert isinstance(big, RecordTooLargeError)
    assert small is None
