"""Output gaps during a scale-out from one worker to two, eager against incremental rebalancing
(cooperative-sticky, and KIP-848's consumer protocol).

    .venv/bin/python benchmarks/kafka_throughput.py --scale-out only [--runs 2]

Part of ``./run bench kafka``. Per strategy and run: a fresh 4-partition topic, one worker owning
every partition, then records produced at a steady rate (``--scale-out-rate``, default 1,000/s)
for ``--scale-out-seconds``; a third of the way in a second worker joins the group. A
``read_committed`` reader notes when each output of each input partition became visible (the
output's ``source.partition``). Per partition, the longest time between two visible outputs
while the load runs; reported as the worst partition that stayed with the first worker and the
worst that moved to the second (from its log). The commit interval (100 ms) is the floor: outputs
become visible a transaction at a time. The control row (``one worker``) runs the same load with no
second worker: the gaps this machine shows without any rebalance. Beside the whole load's worst gap
of the partitions that stayed, the worst of those from the second worker's start (of the control:
when it would have started) that ended before the load did: the wait still open when the load
stops depends on when it stops, not on the group. The joining worker starts up at nice 10 (see
``_renice_when_subscribed``). Each gap's start is printed relative to the second
worker's start, which tells a rebalance's gap from CPU contention.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from benchmarks.kafka_harness import (
    MODEL_DIR,
    REPO,
    collector_held_off,
    delete_topics,
    make_workload,
    raise_failed_send,
)
from worker.runtime.topics import TopicNames, create_topics

# Eager first: the baseline; KIP-848 assigns on the broker, always incrementally.
MEMBERSHIPS = {
    "range": ["--partition-assignment-strategy", "range"],
    "cooperative-sticky": ["--partition-assignment-strategy", "cooperative-sticky"],
    "KIP-848 consumer": ["--group-protocol", "consumer"],
    "one worker": ["--partition-assignment-strategy", "cooperative-sticky"],  # the control: no join
}
CONTROL = "one worker"
_OPENED = re.compile(r"opened partitions \[([\d, ]*)\]")


@dataclass
class Gaps:
    stayed_ms: float  # the longest gap of a partition that stayed with the first worker
    stayed_after_join_ms: float  # ... of those from the second worker's start, ended before the load
    moved_ms: float | None  # ... of one that moved to the second (none in the control)
    moved: int  # how many moved
    stayed_at_s: float  # when the stayed gap began, from the second worker's start
    moved_at_s: float | None


class ArrivalReader:
    """Notes, per input partition, when each of its outputs became visible (read_committed)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=5,
        )
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.arrivals: dict[int, list[float]] = defaultdict(list)
        self.count = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.assign(self.tps)
        await self.consumer.seek_to_beginning(*self.tps)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=50, max_records=10_000)
            now = time.monotonic()
            for records in batches.values():
                for record in records:
                    self.arrivals[orjson.loads(record.value)["source"]["partition"]].append(now)
                self.count += len(records)

    async def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.count < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.count}/{count} outputs after {timeout:.0f}s")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.consumer.stop()


def _start(
    bootstrap: str, topics: TopicNames, group: str, name: str, membership: str, log: Path, *, nice: int = 0
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "worker.cli", "run",
        "--bootstrap-servers", bootstrap, "--group-id", group, "--client-id", name,
        "--input-topic", topics.input, "--output-topic", topics.output,
        "--state-topic", topics.state, "--dlq-topic", topics.dlq,
        *MEMBERSHIPS[membership], "--commit-interval-ms", "100",
        "--metrics-port", "0", "--tokenizer", str(MODEL_DIR), "--served-model-name", "qwen3",
        "--vllm-version", "0.34",
    ]  # fmt: skip
    with open(log, "ab") as f:
        return subprocess.Popen(
            cmd, cwd=REPO, stdout=f, stderr=f, stdin=subprocess.DEVNULL, preexec_fn=lambda: os.nice(nice)
        )


async def _opened(log: Path, timeout: float = 120.0) -> set[int]:
    """The partitions of the worker's first "opened partitions" line (waits for it)."""
    deadline = time.monotonic() + timeout
    # Polls a subprocess's log file: nothing to wait on but the file.
    while (match := _OPENED.search(log.read_text(errors="replace"))) is None:  # noqa: ASYNC240
        if time.monotonic() > deadline:
            raise TimeoutError(f"no partitions opened; see {log}")
        await asyncio.sleep(0.05)
    return {int(p) for p in match.group(1).split(",") if p.strip()}


async def _renice_when_subscribed(pid: int, log: Path) -> None:
    """Back to normal priority once the joining worker has started up (it joins the group next).

    Its start-up (imports, the tokenizer) runs at nice 10: on this 2-core machine it would
    otherwise starve the first worker, a cost a new pod on another node does not impose."""
    # Polls a subprocess's log file: nothing to wait on but the file.
    while "joined group" not in log.read_text(errors="replace"):  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.02)
    with contextlib.suppress(PermissionError):  # lowering a nice value needs CAP_SYS_NICE
        os.setpriority(os.PRIO_PROCESS, pid, 0)


def _waits(times: list[float], start: float, end: float) -> list[tuple[float, float, float]]:
    """Each wait for the next visible output open at some moment of [start, end): (ms, began,
    ended). A wait open at ``start`` counts from the output before it, one open at ``end`` until the
    output after it (the last records sent become visible later), so neither is cut short; with no
    output after, it lasts to ``end``."""
    ordered = sorted(times)
    points = [max((t for t in ordered if t <= start), default=start), *(t for t in ordered if t > start)]
    waits = [((b - a) * 1000, a, b) for a, b in itertools.pairwise(points) if a < end]
    if points[-1] < end:
        waits.append(((end - points[-1]) * 1000, points[-1], end))
    return waits


