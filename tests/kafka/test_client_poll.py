"""The client layer's ``poll`` against a real broker: a record that is there is handed over at once.

A poll's timeout bounds how long it waits for the *first* record, not for a full batch: the
worker's latency budget is one commit interval, and a poll that held arrived records until its
timeout (librdkafka's batch call does, unless the batch fills) added up to that much again.
"""

from __future__ import annotations

import time

import pytest
from aiokafka import AIOKafkaProducer

from tests.async_helpers import run_bounded
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import joined_consumer
from worker.runtime.kafka_client.base import ClientKind

pytestmark = pytest.mark.kafka

LONG_POLL_MS = 30_000


@pytest.mark.parametrize("kind", [ClientKind.AIOKAFKA, ClientKind.CONFLUENT])
def test_poll_returns_what_is_there_before_its_timeout(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, kind: ClientKind
) -> None:
    topic = kafka_topic_factory("poll")

    async def body() -> None:
        consumer = await joined_consumer(kind, kafka_bootstrap, topic, "poll")
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            await consumer.poll(500, 500)  # the partition's first fetch (the empty topic gives nothing)
            await producer.send_and_wait(topic, b"one", key=b"k")
            started = time.monotonic()
            batches = await consumer.poll(LONG_POLL_MS, 500)
            waited = time.monotonic() - started
        finally:
            await producer.stop()
            await consumer.stop()
        assert [r.value for records in batches.values() for r in records] == [b"one"]
        # Not a speed target: a poll that waited for a full batch would take all of LONG_POLL_MS.
        assert waited < LONG_POLL_MS / 1000 / 3, f"poll held a present record for {waited:.1f} s"

    run_bounded(body(), 120)
