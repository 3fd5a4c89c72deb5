"""Helpers for the Kafka worker tests: topics, worker processes, produce/read, replay, checks.

Worker processes run the real CLI (``python -m worker.cli run``) so SIGTERM and SIGKILL
are real; the reference is ``replay``: the same records through ``EnvelopeProcessor``
in-process, in produce order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.golden_cases import GOLDEN_VERSION, MODELS_DIR, normalize, sample_config
from tests.kafka_broker import TopicFactory
from tests.paths import REPO_ROOT
from tests.stream_builders import written
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.vllm_version import VllmVersion
from worker.runtime.kafka_client import make_client
from worker.runtime.kafka_client.base import (
    ClientKind,
    ConsumerConfig,
    GroupConsumer,
    Partitions,
    RebalanceCallbacks,
)
from worker.runtime.security.kafka_security import KafkaSecurity
from worker.runtime.topics import LARGE_RECORDS, STATE_TOPIC_CONFIG

QWEN3_CONFIG = sample_config()

Record = tuple[bytes | None, bytes]  # (key, value)

# The exactly-once tests run against every Kafka client backend and transactional-id mode
# (``pytest.mark.parametrize("client", CLIENTS)``, then ``WorkerGroup(..., client=client)``).
CLIENT_FLAGS: dict[str, tuple[str, ...]] = {
    "aiokafka": ("--kafka-client", "aiokafka", "--transactional-id-mode", "per-partition"),
    "confluent": ("--kafka-client", "confluent", "--transactional-id-mode", "per-partition"),
    "confluent-per-worker": ("--kafka-client", "confluent", "--transactional-id-mode", "per-worker"),
}
CLIENTS = list(CLIENT_FLAGS)


# --- the client layer alone ---------------------------------------------------------------------


async def ignore_partitions(partitions: Partitions) -> None:
    """An assign, revoke or lost callback for a test that only needs the group joined."""
    del partitions


async def joined_consumer(kind: ClientKind, bootstrap: str, topic: str, name: str) -> GroupConsumer:
    """A started client-layer consumer of ``kind`` in a fresh group that has ``topic`` assigned."""
    consumer = make_client(kind, KafkaSecurity()).consumer(
        ConsumerConfig(
            bootstrap_servers=bootstrap,
            client_id=f"{name}-test",
            group_id=f"{name}-{uuid.uuid4().hex[:8]}",
            session_timeout_ms=30_000,
            rebalance_timeout_ms=30_000,
            heartbeat_interval_ms=1_000,
            max_poll_records=500,
            metadata_max_age_ms=5_000,
        )
    )
    await consumer.start()
    consumer.subscribe([topic], RebalanceCallbacks(ignore_partitions, ignore_partitions, ignore_partitions))
    while not consumer.assignment():  # the empty topic gives nothing meanwhile
        await consumer.poll(200, 500)
    return consumer


# --- topics -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerTopics:
    input: str
    output: str
    state: str
    dlq: str
    partitions: int

    def args(self) -> list[str]:
        return [
            "--input-topic",
            self.input,
            "--output-topic",
            self.output,
            "--state-topic",
            self.state,
            "--dlq-topic",
            self.dlq,
        ]


def make_worker_topics(
    factory: TopicFactory, partitions: int, *, input_config: dict[str, str] | None = None
) -> WorkerTopics:
    """The four topics as ``topics create`` configures them (``run`` checks ``max.message.bytes``)."""
    inp = factory("derender-in", partitions, config=input_config)
    out, dlq = factory.many(["derender-out", "derender-dlq"], partitions, config=LARGE_RECORDS)
    state = factory("derender-state", partitions, config=STATE_TOPIC_CONFIG)
    return WorkerTopics(inp, out, state, dlq, partitions)


# --- worker processes ---------------------------------------------------------------------------


def model_args(config: dict[str, Any], version: VllmVersion = GOLDEN_VERSION) -> list[str]:
    """``run`` flags for a golden-case config, matching vLLM ``version``."""
    args = [
        "--tokenizer",
        str(MODELS_DIR / config["model_dir"]),
        "--served-model-name",
        config["served_model_name"],
        "--vllm-version",
        version.value,
    ]
    if config.get("max_model_len") is not None:
        args += ["--max-model-len", str(config["max_model_len"])]
    if config.get("max_logprobs") is not None:
        args += ["--max-logprobs", str(config["max_logprobs"])]
    if config.get("reasoning_parser"):
        args += ["--reasoning-parser", config["reasoning_parser"]]
    if config.get("tool_parser"):
        args += ["--tool-parser", config["tool_parser"]]
    if config.get("enable_auto_tool_choice"):
        args.append("--enable-auto-tool-choice")
    return args


@dataclass
class WorkerProcess:
    """One ``derender-worker run`` process; its stderr goes to a log file for failure messages."""

    name: str
    command: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    stopped_by_test: bool = False

    def start(self) -> WorkerProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KAFKA_BOOTSTRAP_SERVERS", None)  # the explicit flag wins anyway; keep runs explicit
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = 40.0) -> int:
        """SIGTERM and wait; returns the exit status (fails the test if it does not exit)."""
        assert self.proc is not None
        self.stopped_by_test = True
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"{self.name} did not exit within {timeout}s of SIGTERM\n{self.log_tail()}"
            ) from None

    def pause(self) -> None:
        """SIGSTOP: the process freezes mid-whatever (a GC pause, a stalled VM), then becomes a zombie."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        assert self.proc is not None
        self.stopped_by_test = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        status = self.proc.poll() if self.proc is not None else None
        ended = "" if status is None else f", exited with {status}"
        return f"--- {self.name} log tail{ended} ---\n" + "\n".join(text[-lines:])