def _longest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest wait of ``_waits`` (ms), and when it began."""
    return max((ms, began) for ms, began, _ in _waits(times, start, end))


def _longest_closed_gap(times: list[float], start: float, end: float) -> float:
    """The longest wait of ``_waits`` that an output ended by ``end`` (ms)."""
    return max((ms for ms, _, ended in _waits(times, start, end) if ended <= end), default=0.0)


async def one_scale_out(
    bootstrap: str, strategy: str, args: argparse.Namespace, log_dir: Path, run: int
) -> Gaps:
    suffix = uuid.uuid4().hex[:8]
    topics = TopicNames(*(f"bench-scale-{kind}-{suffix}" for kind in ("in", "out", "state", "dlq")))
    partitions = 4
    await create_topics(bootstrap, topics, partitions)
    rate, seconds = args.scale_out_rate, args.scale_out_seconds
    sequences = 200
    load = make_workload(sequences, max(2, int(rate * seconds) // sequences), f"s{run}")
    reader = ArrivalReader(bootstrap, topics.output, partitions)
    await reader.start()
    group = f"bench-scale-{suffix}"
    logs = [log_dir / f"scale-{strategy.replace(' ', '-')}-{run}-{i}.log" for i in (0, 1)]
    workers = [_start(bootstrap, topics, group, "first", strategy, logs[0])]
    try:
        await _opened(logs[0])
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=1)
        await producer.start()
        try:
            with collector_held_off():
                started = time.monotonic()
                joined, joined_at = False, started
                renice: asyncio.Task[None] | None = None
                futures = []
                for i, (key, value) in enumerate(load):
                    ahead = started + i / rate - time.monotonic()
                    if ahead > 0.002:
                        await asyncio.sleep(ahead)
                    if not joined and time.monotonic() - started > seconds / 3 and strategy != CONTROL:
                        workers.append(_start(bootstrap, topics, group, "second", strategy, logs[1], nice=10))
                        joined, joined_at = True, time.monotonic()
                        renice = asyncio.create_task(_renice_when_subscribed(workers[1].pid, logs[1]))
                    futures.append(await producer.send(topics.input, value=value, key=key))
                await producer.flush()  # not a gather: see kafka_throughput's latency phase
                ended = time.monotonic()
                if renice is not None:
                    await renice
                try:
                    await reader.wait_for(len(load), timeout=120)
                finally:
                    raise_failed_send(futures)
        finally:
            await producer.stop()
        moved = await _opened(logs[1]) if joined else set()
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
        await reader.stop()
        await delete_topics(bootstrap, [topics.input, topics.output, topics.state, topics.dlq])
    # From one second into the load (the first worker's outputs flowing) to its end.
    gaps = {p: _longest_gap(reader.arrivals[p], started + 1.0, ended) for p in range(partitions)}
    stayed_ms, stayed_at = max(gaps[p] for p in range(partitions) if p not in moved)
    if not joined:  # the control: times from when the second worker would have started
        joined_at = started + seconds / 3
    after_join = max(
        _longest_closed_gap(reader.arrivals[p], joined_at, ended) for p in range(partitions) if p not in moved
    )
    if not moved:
        return Gaps(stayed_ms, after_join, None, 0, stayed_at - joined_at, None)
    moved_ms, moved_at = max(gaps[p] for p in moved)
    return Gaps(stayed_ms, after_join, moved_ms, len(moved), stayed_at - joined_at, moved_at - joined_at)


async def scale_out(bootstrap: str, args: argparse.Namespace, log_dir: Path) -> None:
    results: dict[str, list[Gaps]] = {}
    for run in range(args.runs):
        for strategy in args.memberships.split(","):
            gaps = await one_scale_out(bootstrap, strategy, args, log_dir, run)
            results.setdefault(strategy, []).append(gaps)
            moved_text = (
                f"{gaps.moved_ms:6.0f} ms (at {gaps.moved_at_s:+.1f} s) on the {gaps.moved} that moved"
                if gaps.moved_ms is not None and gaps.moved_at_s is not None
                else "no second worker"
            )
            print(
                f"  scale-out 1->2, {strategy:20s} run {run + 1}: longest output gap "
                f"{gaps.stayed_ms:6.0f} ms (at {gaps.stayed_at_s:+.1f} s; {gaps.stayed_after_join_ms:.0f} ms "
                f"after the join) on partitions that stayed, "
                f"{moved_text}",
                flush=True,
            )
    print()
    print(
        f"scale-out from 1 to 2 workers under {args.scale_out_rate:.0f} records/s, 4 partitions, 100 ms "
        f"commits: longest output gap per partition, median of {args.runs} runs (min-max)"
    )
    for strategy, rs in results.items():
        stayed, moved = [g.stayed_ms for g in rs], [g.moved_ms for g in rs if g.moved_ms is not None]
        after_join = [g.stayed_after_join_ms for g in rs]
        line = (
            f"  {strategy:20s} stayed {statistics.median(stayed):7.0f} ms {_spread(stayed)}"
            f" (after the join {statistics.median(after_join):.0f} ms {_spread(after_join)})"
        )
        if moved:
            line += f"  moved {statistics.median(moved):7.0f} ms {_spread(moved)}"
        print(line)


def _spread(values: list[float]) -> str:
    return f"[{min(values):.0f}-{max(values):.0f}]"
