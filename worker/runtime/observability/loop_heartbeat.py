"""An event loop's heartbeat, for a liveness probe that notices a blocked loop.

A process whose HTTP probe is served from another thread (``health_server``) answers it even while
its event loop is stuck; the heartbeat is what tells the two apart. A task on the loop stamps the
time every ``interval_s``; ``check()``, called from the probe's thread, fails once the last stamp is
older than ``stall_after_s``. Each beat also records how late it woke (the loop's lag) as a timing,
and runs ``on_beat`` (on the loop, so it may read the loop's state without locks).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.health_server import ReadinessReport
from worker.runtime.observability.metrics import Metrics

DEFAULT_INTERVAL_S = 1.0
# A loop that has not run for this long is stuck: no request handler may hold it that long.
DEFAULT_STALL_AFTER_S = 10.0


class LoopHeartbeat:
    def __init__(
        self,
        metrics: Metrics,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        stall_after_s: float = DEFAULT_STALL_AFTER_S,
        on_beat: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < interval_s < stall_after_s:
            raise ValueError("the heartbeat interval must be positive and below the stall limit")
        self.metrics = metrics
        self.interval_s = interval_s
        self.stall_after_s = stall_after_s
        self.on_beat = on_beat
        self._clock = clock
        self.last_beat: float | None = None  # a float is written and read whole under the GIL
        self.beats = 0

    def beat(self) -> None:
        """One heartbeat: now, on the loop."""
        self.last_beat = self._clock()
        self.beats += 1
        if self.on_beat is not None:
            self.on_beat()

    async def run(self) -> None:
        """Beat every ``interval_s`` until cancelled."""
        self.beat()
        while True:
            before = self._clock()
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, self._clock() - before - self.interval_s)
            self.metrics.timing(m.LOOP_LAG_MS, lag * 1000)
            self.beat()

    def check(self) -> ReadinessReport:
        """Liveness, from any thread: the loop beat within ``stall_after_s``."""
        last = self.last_beat
        if last is None:
            return ReadinessReport(True, [], {"status": "starting"})
        age = self._clock() - last
        detail = {"status": "alive", "last_beat_s_ago": round(age, 3)}
        if age > self.stall_after_s:
            reason = f"the event loop has not run for {age:.1f} s (limit {self.stall_after_s:g} s)"
            return ReadinessReport(False, [reason], {**detail, "status": "stalled"})
        return ReadinessReport(True, [], detail)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[LoopHeartbeat]:
        """Beats while the block runs."""
        task = asyncio.create_task(self.run(), name="loop-heartbeat")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
