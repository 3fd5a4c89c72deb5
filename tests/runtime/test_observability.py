"""Prometheus export of the runtime's ``Metrics`` and the /metrics, /healthz, /readyz server."""

from __future__ import annotations

import argparse
import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from worker.errors import ConfigurationError
from worker.runtime.composition import dead_letter_limits
from worker.runtime.dead_letters.policy import DeadLetterLimits, DeadLetterPolicy
from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.health_server import (
    HealthServer,
    ReadinessState,
)
from worker.runtime.observability.metrics import Metrics
from worker.runtime.observability.prometheus_export import (
    ExportedMetrics,
    RuntimeMetricsCollector,
    build_registry,
    labelled,
    prometheus_name,
    split_labels,
    timing_base_name,
)
from worker.runtime.security.from_settings import kafka_security, load_kafka
from worker.settings import (
    DeadLetterSettings,
    KafkaSettings,
    LogFormat,
    LoggingSettings,
    ModelSettings,
    ObservabilitySettings,
    SecuritySettings,
    add_arguments,
    load,
)


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _collect(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in RuntimeMetricsCollector(metrics).collect():
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


# --- names ------------------------------------------------------------------------------------


def test_name_mapping() -> None:
    assert prometheus_name(m.RECORDS_CONSUMED) == "derender_records_consumed"
    assert prometheus_name(m.COMMITS_FORCED) == "derender_commits_forced_by_backpressure"
    assert timing_base_name(m.COMMIT_MS) == "derender_commit_seconds"
    assert timing_base_name(m.COMMIT_FLUSH_MS) == "derender_commit_flush_seconds"
    key = labelled("derender.consumer.lag", partition=3, topic="in-1")
    assert key == "derender.consumer.lag{partition=3,topic=in-1}"
    assert split_labels(key) == ("derender.consumer.lag", {"partition": "3", "topic": "in-1"})
    assert split_labels(m.RECORDS_CONSUMED) == (m.RECORDS_CONSUMED, {})
    assert labelled("a") == "a"
    with pytest.raises(ValueError, match="cannot be carried in a metric name"):
        labelled("a", topic='x"y')


def test_every_declared_name_maps_to_a_unique_prometheus_name() -> None:
    names = [v for k, v in vars(m).items() if k.isupper() and isinstance(v, str)]
    mapped = {timing_base_name(n) if n.endswith("_ms") else prometheus_name(n) for n in names}
    assert len(mapped) == len(names)


# --- the collector ----------------------------------------------------------------------------


def test_counters_gauges_and_histograms() -> None:
    metrics = ExportedMetrics(buckets_ms=(10, 100))
    metrics.increment(m.RECORDS_CONSUMED, 5)
    metrics.increment(m.RECORDS_DEAD_LETTERED)
    metrics.gauge(m.PARTITIONS_OWNED, 3)
    metrics.gauge(labelled("derender.consumer.lag", partition=0), 7)
    metrics.gauge(labelled("derender.consumer.lag", partition=1), 0)
    for ms in (5, 50, 500, 5):
        metrics.timing(m.COMMIT_MS, ms)
    samples = _collect(metrics)
    assert samples[("derender_records_consumed_total", ())] == 5
    assert samples[("derender_records_dead_lettered_total", ())] == 1
    assert samples[("derender_partitions_owned", ())] == 3
    assert samples[("derender_consumer_lag", (("partition", "0"),))] == 7
    assert samples[("derender_consumer_lag", (("partition", "1"),))] == 0
    assert samples[("derender_commit_seconds_bucket", (("le", "0.01"),))] == 2
    assert samples[("derender_commit_seconds_bucket", (("le", "0.1"),))] == 3
    assert samples[("derender_commit_seconds_bucket", (("le", "+Inf"),))] == 4
    assert samples[("derender_commit_seconds_count", ())] == 4
    assert samples[("derender_commit_seconds_sum", ())] == pytest.approx(0.56)
    # The in-process view is unchanged: the worker's log line and tests keep working.
    assert metrics.snapshot()["timings"][m.COMMIT_MS]["max"] == 500


def test_labelled_histograms() -> None:
    metrics = ExportedMetrics(buckets_ms=(10,))
    metrics.timing(labelled("derender.e2e_ms", topic="a"), 1)
    metrics.timing(labelled("derender.e2e_ms", topic="b"), 20)
    samples = _collect(metrics)
    assert samples[("derender_e2e_seconds_bucket", (("le", "0.01"), ("topic", "a")))] == 1
    assert samples[("derender_e2e_seconds_bucket", (("le", "0.01"), ("topic", "b")))] == 0
    assert samples[("derender_e2e_seconds_count", (("topic", "b"),))] == 1


def test_plain_metrics_export_recent_quantiles() -> None:
    metrics = Metrics()
    for ms in range(1, 101):
        metrics.timing(m.STATE_RESTORE_MS, ms)
    samples = _collect(metrics)
    assert samples[("derender_state_restore_recent_seconds", (("quantile", "1"),))] == pytest.approx(0.1)
    assert samples[("derender_state_restore_recent_seconds", (("quantile", "0.5"),))] == pytest.approx(0.051)


def test_buckets_must_increase() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        ExportedMetrics(buckets_ms=(10, 5))


@pytest.mark.parametrize("kind", [ExportedMetrics, Metrics])
def test_scrapes_while_another_thread_writes(kind: type[Metrics]) -> None:
    """Scrapes racing a writer see counters only grow, and the last one sees every write."""
    metrics = kind()
    stop, started = threading.Event(), threading.Event()
    written = 0

    def write() -> None:
        nonlocal written
        while not stop.is_set():
            i = written + 1
            metrics.increment(f"derender.c{i % 100}")
            metrics.gauge(f"derender.g{i % 100}", i)
            metrics.timing(f"derender.t{i % 100}_ms", i % 97)
            written = i
            started.set()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert started.wait(10)
        seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for _ in range(30):
            for key, value in _collect(metrics).items():
                if key[0].startswith("derender_c"):
                    assert value >= seen.get(key, 0), key
                    seen[key] = value
    finally:
        stop.set()
        writer.join()
    final = _collect(metrics)
    counters = {name: v for (name, _), v in final.items() if name.startswith("derender_c")}
    assert sum(counters.values()) == written
    # Each gauge holds the last value written to it: the largest i <= written with i % 100 == k.
    last_of = {k: written - (written - k) % 100 for k in range(100) if written - (written - k) % 100 >= 1}
    gauges = {name: v for (name, _), v in final.items() if name.startswith("derender_g")}
    assert gauges == {f"derender_g{k}": float(i) for k, i in last_of.items()}
    if kind is ExportedMetrics:  # its histograms count every timing
        counts = [
            v for (name, _), v in final.items() if name.startswith("derender_t") and name.endswith("count")
        ]
        assert sum(counts) == written


# --- readiness --------------------------------------------------------------------------------


def test_readiness_rules() -> None:
    readiness = ReadinessState()
    report = readiness.check()
    assert not report.ready and report.reasons == ["worker is created"]
    readiness.set_phase("running")
    assert readiness.check().ready  # owning no partition is ready (idle replica)
    readiness.partitions_assigned([2, 0])
    report = readiness.check()
    assert not report.ready
    assert report.reasons == ["state of partitions [0, 2] is not restored yet"]
    readiness.partitions_restored([0])
    assert readiness.check().detail["partitions"] == {"restored": [0], "restoring": [2]}
    readiness.partitions_restored([2])
    assert readiness.check().ready
    readiness.set_phase("rebalancing")
    assert readiness.check().ready

    policy = DeadLetterPolicy(DeadLetterLimits(max_consecutive=2, max_ratio=None))
    policy.observe(2, "malformed JSON")
    trip = policy.observe(2, "malformed JSON", offset=41)
    assert trip is not None
    readiness.breaker_tripped(trip)
    report = readiness.check()
    assert not report.ready
    assert report.reasons == [trip.describe()]
    body = json.loads(report.body())
    assert body["tripped"]["2"]["consecutive"] == 2
    assert body["tripped"]["2"]["last_reason"] == "malformed JSON"
    assert body["tripped"]["2"]["offset"] == 41
    # Reassignment (revoke) clears the partition's breaker.
    readiness.partitions_revoked([2])
    assert readiness.check().ready
    readiness.set_phase("stopping")
    assert readiness.check().reasons == ["worker is stopping"]


def test_readiness_phase_from_a_callable() -> None:
    phase = ["starting"]
    readiness = ReadinessState(phase=lambda: phase[0])
    assert not readiness.check().ready
    phase[0] = "running"
    assert readiness.check().ready
    later = ReadinessState()
    later.bind_phase(lambda: "stopping")
    assert later.check().reasons == ["worker is stopping"]


def test_flags_coexist_with_the_run_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new flag group fits on `run` next to its existing flags (no argparse conflicts)."""

    for name in ("DERENDER_SECURITY_PROTOCOL", "DERENDER_SASL_MECHANISM", "DERENDER_LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DERENDER_METRICS_PORT", "9464")  # deploy/kubernetes/configmap.yaml
    run = argparse.ArgumentParser()
    add_arguments(run, KafkaSettings)
    add_arguments(run, ModelSettings)
    add_arguments(run, ObservabilitySettings)
    add_arguments(run, SecuritySettings)
    add_arguments(run, DeadLetterSettings)
    add_arguments(run, LoggingSettings)
    args = run.parse_args(["--bootstrap-servers", "k:9092", "--dlq-topic", "dl", "--dlq-window", "50"])
    observability = load(ObservabilitySettings, args)
    assert (observability.metrics_port, load_kafka(KafkaSettings, args).dlq_topic) == (9464, "dl")
    assert load(LoggingSettings, args).log_format is LogFormat.TEXT
    assert dead_letter_limits(load(DeadLetterSettings, args)).window == 50
    assert kafka_security(load(SecuritySettings, args)).client_kwargs() == {"security_protocol": "PLAINTEXT"}


# --- the HTTP server --------------------------------------------------------------------------


@pytest.fixture
def served() -> Any:
    metrics = ExportedMetrics()
    readiness = ReadinessState()
    server = HealthServer(build_registry(metrics), readiness, port=0, host="0.0.0.0")
    server.start()
    try:
        yield server, metrics, readiness, f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def test_endpoints(served: Any) -> None:
    _, metrics, readiness, url = served
    status, ctype, body = _get(url + "/healthz")
    assert (status, ctype, json.loads(body)) == (200, "application/json", {"status": "alive"})

    status, _, body = _get(url + "/readyz")
    assert status == 503 and json.loads(body)["reasons"] == ["worker is created"]
    readiness.set_phase("running")
    status, _, body = _get(url + "/readyz")
    assert status == 200 and json.loads(body)["ready"] is True

    metrics.increment(m.RECORDS_CONSUMED, 3)
    metrics.timing(m.COMMIT_MS, 12)
    status, ctype, body = _get(url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    samples = _samples(body)
    assert samples[("derender_records_consumed_total", ())] == 3
    assert samples[("derender_commit_seconds_count", ())] == 1
    assert any(name.startswith("python_gc_") for name, _ in samples)  # process/runtime collectors

    assert _get(url + "/nope")[0] == 404


def test_stop_is_clean_and_idempotent() -> None:
    server = HealthServer(build_registry(Metrics(), process_metrics=False), ReadinessState(), port=0)
    server.start()
    port = server.port
    assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    server.stop()
    server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
    with pytest.raises(RuntimeError):
        _ = server.port
    # The port is free again.
    with HealthServer(build_registry(Metrics(), process_metrics=False), ReadinessState(), port=port) as again:
        assert again.port == port


def test_port_in_use_is_a_configuration_error(served: Any) -> None:
    server = served[0]
    with pytest.raises(ConfigurationError, match="cannot serve metrics"):
        HealthServer(
            build_registry(Metrics(), process_metrics=False), ReadinessState(), port=server.port
        ).start()


def test_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DERENDER_METRICS_PORT", raising=False)
    parser = argparse.ArgumentParser()
    add_arguments(parser, ObservabilitySettings)
    settings = load(ObservabilitySettings, parser.parse_args([]))
    assert (settings.metrics_port, settings.metrics_host) == (None, "0.0.0.0")  # None: 9464 or a free one
    monkeypatch.setenv("DERENDER_METRICS_PORT", "9999")
    parser = argparse.ArgumentParser()
    add_arguments(parser, ObservabilitySettings)
    assert load(ObservabilitySettings, parser.parse_args([])).metrics_port == 9999
    monkeypatch.setenv("DERENDER_METRICS_PORT", "http")
    with pytest.raises(ConfigurationError, match="DERENDER_METRICS_PORT"):
        load(ObservabilitySettings, parser.parse_args([]))
