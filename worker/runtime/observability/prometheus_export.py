"""Publishes the runtime's in-process ``Metrics`` registry to Prometheus, so names stay declared once.

The names live in ``metrics_names`` (``derender.records.consumed``); this module only translates,
at scrape time, by a custom collector that reads the registry:

* counter ``derender.records.consumed``  -> ``derender_records_consumed_total`` (counter)
* gauge   ``derender.requests.open``     -> ``derender_requests_open`` (gauge)
* timing  ``derender.commit_ms``         -> ``derender_commit_seconds`` (histogram, seconds: the
  Prometheus base unit). Histograms need every sample, so they come from ``ExportedMetrics``, a
  ``Metrics`` that also folds each timing into cumulative buckets; hand one to
  ``composition.worker_parts(metrics=...)``. With a plain ``Metrics`` the collector falls back to
  the recent-window quantiles of ``snapshot()`` as the gauge
  ``derender_commit_recent_seconds{quantile="0.5|0.99|1"}``.

Labels: the registry has none, so a label set travels in the name: ``labelled(m.CONSUMER_LAG,
partition=3)`` is the key ``derender.consumer.lag{partition=3}``, exported as
``derender_consumer_lag{partition="3"}``.

Scrapes run on the HTTP server's thread while the event loop writes the registry. Copies of the
dicts and deques are single C-level operations under the GIL; a copy that still meets a
concurrent resize is retried.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from worker.runtime.observability.metrics import Metrics

# Upper bounds in milliseconds: from a fast derender step (~1 ms) to a slow restore (a minute).
DEFAULT_BUCKETS_MS: tuple[float, ...] = (
    1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
)  # fmt: skip
_COPY_ATTEMPTS = 5
_INVALID = re.compile(r"[^a-zA-Z0-9_]")
_LABEL_VALUE_FORBIDDEN = re.compile(r'[{}=,"\\\n]')


# --- names ------------------------------------------------------------------------------------


def labelled(name: str, **labels: object) -> str:
    """The registry key of ``name`` with labels: ``labelled("a.b", partition=3)`` -> ``a.b{partition=3}``."""
    if not labels:
        return name
    parts = []
    for key, value in sorted(labels.items()):
        text = str(value)
        if _LABEL_VALUE_FORBIDDEN.search(text) or _INVALID.search(key):
            raise ValueError(f"label {key}={text!r} cannot be carried in a metric name")
        parts.append(f"{key}={text}")
    return f"{name}{{{','.join(parts)}}}"


def split_labels(key: str) -> tuple[str, dict[str, str]]:
    """The inverse of ``labelled``."""
    if not key.endswith("}") or "{" not in key:
        return key, {}
    name, _, body = key[:-1].partition("{")
    labels = {}
    for pair in body.split(","):
        label, _, value = pair.partition("=")
        labels[label] = value
    return name, labels


def prometheus_name(name: str) -> str:
    """``derender.records.consumed`` -> ``derender_records_consumed`` (``_total`` is added per type)."""
    return _INVALID.sub("_", name)


def timing_base_name(name: str) -> str:
    """``derender.commit.flush_ms`` -> ``derender_commit_flush_seconds``."""
    base = prometheus_name(name)
    base = base.removesuffix("_ms")
    return f"{base}_seconds"


# --- cumulative histograms --------------------------------------------------------------------


class _Histogram:
    """Cumulative bucket counts of one timing; guarded by the owning ``ExportedMetrics``' lock."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value


class ExportedMetrics(Metrics):
    """A ``Metrics`` that also keeps cumulative histograms of every timing, for Prometheus."""

    def __init__(self, buckets_ms: tuple[float, ...] = DEFAULT_BUCKETS_MS) -> None:
        super().__init__()
        if list(buckets_ms) != sorted(set(buckets_ms)):
            raise ValueError("histogram buckets must be strictly increasing")
        self.buckets_ms = buckets_ms
        self._histograms: dict[str, _Histogram] = {}
        self._lock = threading.Lock()  # uncontended except during a scrape

    def timing(self, name: str, value_ms: float) -> None:
        super().timing(name, value_ms)
        with self._lock:
            histogram = self._histograms.get(name)
            if histogram is None:
                histogram = self._histograms[name] = _Histogram(self.buckets_ms)
            histogram.observe(value_ms)

    def histograms(self) -> dict[str, tuple[list[tuple[str, float]], float]]:
        """Per timing: cumulative ``(le seconds, count)`` buckets up to ``+Inf``, and the sum in seconds."""
        with self._lock:
            copies = {name: (list(h.counts), h.sum) for name, h in self._histograms.items()}
        out = {}
        for name, (counts, total_ms) in copies.items():
            buckets: list[tuple[str, float]] = []
            running = 0
            for bound, count in zip((*self.buckets_ms, float("inf")), counts, strict=True):
                running += count
                le = "+Inf" if bound == float("inf") else repr(bound / 1000)
                buckets.append((le, float(running)))
            out[name] = (buckets, total_ms / 1000)
        return out


