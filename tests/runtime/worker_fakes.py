"""Broker-free stand-ins for a ``Worker`` with per-worker transactions: a transactional producer that
records its calls, a worker owning two partitions through it, and one record handled by a task."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.golden_cases import derenderer_for
from tests.kafka_helpers import QWEN3_CONFIG
from tests.partition_fakes import TOPICS, FakeRecord, StubConsumer, changelog_for, run_settings
from worker.core.envelope_processor import EnvelopeProcessor
from worker.runtime.composition import worker_parts
from worker.runtime.delivery import SharedSink, Transaction
from worker.runtime.kafka_client.base import CommitTimings, Offsets, OutgoingRecord, TopicPartition
from worker.runtime.observability.metrics import Metrics
from worker.runtime.partition import OwnedPartition
from worker.runtime.worker import Worker
from worker.settings import KafkaSettings, ModelSettings


def new_worker(settings: KafkaSettings, model: ModelSettings | None = None, **parts: Any) -> Worker:
    """A worker of ``settings`` over the shared Qwen3 derenderer, its parts built by the composition
    root (``parts``: ``worker_parts``' keywords: metrics, dead-letter limits, resets, ...)."""
    model = model or ModelSettings(tokenizer="x", max_record_bytes=1 << 20)
    return Worker(settings, worker_parts(settings, model, derenderer_for(QWEN3_CONFIG), **parts))


class FakeTransactionalProducer:
    """Records the calls a ``Transaction`` makes (no broker)."""

    def __init__(
        self,
        fail_commit: BaseException | None = None,
        fail_abort: BaseException | None = None,
        fail_begin: BaseException | None = None,
    ) -> None:
        self.transactional_id = "g-in-worker-0"
        self.calls: list[str] = []
        self.sent: list[OutgoingRecord] = []
        self.commits: list[tuple[dict[TopicPartition, int], object]] = []
        self.fail_commit = fail_commit
        self.fail_abort = fail_abort
        self.fail_begin = fail_begin

    async def start(self) -> None:
        self.calls.append("start")

    async def begin(self) -> None:
        self.calls.append("begin")
        if self.fail_begin is not None:
            raise self.fail_begin

    async def send(self, record: OutgoingRecord) -> None:
        self.sent.append(record)

    async def commit(self, offsets: Offsets, group: object) -> CommitTimings:
        self.calls.append("commit")
        if self.fail_commit is not None:
            raise self.fail_commit
        self.commits.append((dict(offsets), group))
        return CommitTimings()

    async def abort(self) -> None:
        self.calls.append("abort")
        if self.fail_abort is not None:
            raise self.fail_abort

    async def stop(self) -> None:
        self.calls.append("stop")


def per_worker_tasks(producer: FakeTransactionalProducer) -> tuple[Worker, list[OwnedPartition]]:
    """A per-worker-transaction worker owning input partitions 1 and 2, committing through ``producer``."""
    settings = run_settings("--transactional-id-mode", "per-worker", "--kafka-client", "confluent")
    worker = new_worker(settings)
    worker.committer.shared = Transaction(producer, lambda: "group-metadata", worker.metrics)
    tasks = []
    for partition in (1, 2):
        tp = TopicPartition("in", partition)
        task = OwnedPartition(
            tp, EnvelopeProcessor(worker.derenderer), SharedSink(worker.committer.shared), TOPICS, Metrics(),
            position=0, changelog=changelog_for(tp),
        )  # fmt: skip
        worker.tasks[tp] = task
        tasks.append(task)
    worker._consumer = StubConsumer(set(worker.tasks))
    return worker, tasks


def handle_record(task: OwnedPartition, offset: int, envelope: dict[str, Any]) -> None:
    """``envelope`` at ``offset`` of ``task``'s partition, handled to the end."""
    record = FakeRecord(offset, envelope)
    record.partition = task.tp.partition
    asyncio.run(task.handle(record))
