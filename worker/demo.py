"""``derender-worker demo``: derender a bundled recorded stream and show the result.

Default (Kafka): start the local broker (``deploy/local/kafka start``, in a source tree; an
installed package needs a given broker) unless a bootstrap address is given, create a fresh set of
topics, start two ``derender-worker run`` processes in one consumer group and wait until the group
is stable and every partition has served a readiness probe, produce the recorded stream (plus two
deliberately invalid records) at a visible pace, and show each response assembling live from the
output topic, with the worker and partition that served it.
Everything it started is stopped at the end, also on failure or Ctrl-C. The last stdout line is
``demo: S sequences, C chunks, D dead-lettered, R chunks/s``. The terminal rendering lives in
``worker.demo_view``.

Offline (``--offline``): the bundled sample stream (real Qwen3 token ids) goes through the same
core as the Kafka worker in-process, printing every OpenAI chunk and then each assembled response.
``--tokenizer samples/models/gpt-oss --stream samples/streams/demo-gptoss.jsonl`` shows a gpt-oss
(Harmony) answer instead (the records of the golden case ``gptoss-analysis-tool-call-stream-mixed``,
``tests/golden_families/``): a gpt-oss folder is served with Harmony's parsers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

from worker.assembly import Assembler, render_text
from worker.core.parsing import harmony_switch
from worker.demo_setup import (
    DEMO_MODEL_DIR,
    DEMO_MODEL_NAME,
    DEMO_STREAM,
    SOURCE_TREE,
    cleanup_step,
    delete_topics,
    exit_code,
    given_bootstrap,
    in_source_tree,
    run_quiet,
    start_local_broker,
    tail,
    wait_for_broker,
    worker_model_args,
)
from worker.demo_view import DeadLetterSeen, DemoState, DemoView, RequestProgress, make_view
from worker.errors import DemoError
from worker.runtime.composition import load_processor
from worker.runtime.delivery import (
    PRODUCER_BATCH_BYTES,
    PRODUCER_REQUEST_TIMEOUT_MS,
    PRODUCER_RETRY_BACKOFF_MS,
)
from worker.runtime.kafka_client import make_client
from worker.runtime.kafka_client.base import (
    ClientKind,
    CompressionType,
    OutgoingRecord,
    PartitionReader,
    Producer,
    ProducerConfig,
    ReaderConfig,
    TopicPartition,
)
from worker.runtime.kafka_client.limits import MAX_RECORD_BYTES, TRANSACTION_TIMEOUT_MS
from worker.runtime.security.kafka_security import KafkaSecurity
from worker.settings import DemoOptions, ModelSettings, add_arguments, load

WORKERS = 2
PARTITIONS = 6
# Readiness probes: one unparseable record per input partition. Dead-lettered like any bad record,
# each proves its partition is open and served end to end; the demo's counts leave them out.
PROBE_KEY_PREFIX = "derender-demo-readiness-probe-"
COMMIT_INTERVAL_MS = 50  # outputs become visible (read_committed) at most this long after processing
# Heartbeats every session/4: the second worker's join is noticed by the first within ~1.5 s.
SESSION_TIMEOUT_MS = 6000  # the broker minimum (group.min.session.timeout.ms)
WORKER_SHUTDOWN_TIMEOUT_S = 10.0
GROUP_JOIN_TIMEOUT_S = 60.0  # tokenizer load + join + one rebalance
OUTPUT_WAIT_S = 30.0  # after the last record is produced
STOP_GRACE_S = 20.0  # SIGTERM, then SIGKILL


# --- offline -------------------------------------------------------------------------------------


def _demo_parsers(model_dir: str) -> tuple[str, str]:
    """(reasoning, tool) parsers for the demo's model: Harmony's for a gpt-oss folder, else Qwen3's."""
    config = Path(model_dir) / "config.json"
    model_type = orjson.loads(config.read_bytes()).get("model_type") if config.is_file() else None
    if model_type in harmony_switch.HARMONY_MODEL_TYPES:
        return harmony_switch.REASONING_NAME, harmony_switch.TOOL_NAME
    return "qwen3", "hermes"