# --- the collector ----------------------------------------------------------------------------


def _copy(source: Mapping[str, Any]) -> dict[str, Any]:
    for _ in range(_COPY_ATTEMPTS - 1):
        try:
            return dict(source)
        except RuntimeError:  # resized by the event loop thread mid-copy
            continue
    return dict(source)


def _snapshot(metrics: Metrics) -> dict[str, Any]:
    for _ in range(_COPY_ATTEMPTS - 1):
        try:
            return metrics.snapshot()
        except RuntimeError:
            continue
    return metrics.snapshot()


def _grouped(values: Mapping[str, float]) -> dict[str, list[tuple[dict[str, str], float]]]:
    groups: dict[str, list[tuple[dict[str, str], float]]] = {}
    for key, value in sorted(values.items()):
        name, labels = split_labels(key)
        groups.setdefault(name, []).append((labels, float(value)))
    return groups


def _label_names(samples: Iterable[tuple[dict[str, str], float]]) -> list[str]:
    names: set[str] = set()
    for labels, _ in samples:
        names.update(labels)
    return sorted(names)


class RuntimeMetricsCollector:
    """A ``prometheus_client`` collector over a ``Metrics`` registry, read at every scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        counters = _copy(self.metrics.counters)
        gauges = _copy(self.metrics.gauges)
        for name, samples in _grouped(counters).items():
            label_names = _label_names(samples)
            family = CounterMetricFamily(prometheus_name(name), f"{name} (counter)", labels=label_names)
            for labels, value in samples:
                family.add_metric([labels.get(n, "") for n in label_names], value)
            yield family
        for name, samples in _grouped(gauges).items():
            label_names = _label_names(samples)
            gauge = GaugeMetricFamily(prometheus_name(name), f"{name} (gauge)", labels=label_names)
            for labels, value in samples:
                gauge.add_metric([labels.get(n, "") for n in label_names], value)
            yield gauge
        yield from self._timings()

    def _timings(self) -> Iterator[Metric]:
        if isinstance(self.metrics, ExportedMetrics):
            grouped: dict[str, list[tuple[dict[str, str], list[tuple[str, float]], float]]] = {}
            for key, (buckets, total) in sorted(self.metrics.histograms().items()):
                name, labels = split_labels(key)
                grouped.setdefault(name, []).append((labels, buckets, total))
            for name, entries in grouped.items():
                label_names = sorted({n for labels, _, _ in entries for n in labels})
                histogram = HistogramMetricFamily(
                    timing_base_name(name), f"{name} (timing, seconds)", labels=label_names
                )
                for labels, buckets, total in entries:
                    histogram.add_metric([labels.get(n, "") for n in label_names], buckets, total)
                yield histogram
            return
        yield from self._recent_timings()

    def _recent_timings(self) -> Iterator[Metric]:
        recent: dict[str, list[tuple[dict[str, str], dict[str, float]]]] = {}
        for key, summary in sorted(_snapshot(self.metrics)["timings"].items()):
            name, labels = split_labels(key)
            recent.setdefault(name, []).append((labels, summary))
        for name, entries in recent.items():
            label_names = sorted({n for labels, _ in entries for n in labels})
            gauge = GaugeMetricFamily(
                timing_base_name(name).removesuffix("_seconds") + "_recent_seconds",
                f"{name} over the most recent samples (seconds)",
                labels=[*label_names, "quantile"],
            )
            for labels, summary in entries:
                values = [labels.get(n, "") for n in label_names]
                for quantile, stat in (("0.5", "p50"), ("0.99", "p99"), ("1", "max")):
                    gauge.add_metric([*values, quantile], summary[stat] / 1000)
            yield gauge


def build_registry(metrics: Metrics, *, process_metrics: bool = True) -> CollectorRegistry:
    """A fresh registry (not the global one, so tests and several workers never collide)."""
    registry = CollectorRegistry()
    registry.register(RuntimeMetricsCollector(metrics))
    if process_metrics:
        # process_resident_memory_bytes, process_cpu_seconds_total, python_gc_*, python_info.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry
