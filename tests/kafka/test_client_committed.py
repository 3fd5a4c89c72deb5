"""The client layer's ``committed`` against a real broker that restarts: never "nothing committed"
for a partition that has an offset.

A partition is (re)opened at its committed offset, and ``None`` means "from the beginning": a wrong
``None`` makes the worker write every output of the partition again. aiokafka's own
``committed()`` gave one while the group coordinator was shutting down (a top-level
NOT_COORDINATOR it does not read); this reproduced a CI failure of ``test_broker_restart_mid_run``.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.async_helpers import run_bounded
from tests.kafka_broker import KafkaBroker, TopicFactory
from tests.kafka_helpers import joined_consumer
from worker.errors import KafkaClientError
from worker.runtime.kafka_client.base import ClientKind, TopicPartition

pytestmark = pytest.mark.kafka

COMMITTED = 5


@pytest.mark.broker_restart
@pytest.mark.parametrize("kind", [ClientKind.AIOKAFKA, ClientKind.CONFLUENT])
def test_committed_offset_is_never_lost_while_the_broker_restarts(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory, kind: ClientKind
) -> None:
    if not kafka_broker.restartable:
        pytest.skip(kafka_broker.not_restartable_reason)
    tp = TopicPartition(kafka_topic_factory("committed"), 0)

    async def body() -> None:
        consumer = await joined_consumer(kind, kafka_broker.bootstrap, tp.topic, "committed")
        answers: list[int | None] = []
        errors: list[KafkaClientError] = []
        during = 0  # answers given while the broker was restarting
        try:
            await consumer.commit({tp: COMMITTED})
            assert await consumer.committed(tp) == COMMITTED
            restart = asyncio.ensure_future(asyncio.to_thread(kafka_broker.restart))
            # Ask as often as the client answers, through the shutdown, the outage and the start.
            while not restart.done() or len(answers) < 10:
                try:
                    answers.append(await consumer.committed(tp))
                    during += not restart.done()
                except KafkaClientError as exc:  # an error is safe: the worker retries the open
                    errors.append(exc)
                    await asyncio.sleep(0.05)
            await restart
        finally:
            await consumer.stop()
        wrong = [a for a in answers if a != COMMITTED]
        assert not wrong, (
            f"{len(wrong)} of {len(answers)} answers were {sorted(set(map(repr, wrong)))}; {errors[:3]}"
        )
        assert during > 0, "no answer came while the broker restarted: the test saw nothing"

    run_bounded(body(), 240)
