"""Throughput and latency of one ``derender-worker run`` process against a real broker.

    .venv/bin/python benchmarks/kafka_throughput.py [--runs 2] [--sequences 1000] [--tokens 60]

Uses ``KAFKA_BOOTSTRAP_SERVERS`` if set, else starts ``deploy/local/kafka`` (and leaves it
running). Each run produces the same records (``sequences x tokens`` 1-token chunks of real Qwen3
ids, ``sequences`` requests open at once, round-robin interleaved) to a fresh input topic, then:

* pass-through: a librdkafka transactional copy of those records to another topic (KIP-447,
  one producer, a commit every ``--commit-interval-ms``): what this machine and broker allow,
  the ceiling the worker is compared with; records/s and CPU µs per record of that process.
* for each mode (``delivery/client/transactional-id-mode``, e.g. ``exactly-once/confluent/per-worker``),
  throughput: the worker starts on the backlog; chunks / (last output visible - partitions
  opened, from its log) on a ``read_committed`` reader, so tokenizer loading and the group join are
  not counted; CPU µs per record of the worker process over the same span (``/proc``).
* latency: with the worker caught up, chunks are produced at half the throughput just measured
  (or ``--latency-rate``) and each chunk's time from ``send`` to visible on the ``read_committed``
  reader is taken, split (p50/p99, per run) at its output's CreateTime, when the worker produced
  it: the wait before processing (fetch, queue, processing) and processed to visible (commit).
* ``exactly-once+trace``: the same with W3C ``traceparent`` / ``tracestate`` / ``baggage`` headers on
  every input record, which the worker copies to every output; beside it, in-process, the cost per
  record of the observability hook (trace headers, GenAI metrics, spans) against none.

* compression (``--compression-types none,lz4,zstd``): each mode once per codec (the worker's
  ``--compression-type``), with the bytes a ``read_committed`` librdkafka consumer fetched to read
  the backlog's outputs (its brokers' ``rxbytes``: the batches as the worker produced them) beside
  the outputs' own key + value bytes.

* scale-out (``--scale-out``, ``benchmarks/kafka_scale_out.py``): the longest output gap on the
  partitions that stayed and on those that moved while a second worker joins, eager against
  cooperative-sticky.

Prints medians over the runs side by side. The producer, the reader, the worker and the
broker share this machine's cores, so the figures are a floor for a dedicated worker host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kafka_harness import (  # noqa: E402
    MODEL_DIR,
    REPO,
    bootstrap_address,
    collector_held_off,
    delete_topics,
    make_workload,
    raise_failed_send,
)
from tests.kafka_helpers import fetched_bytes  # noqa: E402
from worker.runtime.composition import load_derenderer  # noqa: E402
from worker.runtime.topics import TopicNames, create_topics  # noqa: E402

TRACE_HEADERS = [
    ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ("tracestate", b"vendor=opaque"),
    ("baggage", b"tenant=bench"),
]


async def produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes, bytes]],
    headers: list[tuple[str, bytes]] | None = None,
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=10, max_batch_size=512 * 1024
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, value=v, key=k, headers=headers) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


class Reader:
    """read_committed reader of every output partition, noting when each record became visible."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=5,
        )
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.count = 0
        self.first: float | None = None
        self.last = 0.0
        self.last_wall = 0.0
        self.arrivals: dict[bytes, float] = {}
        # Wall clock: when the worker produced the output (its CreateTime) and when it was read.
        self.produced_wall: dict[bytes, tuple[float, float]] = {}
        self.track = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.assign(self.tps)
        await self.consumer.seek_to_beginning(*self.tps)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=50, max_records=10_000)
            now, wall = time.monotonic(), time.time()
            for records in batches.values():
                if self.first is None:
                    self.first = now
                self.count += len(records)
                self.last = now
                self.last_wall = time.time()
                if self.track:
                    for r in records:
                        # key + seq identify a chunk; seq sits right after request_id in the envelope
                        out = orjson.loads(r.value)
                        chunk_id = f"{out['request_id']}:{out['seq']}".encode()
                        self.arrivals[chunk_id] = now
                        self.produced_wall[chunk_id] = (r.timestamp / 1000, wall)

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


_OPENED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*opened partitions", re.M)


