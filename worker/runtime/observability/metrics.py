"""The runtime's in-process metrics registry: counters, gauges and recent timing windows.

The event loop writes it; ``prometheus_export`` reads it at scrape time and is the only module that
knows the exposition format. Names come from ``metrics_names``.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

_TIMING_WINDOW = 4096  # recent samples kept per timing, enough for p50/p99


class Metrics:
    def __init__(self) -> None:
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.gauges: dict[str, float] = {}
        self.timings: defaultdict[str, deque[float]] = defaultdict(lambda: deque(maxlen=_TIMING_WINDOW))

    def increment(self, name: str, value: int = 1) -> None:
        self.counters[name] += value

    def gauge(self, name: str, value: float) -> None:
        self.gauges[name] = value

    def timing(self, name: str, value_ms: float) -> None:
        self.timings[name].append(value_ms)

    def snapshot(self) -> dict[str, Any]:
        timings = {}
        for name, samples in self.timings.items():
            ordered = sorted(samples)
            if ordered:
                timings[name] = {
                    "p50": ordered[len(ordered) // 2],
                    "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
                    "max": ordered[-1],
                }
        return {"counters": dict(self.counters), "gauges": dict(self.gauges), "timings": timings}