class WorkerGroup:
    """Starts and tracks worker processes of one consumer group."""

    def __init__(
        self,
        bootstrap: str,
        topics: WorkerTopics,
        config: dict[str, Any],
        *,
        mode: str = "exactly-once",
        extra: Sequence[str] = (),
        group_id: str | None = None,
        client: str | None = None,
        version: VllmVersion = GOLDEN_VERSION,
    ) -> None:
        """``client``: a key of ``CLIENT_FLAGS``; ``None``: the worker's defaults."""
        self.group_id = group_id or f"derender-test-{uuid.uuid4().hex[:10]}"
        self.base = [
            sys.executable,
            "-m",
            "worker.cli",
            "run",
            "--bootstrap-servers",
            bootstrap,
            "--group-id",
            self.group_id,
            "--mode",
            mode,
            "--commit-interval-ms",
            "100",
            "--session-timeout-ms",
            "6000",
            *topics.args(),
            *model_args(config, version),
            *(CLIENT_FLAGS[client] if client is not None else ()),
            *extra,
        ]
        self.log_dir = Path(tempfile.mkdtemp(prefix="derender-workers-"))
        self.workers: list[WorkerProcess] = []

    def start(self, extra: Sequence[str] = ()) -> WorkerProcess:
        """Start one more worker; ``extra`` flags for this one only (e.g. its ``--metrics-port``)."""
        name = f"worker-{len(self.workers)}"
        command = [*self.base, "--client-id", name, *extra]
        if "--metrics-port" not in command:
            command += ["--metrics-port", "0"]  # parallel workers must not fight over 9464
        worker = WorkerProcess(name, command, self.log_dir / f"{name}.log")
        self.workers.append(worker.start())
        return worker

    @property
    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive]

    def logs(self) -> str:
        return "\n".join(w.log_tail() for w in self.workers)

    def check_no_unexpected_exit(self) -> None:
        """Fail if a worker exited that the test did not stop (a crash would otherwise go unseen)."""
        crashed = [w for w in self.workers if not w.alive and not w.stopped_by_test]
        if crashed:
            details = "\n".join(
                f"{w.name} exited with {w.proc.returncode if w.proc else None}\n{w.log_tail()}"
                for w in crashed
            )
            raise AssertionError(f"worker(s) exited unexpectedly:\n{details}")

    def stop_all(self) -> list[int]:
        """SIGTERM every running worker; their exit statuses. Fails on an earlier crash."""
        self.check_no_unexpected_exit()
        statuses, failures = [], []
        for w in self.alive:  # every one, even after one fails: none is left running
            try:
                statuses.append(w.terminate())
            except AssertionError as exc:
                failures.append(str(exc))
        if failures:
            raise AssertionError("\n".join(failures))
        return statuses

    def kill_all(self) -> None:
        for w in self.alive:
            w.kill()


def free_port() -> int:
    """A TCP port nothing listens on right now (for a worker's ``--metrics-port``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """Status and body of a GET (a 503 is an answer, not an exception); (0, b"") if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