def opened_at(log: Path) -> float:
    """Wall-clock time of the worker's first "opened partitions" log line."""
    match = _OPENED.search(log.read_text(errors="replace"))
    if match is None:
        raise RuntimeError(f"the worker never opened its partitions; see {log}")
    stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
    return stamp.timestamp() + int(match.group(2)) / 1000


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class RunResult:
    chunks_per_s: float
    p50_ms: float
    p99_ms: float
    latency_rate: float
    cpu_us: float  # CPU per record of the worker process
    wire_bytes: int | None = None  # fetched to read the backlog's outputs
    payload_bytes: int | None = None  # their keys and values
    # The latency split at the output's CreateTime (when the worker produced it): p50/p99 of the
    # wait before processing (fetch, queue, processing) and of processed -> visible (commit).
    before_ms: tuple[float, float] = (0.0, 0.0)
    after_ms: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True)
class Mode:
    """``delivery[+trace]/client/transactional-id-mode``."""

    name: str
    compression: str | None = None  # the worker's --compression-type (None: its default)

    @property
    def label(self) -> str:
        return self.name if self.compression is None else f"{self.name} {self.compression}"

    @property
    def parts(self) -> list[str]:
        return self.name.split("/")

    @property
    def delivery(self) -> str:
        return self.parts[0].partition("+")[0]

    @property
    def trace(self) -> bool:
        return self.parts[0].endswith("+trace")

    def flags(self) -> list[str]:
        parts = self.parts
        flags = ["--mode", self.delivery]
        if len(parts) > 1:
            flags += ["--kafka-client", parts[1]]
        if len(parts) > 2:
            flags += ["--transactional-id-mode", parts[2]]
        if self.compression is not None:
            flags += ["--compression-type", self.compression]
        return flags


def passthrough(bootstrap: str, source: str, sink: str, count: int, commit_ms: int) -> tuple[float, float]:
    """librdkafka, KIP-447: copy ``count`` records ``source`` -> ``sink`` in transactions.

    Runs in its own process (``process_time`` then counts librdkafka's threads, and only them):
    records/s from the first record consumed to the last commit, and CPU µs per record.
    """
    import confluent_kafka as ck

    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-pass-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"bench-pass-{uuid.uuid4().hex[:8]}",
            "linger.ms": 2,
            "batch.size": 512 * 1024,
            "delivery.report.only.error": True,
        }
    )
    producer.init_transactions()
    consumer.subscribe([source])
    copied = 0
    started = cpu_started = 0.0
    offsets: dict[tuple[str, int], int] = {}

    def commit() -> None:
        tps = [ck.TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        producer.send_offsets_to_transaction(tps, consumer.consumer_group_metadata())
        producer.commit_transaction()

    producer.begin_transaction()
    due = 0.0
    while copied < count:
        for message in consumer.consume(2000, 0.1):
            if message.error() is not None:
                continue
            if not copied:
                started, cpu_started = time.monotonic(), time.process_time()
                due = started + commit_ms / 1000
            while True:
                try:
                    producer.produce(sink, message.value(), message.key(), headers=message.headers())
                    break
                except BufferError:
                    producer.poll(0.01)
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None  # a consumed record
            offsets[(topic, partition)] = offset + 1
            copied += 1
        if copied and time.monotonic() >= due:
            commit()
            producer.begin_transaction()
            due = time.monotonic() + commit_ms / 1000
    commit()
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu_started
    consumer.close()
    return count / elapsed, cpu / count * 1e6


def start_worker(
    bootstrap: str, topics: TopicNames, mode: Mode, commit_ms: int, log: Path
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "worker.cli",
        "run",
        "--bootstrap-servers",
        bootstrap,
        "--group-id",
        f"bench-{uuid.uuid4().hex[:8]}",
        "--input-topic",
        topics.input,
        "--output-topic",
        topics.output,
        "--state-topic",
        topics.state,
        "--dlq-topic",
        topics.dlq,
        *mode.flags(),
        "--commit-interval-ms",
        str(commit_ms),
        "--max-poll-records",
        "2000",
        "--max-uncommitted-records",
        "20000",
        "--tokenizer",
        str(MODEL_DIR),
        "--served-model-name",
        "qwen3",
        "--vllm-version",
        "0.34",
    ]
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=f, stdin=subprocess.DEVNULL)


async def _cpu_when_opened(log: Path, pid: int) -> float:
    """The worker's CPU seconds within ~20 ms of it opening its partitions (start-up left out)."""
    # Polls a subprocess's log file: nothing to wait on but the file, read in a few microseconds.
    while _OPENED.search(log.read_text(errors="replace")) is None:  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.02)
    return process_cpu_s(pid)