def run_offline_demo(args: DemoOptions) -> int:
    stream = Path(args.stream) if args.stream else DEMO_STREAM
    model_dir = args.tokenizer or str(DEMO_MODEL_DIR)
    reasoning, tools = _demo_parsers(model_dir)
    settings = ModelSettings(
        tokenizer=model_dir,
        served_model_names=(DEMO_MODEL_NAME,),
        reasoning_parser=reasoning,
        tool_parser=tools,
        enable_auto_tool_choice=True,
    )
    processor = load_processor(settings)
    assembler = Assembler()
    out = sys.stdout
    out.write(f"derendering {stream.name} with the tokenizer in {Path(model_dir).name}/\n\n")
    for line in stream.read_bytes().splitlines():
        if not line.strip():
            continue
        result = processor.process(line)
        if result.output is None:
            reason = result.dead_letter.reason if result.dead_letter else "duplicate"
            out.write(f"skipped: {reason}\n")
            continue
        assembler.add(result.output)
        body = result.output.get("body")
        shown = body["chunk"] if body and "chunk" in body else (body or result.output.get("error"))
        out.write(orjson.dumps(shown).decode() + "\n")
    out.write("\nassembled responses:\n")
    for response in assembler.responses.values():
        out.write(render_text(response) + "\n")
    return 0


# --- the records the Kafka demo produces ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoRecord:
    key: bytes
    value: bytes
    invalid: str | None = None  # why it is invalid (None: a real envelope)


@dataclass(frozen=True, slots=True)
class DemoPlan:
    records: list[DemoRecord]  # in produce order
    expected: dict[str, tuple[str, int]]  # request_id -> (endpoint, output chunks expected)

    @property
    def invalid(self) -> list[str]:
        return [r.invalid for r in self.records if r.invalid is not None]


