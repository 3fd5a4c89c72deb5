"""The test broker really supports what the worker relies on: transactions on a single node.

Needs the ``tests.kafka_broker`` plugin (registered in conftest, or ``-p tests.kafka_broker``).
"""

from __future__ import annotations

import uuid
from collections.abc import Coroutine
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.async_helpers import run_bounded
from tests.kafka_broker import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka

TIMEOUT_S = 60.0


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run one test body with an overall timeout (no async pytest plugin needed)."""
    return run_bounded(coro, TIMEOUT_S)


def transactional_producer(bootstrap: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"test-txn-{uuid.uuid4().hex}",
        enable_idempotence=True,  # implied by transactional_id; explicit because the worker sets it
        acks="all",
    )


async def read_all(
    bootstrap: str, topic: str, isolation_level: str, expected: int, idle_s: float = 1.0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Read partition 0 from the start: at least ``expected`` records, then until idle."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        records: list[ConsumerRecord[bytes, bytes]] = []
        while True:
            batch = await consumer.getmany(tp, timeout_ms=int(idle_s * 1000))
            if not batch.get(tp):
                if len(records) >= expected:
                    return records
                continue  # the overall test timeout bounds this
            records.extend(batch[tp])
    finally:
        await consumer.stop()


def test_transactions_commit_and_abort(kafka_bootstrap: str, kafka_topic_factory: TopicFactory) -> None:
    topic = kafka_topic_factory("txn")

    async def body() -> None:
        producer = transactional_producer(kafka_bootstrap)
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(50):
                    await producer.send(topic, key=b"k", value=f"committed-{i}".encode())

            # Wait for the aborted records to be written to the log before aborting, so the
            # read_committed consumer really has to skip them (not just never see them).
            await producer.begin_transaction()
            for i in range(10):
                await producer.send_and_wait(topic, key=b"k", value=f"aborted-{i}".encode())
            await producer.abort_transaction()

            async with producer.transaction():
                for i in range(50, 100):
                    await producer.send(topic, key=b"k", value=f"committed-{i}".encode())
        finally:
            await producer.stop()

        committed = await read_all(kafka_bootstrap, topic, "read_committed", expected=100)
        assert [r.value for r in committed] == [f"committed-{i}".encode() for i in range(100)]
        offsets = [r.offset for r in committed]
        assert offsets == sorted(offsets)

        # Sanity check of the test itself: the aborted records are in the log.
        everything = await read_all(kafka_bootstrap, topic, "read_uncommitted", expected=110)
        values = [r.value for r in everything]
        assert len(values) == 110
        assert values[50:60] == [f"aborted-{i}".encode() for i in range(10)]

    run(body())


def test_consume_transform_produce_commits_offsets_in_transaction(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """The exactly-once loop: group offsets committed through the producer's transaction."""
    source, sink = kafka_topic_factory.many(["eos-in", "eos-out"])
    group = f"test-group-{uuid.uuid4().hex}"

    async def body() -> None:
        plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await plain.start()
        try:
            for i in range(20):
                await plain.send(source, value=f"in-{i}".encode())
            await plain.flush()
        finally:
            await plain.stop()

        consumer = AIOKafkaConsumer(
            source,
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        producer = transactional_producer(kafka_bootstrap)
        await consumer.start()
        await producer.start()
        try:
            seen = 0
            while seen < 20:
                batches = await consumer.getmany(timeout_ms=1000)
                for tp, records in batches.items():
                    async with producer.transaction():
                        for record in records:
                            assert record.value is not None
                            await producer.send(sink, value=record.value.replace(b"in-", b"out-"))
                        await producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, group)
                    seen += len(records)
        finally:
            await producer.stop()
            await consumer.stop()

        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        assert offsets[TopicPartition(source, 0)].offset == 20

        out = await read_all(kafka_bootstrap, sink, "read_committed", expected=20)
        assert [r.value for r in out] == [f"out-{i}".encode() for i in range(20)]

    run(body())


@pytest.mark.broker_restart
def test_local_broker_restart_keeps_data(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory
) -> None:
    if not kafka_broker.restartable:
        pytest.skip(kafka_broker.not_restartable_reason)
    topic = kafka_topic_factory("restart")

    async def produce(values: list[bytes]) -> None:
        producer = transactional_producer(kafka_broker.bootstrap)
        await producer.start()
        try:
            async with producer.transaction():
                for value in values:
                    await producer.send(topic, value=value)
        finally:
            await producer.stop()

    run(produce([b"before"]))
    kafka_broker.restart()
    run(produce([b"after"]))

    records = run(read_all(kafka_broker.bootstrap, topic, "read_committed", expected=2))
    assert [r.value for r in records] == [b"before", b"after"]
