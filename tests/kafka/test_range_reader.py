"""The client layer's group-less range reader against a real broker, on both backends: it returns the
committed records of a range and nothing of an aborted transaction, ends at the range's end even
when transaction markers are the last offsets before it, rereads an earlier range after a later
one, and fails with the project's own timeout error when a range's end never comes."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaProducer

from tests.async_helpers import run_bounded
from tests.kafka_broker import TopicFactory
from worker.errors import KafkaClientError, KafkaReadTimeoutError
from worker.runtime.kafka_client import make_client
from worker.runtime.kafka_client.base import ClientKind, ReaderConfig, TopicPartition
from worker.runtime.kafka_client.ranges import RangeReader
from worker.runtime.security.kafka_security import KafkaSecurity

pytestmark = pytest.mark.kafka

BACKENDS = [ClientKind.AIOKAFKA, ClientKind.CONFLUENT]


async def _write(bootstrap: str, topic: str) -> None:
    """Offsets 0-2 committed (marker at 3), 4-5 aborted (marker at 6), 7 committed (marker at 8)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"range-{uuid.uuid4().hex[:8]}")
    await producer.start()
    try:
        for values, commit in ((["a", "b", "c"], True), (["x", "y"], False), (["d"], True)):
            async with producer.transaction() if commit else _aborted(producer):
                for value in values:
                    await producer.send_and_wait(topic, value.encode(), partition=0)
    finally:
        await producer.stop()


class _aborted:
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer

    async def __aenter__(self) -> None:
        await self._producer.begin_transaction()

    async def __aexit__(self, *exc: object) -> None:
        await self._producer.abort_transaction()


def _reader(kind: ClientKind, bootstrap: str, timeout_s: float = 60.0) -> RangeReader:
    security = KafkaSecurity()
    config = ReaderConfig(bootstrap, "range-test", security)
    return RangeReader(make_client(kind, security), config, timeout_s)


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_range_holds_its_committed_records_and_ends_past_the_markers(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, kind: ClientKind
) -> None:
    topic = kafka_topic_factory("range")
    tp = TopicPartition(topic, 0)

    async def body() -> None:
        await _write(kafka_bootstrap, topic)
        reader = _reader(kind, kafka_bootstrap)
        await reader.start()
        try:
            assert await reader.high_watermarks([tp]) == {tp: 9}
            read = reader.read({tp: (None, 9)})
            everything = [(tp_, r.offset, r.value) async for tp_, rs in read for r in rs]
            assert everything == [(tp, 0, b"a"), (tp, 1, b"b"), (tp, 2, b"c"), (tp, 7, b"d")]
            # An earlier range after a later one; it ends at 2, before the record there.
            assert [r.value for r in await reader.read_range(tp, 1, 2)] == [b"b"]
            # Only markers and aborted records in the range: it ends, empty.
            assert await reader.read_range(tp, 3, 7) == []
        finally:
            await reader.stop()

    run_bounded(body(), 120)


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_range_whose_end_never_comes_fails_with_a_kafka_client_error(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, kind: ClientKind
) -> None:
    topic = kafka_topic_factory("range-short")
    tp = TopicPartition(topic, 0)

    async def body() -> None:
        await _write(kafka_bootstrap, topic)
        reader = _reader(kind, kafka_bootstrap, timeout_s=2.0)
        await reader.start()
        try:
            with pytest.raises(KafkaReadTimeoutError, match=rf"{topic}\[0\] to 50") as raised:
                await reader.read_range(tp, 0, 50)
            assert isinstance(raised.value, KafkaClientError)
        finally:
            await reader.stop()

    run_bounded(body(), 120)