def build_plan(stream: Path) -> DemoPlan:
    """The stream's records, interleaved across requests, plus two invalid ones.

    Each request's records are spread evenly over the run (record i of n sits at (i + 0.5) / n),
    so all requests stream at once and finish together, as concurrent clients would.
    """
    per_request: dict[str, list[bytes]] = {}
    endpoints: dict[str, str] = {}
    for number, line in enumerate(stream.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            envelope = orjson.loads(line)
            request_id, endpoint = str(envelope["request_id"]), str(envelope["endpoint"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise DemoError(f"{stream}:{number} is not an input envelope: {exc}") from exc
        per_request.setdefault(request_id, []).append(line)
        endpoints.setdefault(request_id, endpoint)
    if not per_request:
        raise DemoError(f"{stream} holds no records")

    placed: list[tuple[float, int, DemoRecord]] = []
    for order, (request_id, lines) in enumerate(per_request.items()):
        for i, line in enumerate(lines):
            placed.append(((i + 0.5) / len(lines), order, DemoRecord(request_id.encode(), line)))

    # A poison record inside a live stream: the worker dead-letters it and the stream carries on.
    victim = list(per_request)[min(2, len(per_request) - 1)]
    middle = per_request[victim][len(per_request[victim]) // 2]
    truncated = DemoRecord(victim.encode(), middle[: len(middle) // 2], "a truncated JSON line")
    placed.append((0.5, len(per_request), truncated))
    # Well-formed JSON but no envelope (an endpoint the worker does not serve), under its own key.
    not_envelope = orjson.dumps(
        {"request_id": "demo-invalid", "seq": 0, "endpoint": "embeddings", "body": {"input": "hi"}}
    )
    placed.append((0.3, len(per_request), DemoRecord(b"demo-invalid", not_envelope, "a non-envelope record")))

    placed.sort(key=lambda item: (item[0], item[1]))
    expected = {rid: (endpoints[rid], len(lines)) for rid, lines in per_request.items()}
    return DemoPlan([record for _, _, record in placed], expected)


# --- processes: broker, workers --------------------------------------------------------------------


@dataclass
class WorkerProcess:
    label: str
    client_id: str
    proc: subprocess.Popen[bytes]
    log: Path


class Workers:
    """The demo's ``derender-worker run`` processes: started, watched, stopped."""

    def __init__(self) -> None:
        self.processes: list[WorkerProcess] = []

    def start(self, label: str, client_id: str, argv: list[str], log: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with log.open("wb") as log_file:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                # In a source tree, ``python -m worker.cli`` imports the same package as the demo.
                cwd=SOURCE_TREE if in_source_tree() else None,
            )
        self.processes.append(WorkerProcess(label, client_id, proc, log))

    def check_alive(self) -> None:
        """Raise if a worker has exited: the demo cannot finish without it."""
        for worker in self.processes:
            code = worker.proc.poll()
            if code is not None:
                raise DemoError(
                    f"{worker.label} (pid {worker.proc.pid}) exited early with status {code}; "
                    f"the end of its log:\n{tail(worker.log)}"
                )

    def stop(self, view: DemoView) -> None:
        """SIGTERM all (a graceful stop: commit, leave the group), SIGKILL what outlives the grace."""
        alive = [w for w in self.processes if w.proc.poll() is None]
        if not alive:
            return
        with view.stage(f"stopping {len(alive)} worker{'s' if len(alive) != 1 else ''} (SIGTERM)") as stage:
            for worker in alive:
                worker.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for worker in alive:
                try:
                    worker.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    stage.update(f"{worker.label} ignored SIGTERM for {STOP_GRACE_S:.0f} s: SIGKILL")
                    print(f"demo: warning: {worker.label} did not stop in time, killed", file=sys.stderr)
                    worker.proc.kill()
                    worker.proc.wait()


@dataclass(frozen=True, slots=True)
class DemoTopics:
    input: str
    output: str
    state: str
    dlq: str

    @property
    def all(self) -> list[str]:
        return [self.input, self.output, self.state, self.dlq]

    def flags(self) -> list[str]:
        return [
            *("--input-topic", self.input, "--output-topic", self.output),
            *("--state-topic", self.state, "--dlq-topic", self.dlq),
        ]


# --- Kafka clients -------------------------------------------------------------------------------


def _producer(bootstrap: str) -> Producer:
    """An idempotent producer, as ``produce`` and the gateway write requests."""
    security = KafkaSecurity()
    config = ProducerConfig(
        bootstrap_servers=bootstrap,
        client_id="derender-demo",
        max_record_bytes=MAX_RECORD_BYTES,
        batch_bytes=PRODUCER_BATCH_BYTES,
        linger_ms=0,
        request_timeout_ms=PRODUCER_REQUEST_TIMEOUT_MS,
        retry_backoff_ms=PRODUCER_RETRY_BACKOFF_MS,
        transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
        compression=CompressionType.NONE,
        security=security,
    )
    return make_client(ClientKind.AIOKAFKA, security).producer(config)


def _reader(bootstrap: str) -> PartitionReader:
    """A group-less ``read_committed`` reader from the start of the partitions it is given: outputs
    are written in transactions, only committed ones are real."""
    security = KafkaSecurity()
    return make_client(ClientKind.AIOKAFKA, security).reader(
        ReaderConfig(bootstrap, "derender-demo", security)
    )


@contextlib.asynccontextmanager
async def _clients(bootstrap: str) -> AsyncIterator[tuple[PartitionReader, Producer]]:
    """A started reader and producer, both stopped on the way out."""
    reader = _reader(bootstrap)
    producer = _producer(bootstrap)
    await reader.start()
    try:
        await producer.start()
        try:
            yield reader, producer
        finally:
            await producer.stop()
    finally:
        await reader.stop()


async def _wait_for_group(
    bootstrap: str, group: str, workers: Workers, update: Callable[[str], None]
) -> dict[str, list[int]]:
    """Wait until every worker is a member and the group is stable with all partitions assigned.

    The runtime exposes no readiness signal, so the broker's view of the group is the signal:
    once it is Stable with every worker holding partitions, produced records will be served.
    """
    from worker.runtime.kafka_client.aiokafka_backend import GroupView

    expected = {w.client_id for w in workers.processes}
    view = GroupView(bootstrap)
    await view.start()
    try:
        deadline = time.monotonic() + GROUP_JOIN_TIMEOUT_S
        while True:
            workers.check_alive()
            try:
                state, members = await view.members(group)
            except Exception:  # noqa: BLE001 - the coordinator may not be ready for a brand-new group yet
                state, members = "without a coordinator yet", {}
            joined = expected & set(members)
            assigned = sorted(p for ps in members.values() for p in ps)
            if (
                state == "Stable"
                and joined == expected
                and all(members[c] for c in expected)
                and assigned == list(range(PARTITIONS))
            ):
                return members
            update(f"{len(joined)}/{len(expected)} joined, group {state.lower()}")
            if time.monotonic() > deadline:
                raise DemoError(
                    f"the workers did not all join group {group} in {GROUP_JOIN_TIMEOUT_S:.0f} s "
                    f"(state {state}, members {sorted(members)})"
                )
            await asyncio.sleep(0.2)
    finally:
        await view.stop()


async def _probe_partitions(
    bootstrap: str, topics: DemoTopics, workers: Workers, update: Callable[[str], None]
) -> None:
    """Send a probe to every input partition and wait for all of them on the dead-letter topic.

    A Stable group is not yet a serving one: each new owner still fences its transactional
    producers and restores state before it reads. Records produced before that would arrive in
    a burst; after the probes, the demo's records are served as they come.
    """
    async with _clients(bootstrap) as (reader, producer):
        letters = [TopicPartition(topics.dlq, p) for p in range(PARTITIONS)]
        reader.assign(letters)
        for p in range(PARTITIONS):
            key = f"{PROBE_KEY_PREFIX}{p}".encode()
            await producer.send(OutgoingRecord(topics.input, key, b"readiness probe", partition=p))
        await producer.flush()
        seen: set[str] = set()
        deadline = time.monotonic() + GROUP_JOIN_TIMEOUT_S
        while len(seen) < PARTITIONS:
            workers.check_alive()
            if time.monotonic() > deadline:
                raise DemoError(
                    f"only {len(seen)} of {PARTITIONS} input partitions answered a probe within "
                    f"{GROUP_JOIN_TIMEOUT_S:.0f} s of the group forming"
                )
            update(f"{len(seen)}/{PARTITIONS} partitions served a probe")
            for records in (await reader.fetch(letters, 100)).values():
                seen.update(str(_dead_letter(r.value).key) for r in records if r.value is not None)


async def _stream(
    bootstrap: str,
    topics: DemoTopics,
    plan: DemoPlan,
    state: DemoState,
    worker_of_partition: dict[int, str],
    workers: Workers,
    refresh: Callable[[], None],
    pace_s: float,
) -> None:
    """Produce the plan at ``pace_s`` and read outputs and dead letters until all have arrived."""
    assembler = Assembler()
    async with _clients(bootstrap) as (reader, producer):
        read = [TopicPartition(t, p) for t in (topics.output, topics.dlq) for p in range(PARTITIONS)]
        reader.assign(read)

        async def produce() -> None:
            state.first_produce_at = time.monotonic()
            for i, record in enumerate(plan.records):
                await producer.send(OutgoingRecord(topics.input, record.key, record.value))
                await producer.flush()  # each record on its own: the demo paces them
                state.produced += 1
                # Paced from the start, so send latency does not slow the demo down.
                delay = state.first_produce_at + (i + 1) * pace_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)

        producing = asyncio.create_task(produce())
        try:
            total = sum(n for _, n in plan.expected.values())
            produced_at: float | None = None
            while state.chunks < total or len(state.dead_letters) < len(plan.invalid):
                if producing.done():
                    producing.result()  # a failed send fails the demo
                    produced_at = produced_at or time.monotonic()
                    if time.monotonic() - produced_at > OUTPUT_WAIT_S:
                        raise DemoError(
                            f"only {state.chunks} of {total} output chunks and {len(state.dead_letters)} "
                            f"of {len(plan.invalid)} dead letters arrived within {OUTPUT_WAIT_S:.0f} s "
                            "of the last record produced"
                        )
                workers.check_alive()
                batches = await reader.fetch(read, 100)
                for tp, records in batches.items():
                    for record in records:
                        if record.value is None:
                            continue  # the workers write no tombstones to either topic
                        if tp.topic == topics.dlq:
                            letter = _dead_letter(record.value)
                            if not (letter.key or "").startswith(PROBE_KEY_PREFIX):
                                state.dead_letters.append(letter)
                        else:
                            _add_output(state, assembler, orjson.loads(record.value), worker_of_partition)
                refresh()
            await producing
        finally:
            producing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await producing


def _add_output(
    state: DemoState, assembler: Assembler, envelope: dict[str, Any], worker_of_partition: dict[int, str]
) -> None:
    response = assembler.add(envelope)
    request = state.requests.setdefault(
        response.request_id, RequestProgress(response.request_id, response.endpoint, expected=0)
    )
    request.response = response
    source = envelope.get("source") or {}
    if isinstance(source.get("partition"), int):
        request.partitions.add(source["partition"])
        request.workers.add(worker_of_partition.get(source["partition"], "unknown worker"))
    state.chunks += 1
    state.last_output_at = time.monotonic()


def _dead_letter(value: bytes) -> DeadLetterSeen:
    try:
        letter = orjson.loads(value)
        source = letter.get("source") or {}
        return DeadLetterSeen(
            letter.get("key"), str(letter.get("reason")), source.get("partition"), source.get("offset")
        )
    except (orjson.JSONDecodeError, AttributeError):
        return DeadLetterSeen(None, f"unreadable dead letter: {value[:80]!r}", None, None)


# --- the Kafka demo ------------------------------------------------------------------------------


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM takes the same cleanup path as Ctrl-C


def run_kafka_demo(args: DemoOptions) -> int:
    view = make_view()
    # aiokafka logs every failed connection attempt; the demo says itself what went wrong.
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())
    logging.getLogger("aiokafka").propagate = False

    def run() -> int:
        with tempfile.TemporaryDirectory(prefix="derender-demo-") as tmp:
            _kafka_demo(args, view, Path(tmp))
        return 0

    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return exit_code(run)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _kafka_demo(args: DemoOptions, view: DemoView, tmp: Path) -> None:
    stream = Path(args.stream) if args.stream else DEMO_STREAM
    model_dir = args.tokenizer or str(DEMO_MODEL_DIR)
    plan = build_plan(stream)
    run_id = uuid.uuid4().hex[:8]
    prefix = f"derender-demo-{run_id}"  # fresh topics and group per run: reruns never mix
    topics = DemoTopics(
        f"{prefix}-requests", f"{prefix}-responses", f"{prefix}-state", f"{prefix}-dead-letters"
    )
    state = DemoState(group=prefix, to_produce=len(plan.records), invalid_injected=plan.invalid)
    for rid, (endpoint, count) in plan.expected.items():
        state.requests[rid] = RequestProgress(rid, endpoint, expected=count)

    # LIFO: workers stop first, then the topics go, then the broker (only if this run started it).
    with contextlib.ExitStack() as cleanup:
        given = given_bootstrap(args)
        if given is not None:
            state.bootstrap, state.broker_origin = given
        else:
            state.bootstrap = start_local_broker(view, cleanup, tmp)
            state.broker_origin = "deploy/local/kafka"
        wait_for_broker(state.bootstrap, state.broker_origin)
        view.note(f"Kafka at {state.bootstrap} (from {state.broker_origin})")

        bootstrap_flag = ["--bootstrap-servers", state.bootstrap]
        cli = [sys.executable, "-m", "worker.cli"]
        cleanup.callback(
            cleanup_step(
                "deleting the demo topics",
                lambda: asyncio.run(delete_topics(state.bootstrap, topics.all, prefix)),
            )
        )
        with view.stage(f"creating topics {prefix}-* ({PARTITIONS} partitions)"):
            created = run_quiet(
                [*cli, "topics", "create", *bootstrap_flag, *topics.flags(), "--partitions", str(PARTITIONS)],
                120,
            )
        if created.returncode != 0:
            raise DemoError(f"`derender-worker topics create` failed:\n{created.stderr.strip()}")

        workers = Workers()
        cleanup.callback(cleanup_step("stopping the workers", lambda: workers.stop(view)))
        with view.stage(f"starting {WORKERS} workers (group {prefix})") as stage:
            for n in range(1, WORKERS + 1):
                client_id = f"{prefix}-worker-{n}"
                argv = [
                    *cli,
                    "run",
                    *bootstrap_flag,
                    *topics.flags(),
                    *("--group-id", prefix, "--client-id", client_id),
                    *("--commit-interval-ms", str(COMMIT_INTERVAL_MS)),
                    *("--session-timeout-ms", str(SESSION_TIMEOUT_MS)),
                    *("--shutdown-timeout-s", str(WORKER_SHUTDOWN_TIMEOUT_S)),
                    *worker_model_args(model_dir),
                ]
                workers.start(f"worker {n}", client_id, argv, tmp / f"worker-{n}.log")
            members = asyncio.run(_wait_for_group(state.bootstrap, prefix, workers, stage.update))
            asyncio.run(_probe_partitions(state.bootstrap, topics, workers, stage.update))
        labels = {w.client_id: w.label for w in workers.processes}
        state.worker_partitions = {
            labels[c]: ps for c, ps in sorted(members.items(), key=lambda m: labels[m[0]])
        }
        worker_of_partition = {p: label for label, ps in state.worker_partitions.items() for p in ps}
        for worker in workers.processes:
            view.note(
                f"{worker.label} (pid {worker.proc.pid}): input partitions "
                f"{', '.join(map(str, state.worker_partitions[worker.label]))}"
            )

        with view.streaming(state) as refresh:
            asyncio.run(
                _stream(
                    state.bootstrap,
                    topics,
                    plan,
                    state,
                    worker_of_partition,
                    workers,
                    refresh,
                    args.pace_ms / 1000,
                )
            )
        view.report(state)
    # After cleanup, so the summary line really is the last one.
    sys.stdout.write(state.final_line() + "\n")
    sys.stdout.flush()


def run_demo(args: argparse.Namespace) -> int:
    options = load(DemoOptions, args)
    if options.pipeline:
        from worker.pipeline.demo import run_pipeline_demo

        return run_pipeline_demo(options)
    if options.offline:
        return run_offline_demo(options)
    return run_kafka_demo(options)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo",
        help="run the recorded Qwen3 streams through a local Kafka and two workers, showing them live",
    )
    add_arguments(demo, DemoOptions)
    demo.set_defaults(handler=run_demo)