async def one_run(
    bootstrap: str,
    mode: Mode,
    args: argparse.Namespace,
    run: int,
    log_dir: Path,
    load: list[tuple[bytes, bytes]],
) -> RunResult:
    suffix = uuid.uuid4().hex[:8]
    topics = TopicNames(
        f"bench-in-{suffix}", f"bench-out-{suffix}", f"bench-state-{suffix}", f"bench-dlq-{suffix}"
    )
    await create_topics(bootstrap, topics, args.partitions)
    headers = TRACE_HEADERS if mode.trace else None
    await produce(bootstrap, topics.input, load, headers)
    reader = Reader(bootstrap, topics.output, args.partitions)
    await reader.start()
    log = log_dir / f"{mode.label.replace('/', '_').replace(' ', '_')}-{run}.log"
    worker = start_worker(bootstrap, topics, mode, args.commit_interval_ms, log)
    try:
        cpu_opened = asyncio.create_task(_cpu_when_opened(log, worker.pid))
        await reader.wait_for(len(load), timeout=600)
        cpu_us = (process_cpu_s(worker.pid) - await cpu_opened) / len(load) * 1e6
        # From the moment the worker owned its partitions (its log) to the last output visible:
        # with exactly-once, outputs become visible in bursts, so the reader alone cannot tell.
        started_at = opened_at(log)
        throughput = len(load) / max(reader.last_wall - started_at, 1e-9)
        wire = payload = None
        if mode.compression is not None:
            wire, payload = await asyncio.to_thread(fetched_bytes, bootstrap, topics.output, len(load))

        # Latency at a steady rate below capacity (half the rate just measured), worker caught up.
        rate = args.latency_rate or throughput / 2
        lat_load = make_workload(
            args.sequences, max(2, int(rate * args.latency_seconds) // args.sequences), f"l{run}"
        )
        reader.track = True
        sent: dict[bytes, float] = {}
        sent_wall: dict[bytes, float] = {}
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=1)
        await producer.start()
        try:
            with collector_held_off():
                started = time.monotonic()
                futures = []
                for i, (key, value) in enumerate(lat_load):
                    ahead = started + i / rate - time.monotonic()
                    if ahead > 0.002:
                        await asyncio.sleep(ahead)
                    env = orjson.loads(value)
                    chunk_id = f"{env['request_id']}:{env['seq']}".encode()
                    sent[chunk_id], sent_wall[chunk_id] = time.monotonic(), time.time()
                    futures.append(await producer.send(topics.input, value=value, key=key, headers=headers))
                # Not a gather: one over every send's future runs all their callbacks in one loop
                # turn (0.7 s for the 180,000 of a 30 s phase here) while the last outputs wait
                # unread. After a flush every future is settled, so the check below is quick.
                await producer.flush()
                try:
                    await reader.wait_for(len(load) + len(lat_load), timeout=120)
                finally:
                    raise_failed_send(futures)  # why outputs are missing, not only that they are
        finally:
            await producer.stop()
        latencies = sorted((reader.arrivals[k] - t) * 1000 for k, t in sent.items() if k in reader.arrivals)
        p50, p99 = _quantiles(latencies)
        split = [(reader.produced_wall[k], t) for k, t in sent_wall.items() if k in reader.produced_wall]
        before = _quantiles(sorted((produced - t) * 1000 for (produced, _), t in split))
        after = _quantiles(sorted((visible - produced) * 1000 for (produced, visible), _ in split))
    finally:
        worker.terminate()
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
        await reader.stop()
        await delete_topics(bootstrap, [topics.input, topics.output, topics.state, topics.dlq])
    return RunResult(throughput, p50, p99, rate, cpu_us, wire, payload, before, after)


