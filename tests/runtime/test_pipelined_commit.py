"""Pipelined commits: the loop processes on while a commit is in flight, and what it sends meanwhile
goes into the next transaction (``Worker._start_commit``, ``Transaction``). Broker-free: a
transactional producer whose commit waits for the test to let it end."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

import worker.runtime.worker as worker_module
from tests.golden_cases import derenderer_for
from tests.kafka_helpers import QWEN3_CONFIG, generate_sequences
from tests.partition_fakes import FakeRecord, PollingConsumer, owned_partition, run_settings
from tests.runtime.worker_fakes import FakeTransactionalProducer, SlowClock
from worker.errors import KafkaClientError
from worker.runtime import metrics_names as m
from worker.runtime.delivery import TransactionalSink
from worker.runtime.kafka_client.base import CommitTimings, Offsets
from worker.runtime.partition import OwnedPartition
from worker.runtime.worker import Worker
from worker.settings import ModelSettings


class GatedProducer(FakeTransactionalProducer):
    """A commit that lasts until ``gate`` is set, as a broker round trip does; ``outputs_at_commit``:
    how many outputs each commit's transaction holds."""

    def __init__(self, fail_commit: BaseException | None = None) -> None:
        super().__init__(fail_commit=fail_commit)
        self.gate = asyncio.Event()
        self.committing = asyncio.Event()
        self.outputs_at_commit: list[int] = []

    async def commit(self, offsets: Offsets, group: object) -> CommitTimings:
        self.outputs_at_commit.append(len(_outputs(self)))
        self.committing.set()
        await self.gate.wait()
        return await super().commit(offsets, group)


def _records(count: int) -> list[FakeRecord]:
    envelopes = [e for seq in generate_sequences(4, seed=21, prefix="pipe") for e in seq.envelopes][:count]
    records = [FakeRecord(i, envelope) for i, envelope in enumerate(envelopes)]
    for record in records:
        # Just produced (after the worker loaded its tokenizer): the next commit is an interval away.
        record.timestamp = int(time.time() * 1000)
    return records


def _worker(producer: GatedProducer, *flags: str) -> tuple[Worker, OwnedPartition]:
    worker = Worker(
        run_settings("--kafka-client", "confluent", *flags),
        derenderer_for(QWEN3_CONFIG),
        model=ModelSettings(tokenizer="x"),
    )
    task = owned_partition(worker.derenderer, TransactionalSink(producer, lambda: "group"))  # type: ignore[arg-type]
    task.metrics = worker.metrics
    worker.tasks[task.tp] = task
    return worker, task


def _outputs(producer: FakeTransactionalProducer) -> list[int]:
    """The ``seq`` of every output the producer was given, in order."""
    return [orjson.loads(r.value)["seq"] for r in producer.sent if r.topic == "out" and r.value]


def test_records_handled_during_a_commit_go_into_the_next_transaction() -> None:
    producer = GatedProducer()
    worker, task = _worker(producer)
    records = _records(6)
    worker._consumer = PollingConsumer(task.tp, records[:3], records[3:])

    async def scenario() -> None:
        await worker._step()
        await worker._start_commit()
        await producer.committing.wait()
        sent_before = len(producer.sent)
        await worker._step()  # the commit is still in flight: processing goes on
        assert task.position == 6 and task.committed_position == 0
        assert len(producer.sent) == sent_before and producer.commits == []  # held, not sent
        revoking = asyncio.ensure_future(worker.partitions_revoked({task.tp}))
        await asyncio.sleep(0.01)
        assert not revoking.done()  # a revocation waits for the commit in flight
        producer.gate.set()
        await revoking

    asyncio.run(scenario())
    assert [offsets for offsets, _ in producer.commits] == [{task.tp: 3}, {task.tp: 6}]
    assert producer.calls == ["begin", "commit", "begin", "commit", "stop"]
    seqs = _outputs(producer)
    assert len(seqs) == 6  # each output once, in input order, across the two transactions
    assert [orjson.loads(r.value)["seq"] for r in records] == seqs
    assert task.tp not in worker.tasks