async def wait_for_http(
    url: str,
    status: int,
    timeout: float,
    group: WorkerGroup | None = None,
    what: str = "",
    containing: bytes = b"",
) -> bytes:
    """Poll ``url`` until it answers ``status`` with a body ``containing`` that; the body. Fails on
    timeout (or a crashed worker)."""
    deadline = time.monotonic() + timeout
    last: tuple[int, bytes] = (0, b"")
    while True:
        last = await asyncio.to_thread(http_get, url)
        if last[0] == status and containing in last[1]:
            return last[1]
        if group is not None:
            group.check_no_unexpected_exit()
        if time.monotonic() > deadline:
            logs = group.logs() if group is not None else ""
            got = f"last {last[0]} {last[1]!r}"
            raise AssertionError(f"{url} did not answer {status} within {timeout:.0f}s {what}: {got}\n{logs}")
        await asyncio.sleep(0.2)


# --- producing and reading ----------------------------------------------------------------------

PRODUCE_TIMEOUT_MS = 120_000


async def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[Record],
    *,
    pace_per_s: float | None = None,
    batch: int = 10,
    partition: int | None = None,
    max_request_size: int = 1024 * 1024,
) -> list[tuple[int, int]]:
    """Produce in order (idempotent, so per-partition order holds); (partition, offset) of each.

    ``partition``: every record to that partition (default: the key's hash decides).
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        linger_ms=5,
        max_request_size=max_request_size,
        # A batch for a partition without a leader fails once this passes: a broker restart on a
        # loaded machine (tens of topics to reload) can outlast aiokafka's default 40 s.
        request_timeout_ms=PRODUCE_TIMEOUT_MS,
    )
    await producer.start()
    try:
        futures = []
        started = time.monotonic()
        for i, (key, value) in enumerate(records):
            futures.append(await producer.send(topic, value=value, key=key, partition=partition))
            if pace_per_s and (i + 1) % batch == 0:
                ahead = started + (i + 1) / pace_per_s - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
        metadata = await asyncio.gather(*futures)
        return [(md.partition, md.offset) for md in metadata]
    finally:
        await producer.stop()


@dataclass
class TopicReader:
    """Reads every partition of a topic (read_committed) from the beginning, in the background."""

    bootstrap: str
    topic: str
    records: list[Any] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _consumer: Any = None

    async def start(self) -> TopicReader:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await self._consumer.start()
        partitions = self._consumer.partitions_for_topic(self.topic)
        if not partitions:
            await self._consumer.topics()
            partitions = self._consumer.partitions_for_topic(self.topic)
        if not partitions:  # metadata of a fresh topic may need a refresh
            self._consumer.subscribe([self.topic])
        else:
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            self._consumer.assign(tps)
            await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            for records in batches.values():
                self.records.extend(records)

    async def wait_for(
        self, count: int, timeout: float, what: str = "records", diagnostics: Callable[[], str] | None = None
    ) -> None:
        deadline = time.monotonic() + timeout
        while len(self.records) < count:
            if self._task is not None and self._task.done():
                self._task.result()
            if time.monotonic() > deadline:
                extra = diagnostics() if diagnostics is not None else ""
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {count} {what} on {self.topic}: "
                    f"got {len(self.records)}\n{extra}"
                )
            await asyncio.sleep(0.1)

    async def settle(self, idle_s: float = 1.5) -> None:
        """Keep reading until nothing new arrived for ``idle_s`` (to catch late duplicates)."""
        last = -1
        while last != len(self.records):
            last = len(self.records)
            await asyncio.sleep(idle_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()


# --- replay and checks ----------------------------------------------------------------------------


@dataclass
class Replay:
    outputs: dict[str, list[dict[str, Any]]]  # per request_id, in order
    dead_letters: list[str]  # reasons, in order
    output_count: int


def replay(derenderer: Derenderer, records: Iterable[Record], max_record_bytes: int | None = None) -> Replay:
    """The reference: every record through one in-process ``EnvelopeProcessor`` in produce order."""
    processor = (
        EnvelopeProcessor(derenderer, max_record_bytes=max_record_bytes, require_key=True)
        if max_record_bytes
        else EnvelopeProcessor(derenderer, require_key=True)
    )
    outputs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    dead: list[str] = []
    count = 0
    for key, value in records:
        result = processor.process(value, key)
        if result.dead_letter is not None:
            dead.append(result.dead_letter.reason)
        elif result.output is not None:
            assert result.request_id is not None
            outputs[result.request_id].append(written(result))
            count += 1
    return Replay(dict(outputs), dead, count)


def outputs_by_request(records: Iterable[Any]) -> dict[str, list[dict[str, Any]]]:
    """Output records grouped by request, in read order (per-key order is per-partition order)."""
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        grouped[record.key.decode()].append(orjson.loads(record.value))
    return dict(grouped)


def _where_by_request(records: Iterable[Any]) -> dict[str, list[str]]:
    """Per request, each output's ``partition:offset`` and its input's (``source``), in read order:
    a duplicate read twice at one offset is the reader's; at two offsets, the worker wrote it twice."""
    found: dict[str, list[str]] = defaultdict(list)
    for record in records:
        source = orjson.loads(record.value).get("source") or {}
        found[record.key.decode()].append(
            f"{record.partition}:{record.offset}<{source.get('partition')}:{source.get('offset')}"
        )
    return dict(found)


