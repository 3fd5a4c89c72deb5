"""The committer on its own: it books what committed and returns the partitions whose work a failed
commit lost, without resetting anything (broker-free: recording sinks and producers)."""

from __future__ import annotations

import asyncio

from tests.golden_cases import derenderer_for
from tests.kafka_helpers import QWEN3_CONFIG, generate_sequences
from tests.partition_fakes import RecordingSink, owned_partition
from tests.runtime.worker_fakes import FakeTransactionalProducer, handle_record, per_worker_tasks
from worker.errors import KafkaClientError
from worker.runtime.committer import Committer
from worker.runtime.dead_letters.poison import ResetTracker
from worker.runtime.kafka_client.base import TopicPartition
from worker.runtime.observability.metrics import Metrics
from worker.runtime.partition import OwnedPartition


class FailingSink(RecordingSink):
    async def commit(self, state_records: object, offsets: dict[TopicPartition, int]) -> None:
        raise KafkaClientError("commit refused")


def _task_with_work(sink: RecordingSink, partition: int) -> OwnedPartition:
    task = owned_partition(derenderer_for(QWEN3_CONFIG), sink)
    task.tp = TopicPartition("in", partition)
    envelope = generate_sequences(1, seed=partition, prefix=f"c{partition}")[0].envelopes[0]
    handle_record(task, 0, envelope)
    return task


def test_nothing_to_commit_is_said_and_costs_nothing() -> None:
    committer = Committer(Metrics(), ResetTracker())
    idle = owned_partition(derenderer_for(QWEN3_CONFIG), RecordingSink())
    outcome = asyncio.run(committer.commit({idle.tp: idle}))
    assert not outcome.committed_any and outcome.lost == []


def test_a_failed_partition_is_returned_as_lost_and_the_others_are_booked() -> None:
    good_sink = RecordingSink()
    good, bad = _task_with_work(good_sink, 1), _task_with_work(FailingSink(), 2)
    resets = ResetTracker()
    committer = Committer(Metrics(), resets)
    outcome = asyncio.run(committer.commit({good.tp: good, bad.tp: bad}))
    assert outcome.committed_any
    assert [(w.tp, type(w.error)) for w in outcome.lost] == [(bad.tp, KafkaClientError)]
    assert good_sink.commits and good_sink.commits[-1][1] == {good.tp: 1}
    assert not good.needs_commit and bad.needs_commit  # the bad one is the caller's to reset
    # The failed range is isolated record by record when the partition reopens.
    assert resets.isolating(2, 0) and not resets.isolating(1, 0)


def test_only_the_named_partitions_commit() -> None:
    one_sink, two_sink = RecordingSink(), RecordingSink()
    one, two = _task_with_work(one_sink, 1), _task_with_work(two_sink, 2)
    outcome = asyncio.run(Committer(Metrics(), ResetTracker()).commit({one.tp: one, two.tp: two}, {two.tp}))
    assert outcome.committed_any and not outcome.lost
    assert not one_sink.commits and two_sink.commits and one.needs_commit


def test_a_failed_shared_commit_loses_every_joined_partition() -> None:
    producer = FakeTransactionalProducer(fail_commit=KafkaClientError("fenced"))
    worker, tasks = per_worker_tasks(producer)
    for offset, task in enumerate(tasks):
        envelope = generate_sequences(1, seed=offset, prefix=f"s{offset}")[0].envelopes[0]
        handle_record(task, 0, envelope)
    committer = worker.committer
    outcome = asyncio.run(committer.commit(worker.tasks, {tasks[0].tp}))
    # Asked for one, but the one transaction held both: both lost their work.
    assert sorted(w.tp.partition for w in outcome.lost) == [1, 2]
    assert set(worker.tasks) == {t.tp for t in tasks}  # nothing was reset by the committer
