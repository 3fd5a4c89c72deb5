"""When the worker commits: an interval after its oldest input less what commits take, and within a
long batch as it goes (broker-free: a polling stub consumer and a recording sink)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import worker.runtime.worker as worker_module
from tests.kafka_helpers import generate_sequences
from tests.partition_fakes import FakeRecord, PollingConsumer, RecordingSink, owned_partition, run_settings
from tests.runtime.worker_fakes import new_worker
from worker.runtime.commit_schedule import commit_delay_s
from worker.runtime.worker import Worker
from worker.settings import ModelSettings


def test_a_commit_starts_early_by_what_commits_take_so_outputs_show_within_the_interval() -> None:
    # Input just created, commits taking 15 ms: start at 85 ms, visible at about 100 ms.
    assert commit_delay_s(0.1, 0.0, 0.015) == pytest.approx(0.085)
    # Older input: only what is left of its interval.
    assert commit_delay_s(0.1, 0.06, 0.015) == pytest.approx(0.025)
    assert commit_delay_s(0.1, 0.5, 0.015) == 0.0
    # Slow commits lead by half the interval at most; a producer clock ahead delays nothing.
    assert commit_delay_s(0.1, 0.0, 2.0) == pytest.approx(0.05)
    assert commit_delay_s(0.1, -30.0, 0.0) == pytest.approx(0.1)


class _SlowClock:
    """The worker module's ``time``: every monotonic reading is ``step_s`` after the last one, as
    if each record took that long."""

    def __init__(self, step_s: float) -> None:
        self.step_s, self.now = step_s, 1000.0

    def monotonic(self) -> float:
        self.now += self.step_s
        return self.now

    def time(self) -> float:
        return time.time()

    def perf_counter(self) -> float:
        return time.perf_counter()


def _worker(sink: RecordingSink) -> Worker:
    settings = run_settings("--mode", "at-least-once")  # 100 ms commits
    worker = new_worker(settings, ModelSettings(tokenizer="x"))
    task = owned_partition(worker.derenderer, sink, metrics=worker.metrics)
    worker.tasks[task.tp] = task
    return worker


def test_a_long_batch_commits_as_it_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that takes longer than the interval (a backlog, a restore, a slow machine) does not
    hold one transaction open to its end: every reader of the outputs waits for it."""
    monkeypatch.setattr(worker_module, "time", _SlowClock(step_s=0.03))
    envelopes = [e for seq in generate_sequences(4, seed=8, prefix="batch") for e in seq.envelopes]
    records: list[Any] = [FakeRecord(i, envelope) for i, envelope in enumerate(envelopes)]
    sink = RecordingSink()
    worker = _worker(sink)
    worker._consumer = PollingConsumer(next(iter(worker.tasks)), records)
    asyncio.run(worker._step())
    positions = [offsets[tp] for _, offsets in sink.commits for tp in offsets]
    # About an interval's work per commit (30 ms a record: 4 of them), and the whole batch by the end.
    assert len(positions) >= 4, positions
    assert all(b - a <= 5 for a, b in zip([0, *positions], positions, strict=False)), positions
    assert positions[-1] == len(records)
    assert len([r for r in sink.sent if r.topic == "out"]) == len(records)
    # Commits within the batch count towards the next early start (each took a clock step here).
    assert worker.schedule.estimate_s > 0