def strip_source(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in o.items() if k != "source"} for o in outputs]


def compare_with_replay(records: Iterable[Any], reference: Replay) -> list[str]:
    """Problems found (empty: identical): missing, duplicated, reordered or different outputs."""
    got = outputs_by_request(records)
    where = _where_by_request(records)
    problems: list[str] = []
    for rid in sorted(set(got) - set(reference.outputs)):
        problems.append(f"{rid}: unexpected request in the output ({len(got[rid])} records)")
    for rid, expected in reference.outputs.items():
        actual = got.get(rid, [])
        want_seqs = [o["seq"] for o in expected]
        got_seqs = [o["seq"] for o in actual]
        if got_seqs != want_seqs:
            dups = sorted({s for s in got_seqs if got_seqs.count(s) > 1})
            missing = sorted(set(want_seqs) - set(got_seqs))
            problems.append(
                f"{rid}: seqs {got_seqs} != {want_seqs} (duplicated {dups}, missing {missing}); "
                f"read at / from {where.get(rid, [])}"
            )
            continue
        if normalize(strip_source(actual)) != normalize(expected):
            for a, e in zip(normalize(strip_source(actual)), normalize(expected), strict=True):
                if a != e:
                    problems.append(f"{rid} seq {e['seq']}: output differs:\n  got  {a}\n  want {e}")
                    break
    return problems


def assert_identical(records: Sequence[Any], reference: Replay, context: str = "") -> None:
    """Fail unless ``records`` are the reference's outputs exactly: none missing, duplicated (the
    reference has one output per input ``(request_id, seq)``), reordered or different."""
    problems = compare_with_replay(records, reference)
    if problems:
        shown = "\n".join(problems[:15])
        raise AssertionError(
            f"{len(problems)} request(s) differ from replay ({len(records)} output records read, "
            f"{reference.output_count} expected):\n{shown}\n{context}"
        )


# --- generated sequences ----------------------------------------------------------------------------

_WORDS = " ".join(
    [
        "the quick brown fox jumps over a lazy dog while streaming tokens arrive in order and",
        "every chunk carries one to five ids so decoding must hold partial characters across",
        "records; Kafka partitions keep requests apart, transactions keep outputs exact",
    ]
).split(" ")
_MULTIBYTE = [
    "héllo",
    "naïve",
    "日本語",
    "中文文本",
    "emoji 🚀",
    "🎉🎉",
    "Ελληνικά",
    "кириллица",
    "→",
    "ñandú",
]


def _text(rng: random.Random, words: int) -> str:
    parts = []
    for _ in range(words):
        parts.append(rng.choice(_MULTIBYTE) if rng.random() < 0.15 else rng.choice(_WORDS))
    return " ".join(parts)


@dataclass
class GeneratedSequence:
    request_id: str
    envelopes: list[dict[str, Any]]


