"""``ingest``'s health endpoints: ``/healthz`` follows the event loop's heartbeat, ``/metrics`` exports
what ingest holds. A loop blocked by real work (``time.sleep`` on the loop) must fail ``/healthz``
while the probe is answered from the server's own thread."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import pytest

from worker.cli import build_parser
from worker.pipeline.ingest_health import serving_health
from worker.runtime.observability.loop_heartbeat import LoopHeartbeat
from worker.runtime.observability.metrics import Metrics
from worker.runtime.observability.prometheus_export import ExportedMetrics
from worker.settings import MetricsServerSettings, load


@dataclass
class _Partition:
    running: dict[int, object] = field(default_factory=dict)


@dataclass
class _Ingest:
    partitions: dict[int, _Partition] = field(default_factory=dict)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_heartbeat_reports_a_stall_past_its_limit() -> None:
    now = [100.0]
    heartbeat = LoopHeartbeat(Metrics(), interval_s=1, stall_after_s=10, clock=lambda: now[0])
    assert heartbeat.check().ready  # not started yet: a startup probe decides, not this
    heartbeat.beat()
    now[0] += 9.5
    assert heartbeat.check().ready
    now[0] += 1
    report = heartbeat.check()
    assert not report.ready and "has not run for 10.5 s" in report.reasons[0]
    with pytest.raises(ValueError, match="interval"):
        LoopHeartbeat(Metrics(), interval_s=5, stall_after_s=5)


def test_healthz_fails_while_the_loop_is_blocked_and_metrics_show_ingest() -> None:
    metrics = ExportedMetrics()
    ingest = _Ingest({0: _Partition({1: object(), 2: object()}), 1: _Partition()})
    seen: dict[str, Any] = {}

    async def body() -> None:
        settings = MetricsServerSettings(metrics_port=0, metrics_host="127.0.0.1")
        async with serving_health(settings, ingest, metrics) as server:
            url = f"http://127.0.0.1:{server.port}"
            seen["port"] = server.port
            # The server heartbeat has the real limits: shrink them for the test.
            heartbeat = _heartbeat_of(metrics)
            await asyncio.sleep(1.2)
            seen["alive"] = await asyncio.to_thread(_get, url + "/healthz")
            seen["ready"] = await asyncio.to_thread(_get, url + "/readyz")
            seen["metrics"] = await asyncio.to_thread(_get, url + "/metrics")
            polled: list[tuple[int, bytes]] = []
            poller = threading.Thread(target=lambda: _poll(url + "/healthz", polled, heartbeat))
            poller.start()
            # The point: hold the loop, as a slow handler would. No beat meanwhile.
            time.sleep(heartbeat.stall_after_s + 1.5)  # noqa: ASYNC251
            poller.join()
            seen["blocked"] = polled
            await asyncio.sleep(1.2)
            seen["after"] = await asyncio.to_thread(_get, url + "/healthz")

    asyncio.run(body())
    assert seen["alive"][0] == 200 and json.loads(seen["alive"][1])["status"] == "alive"
    assert seen["ready"][0] == 200
    text = seen["metrics"][1].decode()
    assert "derender_ingest_partitions_owned 2.0" in text
    assert "derender_ingest_requests_running 2.0" in text
    assert "derender_loop_lag_seconds_count" in text
    status, payload = seen["blocked"][-1]
    assert status == 503 and "has not run for" in json.loads(payload)["reasons"][0]
    assert seen["after"][0] == 200  # the loop runs again: alive again
    with pytest.raises(urllib.error.URLError):  # stopped with ingest
        urllib.request.urlopen(f"http://127.0.0.1:{seen['port']}/healthz", timeout=1)


def _heartbeat_of(metrics: ExportedMetrics) -> LoopHeartbeat:
    beats = [h for h in _HEARTBEATS if h.metrics is metrics]
    assert len(beats) == 1
    return beats[0]


def _poll(url: str, out: list[tuple[int, bytes]], heartbeat: LoopHeartbeat) -> None:
    deadline = time.monotonic() + heartbeat.stall_after_s + 1
    while time.monotonic() < deadline:
        out.append(_get(url))
        time.sleep(0.2)


_HEARTBEATS: list[LoopHeartbeat] = []


@pytest.fixture(autouse=True)
def _short_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats of 0.1 s that stall after 1 s, so the test blocks its loop for seconds, not 10."""
    original = LoopHeartbeat.__init__

    def init(self: LoopHeartbeat, metrics: Metrics, **kwargs: Any) -> None:
        kwargs.setdefault("interval_s", 0.1)
        kwargs.setdefault("stall_after_s", 1.0)
        original(self, metrics, **kwargs)
        _HEARTBEATS.append(self)

    monkeypatch.setattr(LoopHeartbeat, "__init__", init)


def test_ingest_takes_the_metrics_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DERENDER_METRICS_PORT", raising=False)
    args = build_parser().parse_args(["ingest", "--metrics-port", "9465", "--metrics-host", "127.0.0.1"])
    settings = load(MetricsServerSettings, args)
    assert (settings.metrics_port, settings.metrics_host) == (9465, "127.0.0.1")
