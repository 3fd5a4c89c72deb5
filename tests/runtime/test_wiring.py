"""Broker-free checks that the issue-5 pieces are wired into the runtime.

Security kwargs reaching every aiokafka client (the classes are replaced by recorders here, in
a unit test only; the integration tests in ``tests/kafka/test_operations.py`` use the real broker), the
memory caps and the dead-letter breaker inside ``OwnedPartition``, fatal group errors as
configuration errors.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka.errors import InvalidSessionTimeoutError, KafkaError

from tests.golden_cases import derenderer_for
from tests.kafka_helpers import QWEN3_CONFIG, generate_sequences
from tests.partition_fakes import TOPICS, FakeRecord, RecordingSink, owned_partition, run_settings
from tests.paths import REPO_ROOT
from tests.runtime.worker_fakes import new_worker
from worker.cli import build_parser, main
from worker.errors import ConfigurationError
from worker.runtime import topics
from worker.runtime.dead_letters.policy import DeadLetterLimits, DeadLetterPolicy
from worker.runtime.delivery import PRODUCER_LINGER_MS, producer_config
from worker.runtime.kafka_client import aiokafka_backend
from worker.runtime.kafka_client.base import TopicPartition
from worker.runtime.memory import OPENING_FACTOR, REQUEST_BASE_BYTES, MemoryBudget
from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.prometheus_export import labelled
from worker.runtime.partition import OwnedPartition
from worker.runtime.security.from_settings import load_kafka
from worker.runtime.worker import configuration_error
from worker.settings import (
    KafkaTopics,
    ModelSettings,
    ObservabilitySettings,
    load,
)

SASL = [
    "--security-protocol",
    "SASL_PLAINTEXT",
    "--sasl-mechanism",
    "SCRAM-SHA-512",
    "--sasl-username",
    "svc",
    "--sasl-password",
    "pw-123",
]
SECURITY_ENV = [
    "DERENDER_SECURITY_PROTOCOL",
    "DERENDER_SASL_MECHANISM",
    "DERENDER_SASL_USERNAME",
    "DERENDER_SASL_PASSWORD",
    "DERENDER_MAX_OPEN_REQUESTS",
    "DERENDER_MAX_STATE_BYTES",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SECURITY_ENV:
        monkeypatch.delenv(name, raising=False)


# --- security ---------------------------------------------------------------------------------


def test_settings_carry_security_and_caps() -> None:
    settings = run_settings(*SASL, "--max-open-requests", "7", "--max-state-bytes", "0")
    kwargs = settings.security.client_kwargs()
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("svc", "pw-123")
    assert "pw-123" not in repr(settings)
    assert (settings.max_open_requests, settings.max_state_bytes) == (7, 0)
    options = aiokafka_backend.producer_options(producer_config(settings, "c"), kwargs)
    assert options["sasl_plain_password"] == "pw-123" and options["enable_idempotence"] is True
    assert run_settings().security.client_kwargs() == {"security_protocol": "PLAINTEXT"}
    with pytest.raises(ConfigurationError, match="max-open-requests"):
        run_settings("--max-open-requests", "-1")
    # `topics create` has the flags too.
    create = build_parser().parse_args(["topics", "create", "--bootstrap-servers", "k:1", *SASL])
    assert load_kafka(KafkaTopics, create).security.sasl_username == "svc"


class _Recorder:
    """Stands in for an aiokafka client class: records its kwargs, answers what the worker asks."""

    made: list[tuple[str, dict[str, Any]]]

    def __init__(self, **kwargs: Any) -> None:
        self.made.append((type(self).__name__, kwargs))

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        return [{"topic": n, "error_code": 0, "partitions": [{"leader": 0}]} for n in names]

    async def create_topics(self, new_topics: list[Any], timeout_ms: int) -> Any:
        return SimpleNamespace(topic_errors=[(t.name, 0) for t in new_topics])

    async def describe_configs(self, resources: list[Any]) -> list[Any]:
        entries: list[tuple[str, str, bool, int, bool, list[Any]]] = [
            ("max.message.bytes", str(64 * 1024 * 1024), False, 1, False, [])
        ]
        return [SimpleNamespace(resources=[(0, "", 2, r.name, entries) for r in resources])]

    def subscribe(self, topics: list[str], listener: Any) -> None:
        pass


def test_security_kwargs_reach_every_client(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, dict[str, Any]]] = []
    classes = {}
    for name in ("Consumer", "Admin", "Producer"):
        classes[name] = type(name, (_Recorder,), {"made": made})
    # The group consumer and the restore's two group-less readers.
    monkeypatch.setattr(aiokafka_backend, "AIOKafkaConsumer", classes["Consumer"])
    monkeypatch.setattr(aiokafka_backend, "AIOKafkaAdminClient", classes["Admin"])
    monkeypatch.setattr(aiokafka_backend, "AIOKafkaProducer", classes["Producer"])
    aiokafka = ["--kafka-client", "aiokafka"]  # librdkafka's settings: test_kafka_client
    settings = run_settings(
        *SASL, *aiokafka, "--input-topic", "i", "--output-topic", "o", "--state-topic", "s"
    )
    model = ModelSettings(tokenizer="x", max_record_bytes=1024)
    worker = new_worker(settings, model)
    asyncio.run(worker._start_clients())
    worker._new_sink(TopicPartition("i", 0))  # exactly-once: a transactional producer
    at_least_once = run_settings(*SASL, *aiokafka, "--mode", "at-least-once")
    new_worker(at_least_once, model)._new_sink(TopicPartition("i", 1))
    asyncio.run(topics.create_topics("k:9092", TOPICS, 1, 1, settings.security.client_kwargs()))
    kinds = [kind for kind, _ in made]
    assert sorted(set(kinds)) == ["Admin", "Consumer", "Producer"]
    # Admin clients: partition counts and max.message.bytes at start-up, then `topics create`
    # (creating, then waiting for leaders).
    assert kinds.count("Producer") == 2 and kinds.count("Admin") == 4 and kinds.count("Consumer") == 3
    for kind, kwargs in made:
        assert kwargs["security_protocol"] == "SASL_PLAINTEXT", kind
        assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512", kind
        assert kwargs["sasl_plain_password"] == "pw-123", kind
    transactional = [kw for kind, kw in made if kind == "Producer" and "transactional_id" in kw]
    assert len(transactional) == 1
    # aiokafka does not batch under the commit (``Worker._batches_under_commit``).
    assert transactional[0]["linger_ms"] == PRODUCER_LINGER_MS
    (consumer,) = [kw for kind, kw in made if kind == "Consumer" and kw["group_id"] is not None]
    readers = [kw for kind, kw in made if kind == "Consumer" and kw["group_id"] is None]
    assert sorted(kw["isolation_level"] for kw in readers) == ["read_committed", "read_uncommitted"]
    assert (consumer["fetch_min_bytes"], consumer["fetch_max_wait_ms"]) == (1, 500)


def test_sasl_ssl_without_credentials_exits_2() -> None:
    """The real command line: a configuration error, exit status 2, no traceback, no connection."""
    command = [sys.executable, "-m", "worker.cli", "run", "--bootstrap-servers", "127.0.0.1:1"]
    command += [
        "--tokenizer",
        "samples/models/qwen3",
        "--security-protocol",
        "SASL_SSL",
        "--metrics-port",
        "0",
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "configuration error: --security-protocol SASL_SSL needs --sasl-mechanism" in done.stderr
    assert "Traceback" not in done.stderr
    # With a mechanism but no password, the message names the missing credentials.
    argv = [
        "run",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--tokenizer",
        "x",
        "--security-protocol",
        "SASL_SSL",
    ]
    assert main([*argv, "--sasl-mechanism", "PLAIN", "--sasl-username", "u"]) == 2


def test_fatal_group_errors_are_configuration_errors() -> None:
    settings = run_settings("--session-timeout-ms", "3000")
    error = configuration_error(aiokafka_backend.translate(InvalidSessionTimeoutError()), settings)
    assert error is not None
    assert "--session-timeout-ms 3000" in str(error) and "group.min.session.timeout.ms" in str(error)
    assert configuration_error(aiokafka_backend.translate(KafkaError()), settings) is None
    assert configuration_error(RuntimeError(), settings) is None


# --- OwnedPartition: breaker and memory caps ---------------------------------------------------


def _task(budget: MemoryBudget | None = None, policy: DeadLetterPolicy | None = None) -> OwnedPartition:
    return owned_partition(derenderer_for(QWEN3_CONFIG), RecordingSink(), dead_letters=policy, budget=budget)


def _outputs(task: OwnedPartition) -> list[dict[str, Any]]:
    assert isinstance(task.sink, RecordingSink)
    return [orjson.loads(r.value) for r in task.sink.sent if r.topic == "out" and r.value is not None]


class BadRecord(FakeRecord):
    def __init__(self, offset: int) -> None:
        super().__init__(offset, {"request_id": "bad"})
        self.value = b"{not json"


def test_breaker_trips_inside_the_task() -> None:
    policy = DeadLetterPolicy(DeadLetterLimits(max_ratio=None, max_consecutive=3))
    task = _task(policy=policy)
    (good,) = generate_sequences(1, seed=2, prefix="ok")

    async def body() -> None:
        await task.handle(FakeRecord(0, good.envelopes[0]))
        for offset in (1, 2):
            await task.handle(BadRecord(offset))
            assert task.trip is None
        await task.handle(BadRecord(3))

    asyncio.run(body())
    assert task.trip is not None and task.trip.partition == 2 and task.trip.offset == 3
    assert "malformed JSON" in task.trip.last_reason
    assert policy.is_tripped(2) and task.position == 4
    counters = task.metrics.counters
    assert counters[labelled(m.RECORDS_PRODUCED, topic="dlq")] == 3
    assert counters[labelled(m.RECORDS_PRODUCED, topic="out")] == 1


def test_open_request_cap_refuses_new_requests_only() -> None:
    budget = MemoryBudget(max_open_requests=2)
    task = _task(budget)
    a, b, c, d = generate_sequences(4, seed=5, prefix="cap")
    offsets = iter(range(1000))

    async def feed(*envelopes: dict[str, Any]) -> None:
        for envelope in envelopes:
            await task.handle(FakeRecord(next(offsets), envelope))

    async def body() -> None:
        await feed(a.envelopes[0], b.envelopes[0])
        assert budget.open_requests == 2
        await feed(c.envelopes[0])  # a third request: refused
        await feed(a.envelopes[1])  # an open one: goes on
        await feed(*a.envelopes[2:])  # `a` finishes: room for one
        assert budget.open_requests == 1
        await feed(d.envelopes[0])
        await task.commit()

    asyncio.run(body())
    outputs = {(o["request_id"], o["seq"]): o for o in _outputs(task)}
    refused = outputs[("cap-00002", 0)]
    assert refused["error"]["code"] == 503 and refused["error"]["type"] == "ServiceUnavailableError"
    assert "cap of 2 open requests (--max-open-requests)" in refused["error"]["message"]
    assert all("error" not in o for k, o in outputs.items() if k[0] != "cap-00002")
    assert ("cap-00003", 0) in outputs and len(outputs) == 2 + 1 + len(a.envelopes) - 1 + 1
    assert task.metrics.counters[labelled(m.REQUESTS_REJECTED, cap="open_requests")] == 1
    assert budget.open_requests == 2 and set(task.sizes) == {"cap-00001", "cap-00003"}
    task.release()
    assert (budget.open_requests, budget.state_bytes) == (0, 0)


def test_state_bytes_cap_counts_live_bytes() -> None:
    """The cap counts an open request's estimated live bytes (more than its serialized bytes)."""
    a, b = generate_sequences(2, seed=9, prefix="bytes")
    first = orjson.dumps(a.envelopes[0])
    probe = _task(MemoryBudget())
    asyncio.run(probe.handle(FakeRecord(0, a.envelopes[0])))
    live = probe.sizes["bytes-00000"]
    ctx = probe.processor.requests["bytes-00000"]
    assert live == ctx.live_bytes() > len(first)
    # Room for `a` (as a new request of its record's size) but not for `b` next to it.
    cap = max(live + 1, REQUEST_BASE_BYTES + OPENING_FACTOR * len(first))
    budget = MemoryBudget(max_state_bytes=cap)
    task = _task(budget)

    async def body() -> None:
        await task.handle(FakeRecord(0, a.envelopes[0]))
        assert budget.state_bytes == live
        await task.handle(FakeRecord(1, b.envelopes[0]))  # would pass the cap: refused
        await task.handle(FakeRecord(2, a.envelopes[1]))  # the open request grows: re-estimated
        assert budget.state_bytes == task.sizes["bytes-00000"] > 0

    asyncio.run(body())
    refused = [o for o in _outputs(task) if o["request_id"] == "bytes-00001"]
    assert len(refused) == 1 and refused[0]["error"]["code"] == 503
    assert f"cap of {cap} bytes of live request state" in refused[0]["error"]["message"]
    assert task.metrics.counters[labelled(m.REQUESTS_REJECTED, cap="state_bytes")] == 1
    task.release()
    assert (budget.open_requests, budget.state_bytes) == (0, 0)


def test_a_one_shot_request_is_not_refused_at_the_cap() -> None:
    budget = MemoryBudget(max_open_requests=1)
    task = _task(budget)
    (a,) = generate_sequences(1, seed=3, prefix="open")
    one_shot = {
        "request_id": "one-shot",
        "seq": 0,
        "endpoint": "completion",
        "body": {"model": "test-model", "prompt_tokens": 1, "prompt_token_ids": [1], "generate_response": {}},
    }

    async def body() -> None:
        await task.handle(FakeRecord(0, a.envelopes[0]))
        await task.handle(FakeRecord(1, one_shot))

    asyncio.run(body())
    (out,) = [o for o in _outputs(task) if o["request_id"] == "one-shot"]
    # Processed (whatever the core answers), not refused by the cap.
    assert out.get("error", {}).get("code") != 503
    assert not task.metrics.counters.get(labelled(m.REQUESTS_REJECTED, cap="open_requests"))


# --- the metrics port -------------------------------------------------------------------------


def test_an_unchosen_metrics_port_falls_back_to_a_free_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers on one host (`demo`) without --metrics-port: the second one takes a free port."""
    from worker.commands.run import start_health_server
    from worker.defaults import DEFAULT_METRICS_PORT
    from worker.runtime.observability.health_server import ReadinessState
    from worker.runtime.observability.prometheus_export import ExportedMetrics, build_registry

    monkeypatch.delenv("DERENDER_METRICS_PORT", raising=False)
    run = ["run", "--tokenizer", "x"]
    assert load(ObservabilitySettings, build_parser().parse_args(run)).metrics_port is None
    monkeypatch.setenv("DERENDER_METRICS_PORT", "9464")  # what every file in deploy/ sets
    assert load(ObservabilitySettings, build_parser().parse_args(run)).metrics_port == 9464
    registry = build_registry(ExportedMetrics(), process_metrics=False)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("0.0.0.0", DEFAULT_METRICS_PORT))
            taken.listen()
        except OSError:
            pass  # something else holds it already: just as good
        args = ObservabilitySettings(metrics_port=None, metrics_host="0.0.0.0")
        server = start_health_server(args, registry, ReadinessState())
        try:
            assert server.port != DEFAULT_METRICS_PORT
        finally:
            server.stop()
        chosen = ObservabilitySettings(metrics_port=DEFAULT_METRICS_PORT, metrics_host="0.0.0.0")
        with pytest.raises(ConfigurationError, match="cannot serve metrics"):
            start_health_server(chosen, registry, ReadinessState())
