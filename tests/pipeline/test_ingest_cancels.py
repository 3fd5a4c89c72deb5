"""ingest's memory of cancels that came before their request (without Kafka: the partition's logic).

Cancels of requests that already ended arrive all the time (every error answer is cancelled by the
gateway); kept until the cap and then refusing new ones, they crowded out a cancel whose request was
still to come, and that request ran to its end.
"""

from __future__ import annotations

import asyncio

import orjson

from worker.pipeline.ingest import CANCELLED_CODE, MAX_EARLY_CANCELS, Ingest, _Partition, _Restored
from worker.runtime.kafka_client.base import TopicPartition
from worker.settings import IngestOptions


def test_a_cancel_that_overtakes_its_request_is_kept_past_the_cap_of_stale_ones() -> None:
    asyncio.run(cancel_then_request())


async def cancel_then_request() -> None:
    settings = IngestOptions(input_topic="in", output_topic="out", requests_topic="req")
    ingest = Ingest(settings, connection=None)  # type: ignore[arg-type]
    partition = _Partition(ingest, TopicPartition("req", 0), None, _Restored())  # type: ignore[arg-type]  # never commits
    for n in range(MAX_EARLY_CANCELS + 5):  # cancels of requests that ended long ago
        ingest._cancel(partition, f"ended-{n}")
    ingest._cancel(partition, "late")
    assert len(partition.early_cancels) == MAX_EARLY_CANCELS

    envelope = {"request_id": "late", "endpoint": "chat", "request": {"model": "m", "messages": []}}
    ingest._handle(partition, 7, b"late", orjson.dumps(envelope))

    started = [r.task for r in partition.running.values() if r.task is not None]
    for task in started:  # (before the fix it started generating: stop it, then fail)
        task.cancel()
    await asyncio.gather(*started, return_exceptions=True)
    assert not started  # not started: it ends at once as cancelled
    [error] = [orjson.loads(r.value) for r in partition.pending if r.topic == "out"]
    assert (error["request_id"], error["error"]["code"], error["terminal"]) == ("late", CANCELLED_CODE, True)
    assert "late" not in partition.early_cancels
