"""``ingest``'s ``/metrics``, ``/healthz`` and ``/readyz``, on ``--metrics-port`` (the worker's server).

* ``/healthz``: the event loop's heartbeat (``loop_heartbeat``): 503 once the loop has not run for
  10 s, so a liveness probe restarts an ingest whose loop is stuck, not only a dead one.
* ``/readyz``: 200 while ingest runs and its loop beats; 503 before, while stopping, or stalled.
* ``/metrics``: the process collectors, the loop's lag (``derender_loop_lag_seconds``), and the
  partitions and requests ingest holds, read on the loop at every beat.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sized
from typing import Any, Protocol

from worker.commands.run import start_health_server
from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.health_server import HealthServer, ReadinessState
from worker.runtime.observability.loop_heartbeat import LoopHeartbeat
from worker.runtime.observability.prometheus_export import ExportedMetrics, build_registry
from worker.settings import MetricsServerSettings


class _Partition(Protocol):
    @property
    def running(self) -> Sized: ...


class Observed(Protocol):
    """What the gauges read of ``Ingest``."""

    @property
    def partitions(self) -> Mapping[Any, _Partition]: ...


@contextlib.asynccontextmanager
async def serving_health(
    settings: MetricsServerSettings, ingest: Observed, metrics: ExportedMetrics | None = None
) -> AsyncIterator[HealthServer]:
    """Serves the endpoints and beats while the block runs (the block runs ingest)."""
    metrics = metrics or ExportedMetrics()

    def gauges() -> None:
        partitions = list(ingest.partitions.values())
        metrics.gauge(m.INGEST_PARTITIONS_OWNED, len(partitions))
        metrics.gauge(m.INGEST_REQUESTS_RUNNING, sum(len(p.running) for p in partitions))

    heartbeat = LoopHeartbeat(metrics, on_beat=gauges)
    phase = ["running"]
    readiness = ReadinessState(lambda: phase[0] if heartbeat.check().ready else "stalled")
    server = start_health_server(settings, build_registry(metrics), readiness, liveness=heartbeat.check)
    try:
        async with heartbeat.running():
            try:
                yield server
            finally:
                phase[0] = "stopping"
    finally:
        server.stop()