def _quantiles(values: list[float]) -> tuple[float, float]:
    """p50 and p99 of sorted ``values``."""
    return values[len(values) // 2], values[min(len(values) - 1, int(len(values) * 0.99))]


def main(argv: list[str] | None = None) -> None:
    """Entry point (also for ``python -m benchmarks kafka``)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--sequences", type=int, default=1000, help="concurrent sequences")
    parser.add_argument("--tokens", type=int, default=60, help="1-token chunks per sequence")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    parser.add_argument(
        "--latency-rate", type=float, default=0.0, help="chunks/s during the latency phase (0: half the max)"
    )
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument(
        "--modes",
        default="exactly-once/aiokafka/per-partition,exactly-once/confluent/per-partition,"
        "exactly-once/confluent/per-worker",
        help="comma-separated delivery[+trace]/client/transactional-id-mode (also at-least-once/confluent)",
    )
    parser.add_argument(
        "--compression-types",
        default="",
        help="comma-separated codecs: each mode once per --compression-type, with the outputs' bytes "
        "fetched (empty: the worker's default, bytes not measured)",
    )
    parser.add_argument("--no-observability", action="store_true", help="skip the in-process hook figures")
    parser.add_argument(
        "--scale-out",
        choices=("also", "only", "skip"),
        default="also",
        help="the scale-out output gaps, eager against cooperative (benchmarks/kafka_scale_out.py)",
    )
    parser.add_argument("--scale-out-rate", type=float, default=1000.0, help="records/s during the scale-out")
    parser.add_argument("--scale-out-seconds", type=float, default=24.0)
    parser.add_argument(
        "--memberships",
        default="range,cooperative-sticky,KIP-848 consumer,one worker",
        help='comma-separated memberships the scale-out compares ("one worker": no scale-out, the control)',
    )
    args = parser.parse_args(argv)
    from benchmarks.kafka_scale_out import MEMBERSHIPS

    if unknown := set(args.memberships.split(",")) - MEMBERSHIPS.keys():
        parser.error(f"unknown memberships {sorted(unknown)}; known: {', '.join(MEMBERSHIPS)}")
    if args.scale_out == "only":
        asyncio.run(_scale_out(args))
        return
    asyncio.run(_run(args))
    if args.scale_out == "also":
        print()
        asyncio.run(_scale_out(args))
    if not args.no_observability:
        print()
        observability_overhead(args)


async def _run(args: argparse.Namespace) -> None:
    bootstrap = bootstrap_address()
    log_dir = Path(tempfile.mkdtemp(prefix="derender-bench-"))
    print(f"broker {bootstrap}; worker logs in {log_dir}", flush=True)
    load = make_workload(args.sequences, args.tokens, "t")
    codecs: list[str | None] = [c for c in args.compression_types.split(",") if c] or [None]
    modes = [Mode(name, codec) for name in args.modes.split(",") for codec in codecs]
    results: dict[str, list[RunResult]] = {}
    ceilings: list[tuple[float, float]] = []
    for run in range(args.runs):
        ceilings.append(await passthrough_run(bootstrap, args, load))
        rate, cpu = ceilings[-1]
        print(f"  {'pass-through (librdkafka, KIP-447)':40s} run {run + 1}: {rate:9.0f} records/s  "
              f"{cpu:5.1f} us CPU/record", flush=True)  # fmt: skip
        for mode in modes:
            result = await one_run(bootstrap, mode, args, run, log_dir, load)
            results.setdefault(mode.label, []).append(result)
            print(
                f"  {mode.label:40s} run {run + 1}: {result.chunks_per_s:9.0f} chunks/s  "
                f"{result.cpu_us:5.1f} us CPU/record  latency p50 {result.p50_ms:6.1f} ms  "
                f"p99 {result.p99_ms:6.1f} ms  (at {result.latency_rate:.0f}/s; before processing "
                f"{result.before_ms[0]:.0f}/{result.before_ms[1]:.0f} ms, processed to visible "
                f"{result.after_ms[0]:.0f}/{result.after_ms[1]:.0f} ms){_bytes(result)}",
                flush=True,
            )
    print()
    ceiling = statistics.median(rate for rate, _ in ceilings)
    print(
        f"one worker, {args.sequences} concurrent sequences x {args.tokens} 1-token chunks (Qwen3 ids), "
        f"{args.partitions} partitions, commit interval {args.commit_interval_ms} ms, "
        f"median of {args.runs} runs (min-max in brackets)"
    )
    print(
        f"  {'pass-through (librdkafka, KIP-447)':40s}{ceiling:9.0f} records/s "
        f"{_spread([r for r, _ in ceilings])}  "
        f"{statistics.median(c for _, c in ceilings):5.1f} us CPU/record"
    )
    for name, rs in results.items():
        rate = statistics.median(r.chunks_per_s for r in rs)
        print(
            f"  {name:40s}{rate:9.0f} chunks/s  {_spread([r.chunks_per_s for r in rs])}  "
            f"x{rate / ceiling:.2f} of pass-through  "
            f"{statistics.median(r.cpu_us for r in rs):5.1f} us CPU/record  "
            f"p50 {statistics.median(r.p50_ms for r in rs):6.1f} ms  "
            f"p99 {statistics.median(r.p99_ms for r in rs):6.1f} ms {_spread([r.p99_ms for r in rs])}"
            f"{_bytes(rs[-1])}"
        )


async def _scale_out(args: argparse.Namespace) -> None:
    from benchmarks.kafka_scale_out import scale_out

    bootstrap = bootstrap_address()
    log_dir = Path(tempfile.mkdtemp(prefix="derender-bench-"))
    print(f"broker {bootstrap}; worker logs in {log_dir}", flush=True)
    await scale_out(bootstrap, args, log_dir)


def _bytes(result: RunResult) -> str:
    if result.wire_bytes is None or not result.payload_bytes:
        return ""
    return (
        f"  outputs {result.wire_bytes / 1e6:.1f} MB fetched for {result.payload_bytes / 1e6:.1f} MB "
        f"(x{result.wire_bytes / result.payload_bytes:.2f})"
    )


def _spread(values: list[float]) -> str:
    return f"[{min(values):.0f}-{max(values):.0f}]"


async def passthrough_run(
    bootstrap: str, args: argparse.Namespace, load: list[tuple[bytes, bytes]]
) -> tuple[float, float]:
    suffix = uuid.uuid4().hex[:8]
    names = TopicNames(*(f"bench-pass-{kind}-{suffix}" for kind in ("in", "out", "s", "d")))
    source, sink = names.input, names.output
    await create_topics(bootstrap, names, args.partitions)
    await produce(bootstrap, source, load)
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        future = pool.submit(passthrough, bootstrap, source, sink, len(load), args.commit_interval_ms)
        result = await asyncio.wrap_future(future)
    await delete_topics(bootstrap, [names.input, names.output, names.state, names.dlq])
    return result


def observability_overhead(args: argparse.Namespace) -> None:
    """In-process: records/s of one partition's record path with and without the observability hook."""
    from worker.core.envelope_processor import EnvelopeProcessor
    from worker.core.vllm_version import VllmVersion
    from worker.runtime.kafka_client.base import TopicPartition as KafkaTopicPartition
    from worker.runtime.observability.metrics import Metrics
    from worker.runtime.observability.observer import RecordObserver
    from worker.runtime.partition import OwnedPartition
    from worker.runtime.state.changelog import StateChangelog, StateKeys
    from worker.runtime.topics import TopicNames as Names
    from worker.settings import ModelSettings

    class NullSink:
        async def start(self) -> None: ...
        async def send(self, record: Any) -> None: ...
        async def commit(self, state: Any, offsets: Any) -> None: ...
        async def abort(self) -> None: ...
        async def close(self) -> None: ...

    class Rec:
        __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")

        def __init__(self, offset: int, key: bytes, value: bytes, headers: Any) -> None:
            self.topic, self.partition, self.offset = "in", 0, offset
            self.key, self.value, self.headers, self.timestamp = key, value, headers, 1_000_000 + offset

    derenderer = load_derenderer(
        ModelSettings(vllm_version=VllmVersion.V0_34, tokenizer=str(MODEL_DIR), served_model_names=("qwen3",))
    )
    load = make_workload(min(args.sequences, 200), args.tokens, "o")
    variants: list[tuple[str, Any, Any]] = [
        ("off (no headers, no hook)", lambda m: RecordObserver(None, propagate=False), None),
        ("trace headers + GenAI metrics", lambda m: RecordObserver("g", metrics=m), TRACE_HEADERS),
    ]
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from worker.runtime.observability.tracing import RequestSpans

        def with_spans(m: Metrics) -> RecordObserver:
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
            return RecordObserver("g", RequestSpans(provider.get_tracer("bench")), metrics=m)

        variants.append(("  + a span per request", with_spans, TRACE_HEADERS))
    except ImportError:
        pass

    async def one(make: Any, headers: Any) -> float:
        metrics = Metrics()
        observer = make(metrics)
        task = OwnedPartition(
            KafkaTopicPartition("in", 0),
            EnvelopeProcessor(observer.measured(derenderer)),
            NullSink(),
            Names("in", "out", "state", "dlq"),
            metrics,
            position=0,
            changelog=StateChangelog("state", 0, StateKeys("bench-throughput")),
            observer=observer,
        )
        records = [Rec(i, k, v, headers) for i, (k, v) in enumerate(load)]
        started = time.process_time()  # CPU time: other processes on the machine do not count
        for record in records:
            await task.handle(record)
        return len(records) / (time.process_time() - started)

    # Variants take turns, after a warm-up, and the best run counts: on a shared machine the
    # slowest runs measure the neighbours, not the code.
    asyncio.run(one(variants[0][1], variants[0][2]))
    rates: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    for _ in range(max(3, args.runs)):
        for label, make, headers in variants:
            rates[label].append(asyncio.run(one(make, headers)))
    runs = max(3, args.runs)
    print(f"record path in-process, CPU time ({len(load)} records, best of {runs} alternating runs)")
    base = max(rates[variants[0][0]])
    for label, _, _ in variants:
        rate = max(rates[label])
        print(f"  {label:32s}{rate:12.0f} records/s   {1e6 / rate - 1e6 / base:+7.1f} us/record")


if __name__ == "__main__":
    main()