def test_a_failed_commit_in_flight_resets_the_partition_and_drops_the_work_done_meanwhile() -> None:
    producer = GatedProducer(fail_commit=KafkaClientError("coordinator gone"))
    worker, task = _worker(producer)
    records = _records(6)
    worker._consumer = PollingConsumer(task.tp, records[:3], records[3:], [])

    async def scenario() -> None:
        await worker._step()
        await worker._start_commit()
        await producer.committing.wait()
        await worker._step()  # handled while the doomed commit is in flight
        held = len(producer.sent)
        producer.gate.set()
        assert worker._in_flight is not None
        await asyncio.wait({worker._in_flight.outcomes})
        await worker._step()  # books the failure before anything else
        assert len(producer.sent) == held  # what was held never reached the producer

    asyncio.run(scenario())
    assert task.tp not in worker.tasks  # reset: reopened from the committed offset by _heal
    assert "abort" in producer.calls and producer.commits == []
    assert worker.metrics.counters[m.COMMITS_FAILED] == 1
    assert len(_outputs(producer)) == 3  # offsets 3..5 were thrown away unsent; they are re-read
    assert worker.resets.isolating(task.tp.partition, 0)  # the failed commit's range is isolated


def test_backpressure_waits_for_the_commit_in_flight() -> None:
    producer = GatedProducer()
    worker, task = _worker(producer, "--max-uncommitted-records", "2")
    records = _records(6)
    worker._consumer = PollingConsumer(task.tp, records[:3], records[3:])

    async def scenario() -> None:
        await worker._step()  # 3 >= 2 uncommitted: a forced commit starts
        await producer.committing.wait()
        step = asyncio.ensure_future(worker._step())
        await asyncio.sleep(0.01)
        assert not step.done() and task.position == 6  # processed, then waiting to commit
        producer.gate.set()
        await step
        await worker._settle_commit()

    asyncio.run(scenario())
    assert [offsets for offsets, _ in producer.commits] == [{task.tp: 3}, {task.tp: 6}]
    assert worker.metrics.counters[m.COMMITS_FORCED] == 2


def test_a_transaction_holds_sends_during_its_commit_and_an_abort_drops_them() -> None:
    producer = GatedProducer()
    _, task = _worker(producer)
    transaction: Any = task.sink.transaction  # type: ignore[attr-defined]
    records = _records(2)

    async def scenario() -> None:
        await task.handle(records[0])
        committing = asyncio.ensure_future(transaction.commit([], {task.tp: 1}))
        await producer.committing.wait()
        await task.handle(records[1])
        assert transaction.open and _outputs(producer) == [0]
        producer.gate.set()
        await committing
        assert transaction.open  # nothing open at the producer, but a send is held
        await transaction.abort()
        assert not transaction.open

    asyncio.run(scenario())
    assert _outputs(producer) == [0] and producer.calls == ["begin", "commit"]


def test_a_commit_started_within_a_batch_holds_exactly_the_records_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The records after a commit's start are handled before its first broker call: their outputs
    must wait for the next transaction, or a crash after the commit would repeat them."""
    producer = GatedProducer()
    producer.gate.set()
    worker, task = _worker(producer)
    monkeypatch.setattr(worker_module, "time", SlowClock(step_s=0.03))  # commits within the batch
    records = _records(12)
    worker._consumer = PollingConsumer(task.tp, records)

    async def scenario() -> None:
        await worker._step()
        await worker._commit_all()  # the rest of the batch

    asyncio.run(scenario())
    committed = [offsets[task.tp] for offsets, _ in producer.commits]
    assert len(committed) >= 2 and committed[-1] == 12, committed
    # One output per record here: each transaction holds the outputs of the records it commits.
    assert producer.outputs_at_commit == committed


def test_aiokafka_and_at_least_once_commits_are_waited_for() -> None:
    """Overlap only where the client commits off the loop and outputs show at the commit."""
    for flags in (("--kafka-client", "aiokafka"), ("--mode", "at-least-once")):
        producer = GatedProducer()
        producer.gate.set()
        worker, task = _worker(producer, *flags)
        records = _records(3)
        worker._consumer = PollingConsumer(task.tp, records)

        async def scenario(worker: Worker = worker) -> None:
            await worker._step()
            await worker._commit_due()
            assert worker._in_flight is None  # booked before the loop goes on

        asyncio.run(scenario())
        assert [offsets for offsets, _ in producer.commits] == [{task.tp: 3}], flags