def generate_sequences(
    count: int, *, seed: int = 7, prefix: str = "req", model_dir: str = "qwen3"
) -> list[GeneratedSequence]:
    """``count`` streamed requests (chat and completion, ~20% n=2) of 3-8 records each.

    Output ids are the qwen3 tokenizer's encoding of varied text (multi-byte characters
    straddle records), cut into chunks of 1-5 tokens; the last chunk of each choice
    finishes with ``stop`` or ``length``.
    """
    from tests.parsing_helpers import sample_tokenizer

    tokenizer = sample_tokenizer(model_dir).backend
    rng = random.Random(seed)
    sequences = []
    for i in range(count):
        rid = f"{prefix}-{i:05d}"
        endpoint = rng.choice(["chat", "completion"])
        n = 2 if rng.random() < 0.2 else 1
        records_total = rng.randint(max(3, n * 2), 8)
        per_choice = [records_total // n + (1 if c < records_total % n else 0) for c in range(n)]
        prompt = _text(rng, rng.randint(3, 10))
        prompt_ids = tokenizer.encode(prompt).ids[:32]
        chunks: list[list[tuple[int, list[int], str | None]]] = []
        for c in range(n):
            ids = tokenizer.encode(_text(rng, 30)).ids
            pos = 0
            mine = []
            for r in range(per_choice[c]):
                size = rng.randint(1, 5)
                piece = ids[pos : pos + size]
                pos += size
                last = r == per_choice[c] - 1
                mine.append((c, piece, rng.choice(["stop", "length"]) if last else None))
            chunks.append(mine)
        # Interleave the choices' records as an engine would emit them.
        order: list[tuple[int, list[int], str | None]] = []
        while any(chunks):
            c = rng.choice([k for k, v in enumerate(chunks) if v])
            order.append(chunks[c].pop(0))
        if endpoint == "chat":
            request_field, request = (
                "chat_request",
                {"model": "test-model", "messages": [{"role": "user", "content": prompt}], "stream": True},
            )
        else:
            request_field, request = (
                "completion_request",
                {"model": "test-model", "prompt": prompt, "stream": True},
            )
        if n > 1:
            request["n"] = n
        envelopes = []
        for seq, (index, ids, finish) in enumerate(order):
            choice: dict[str, Any] = {"index": index, "token_ids": ids}
            if finish is not None:
                choice["finish_reason"] = finish
            body: dict[str, Any] = {
                "stream": True,
                "generate_chunk": {"request_id": rid, "choices": [choice]},
            }
            if seq == 0:
                body.update(
                    {"prompt_tokens": len(prompt_ids), "prompt_token_ids": prompt_ids, request_field: request}
                )
            envelopes.append({"request_id": rid, "seq": seq, "endpoint": endpoint, "body": body})
        sequences.append(GeneratedSequence(rid, envelopes))
    return sequences


def interleave(sequences: Sequence[GeneratedSequence], *, seed: int = 11, window: int = 200) -> list[Record]:
    """All records as (key, value), sequences interleaved (about ``window`` open at a time)."""
    rng = random.Random(seed)
    pending = [list(s.envelopes) for s in sequences]
    active: list[int] = []
    next_seq = 0
    out: list[Record] = []
    while active or next_seq < len(pending):
        while len(active) < window and next_seq < len(pending):
            active.append(next_seq)
            next_seq += 1
        k = rng.randrange(len(active))
        envelope = pending[active[k]].pop(0)
        out.append((envelope["request_id"].encode(), orjson.dumps(envelope)))
        if not pending[active[k]]:
            active.pop(k)
    return out


# --- reading outputs ---------------------------------------------------------------------------


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a Prometheus exposition, or ``None``."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return None


def duplicates(records: list[Any]) -> list[tuple[str, int]]:
    """Each (request_id, seq) seen more than once, once per extra copy."""
    seen: set[tuple[str, int]] = set()
    dups = []
    for record in records:
        out = orjson.loads(record.value)
        ident = (out["request_id"], out["seq"])
        if ident in seen:
            dups.append(ident)
        seen.add(ident)
    return dups


def fetched_bytes(bootstrap: str, topic: str, count: int) -> tuple[int, int]:
    """Bytes librdkafka received from the brokers to read ``count`` committed records of ``topic``
    (the batches as stored: compressed as produced), and those records' key + value bytes."""
    received: list[int] = []

    def stats(text: str) -> None:
        brokers = json.loads(text)["brokers"].values()
        received.append(sum(b["rxbytes"] for b in brokers if b["nodeid"] >= 0))

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"derender-test-wire-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "statistics.interval.ms": 100,
            "stats_cb": stats,
        }
    )
    consumer.subscribe([topic])
    seen = payload = 0
    try:
        for _ in range(600):  # 0.1 s polls; a bound, not a timing
            if seen >= count:
                break
            for message in consumer.consume(1000, 0.1):
                if message.error() is None:
                    seen += 1
                    payload += len(message.key() or b"") + len(message.value() or b"")
        if seen < count:
            raise AssertionError(f"read {seen} of {count} records of {topic}")
        reports = len(received)
        for _ in range(100):  # a statistics report taken after the last fetch
            if len(received) >= reports + 2:
                break
            consumer.poll(0.1)
    finally:
        consumer.close()
    return received[-1], payload
