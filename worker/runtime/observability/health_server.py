"""The worker's HTTP endpoints: Prometheus ``/metrics``, liveness ``/healthz``, readiness ``/readyz``.

One small WSGI server (``wsgiref``) on its own daemon thread, so a scrape or a probe is answered
even while the event loop is busy with a long batch, and never blocks the loop. The port is
``--metrics-port`` (``DERENDER_METRICS_PORT``, default 9464, the one in ``deploy/``), bound on
``--metrics-host`` (default ``0.0.0.0``, so also ``127.0.0.1`` for the container health check).

* ``/healthz``: 200 while the process serves HTTP at all (liveness: restart only a dead process),
  or, given a ``liveness`` check (ingest's event-loop heartbeat), 503 while that check fails.
* ``/readyz``: 200 when the worker is running, every partition it was assigned has its state
  restored, and no partition's dead-letter breaker has tripped; otherwise 503. Both answers
  carry a JSON body with the reasons. Owning no partition is ready: an idle extra replica
  during a rolling update must not hold the rollout back.
* ``/metrics``: ``prometheus_client``'s exposition of the registry (see ``prometheus_export``).

``ReadinessState`` is written from the event loop and read from the HTTP thread; one lock
guards it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

from worker.defaults import DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT
from worker.errors import ConfigurationError
from worker.runtime.dead_letters.policy import Trip

log = logging.getLogger(__name__)

# Lifecycle states (``WorkerState.value``) in which the worker may be ready.
READY_PHASES = frozenset({"running", "rebalancing"})
_POLL_INTERVAL_S = 0.1  # how fast stop() is noticed by serve_forever

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


# --- readiness --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadinessReport:
    ready: bool
    reasons: list[str]
    detail: dict[str, Any] = field(default_factory=dict)

    def body(self) -> bytes:
        return orjson.dumps({"ready": self.ready, "reasons": self.reasons, **self.detail})


class ReadinessState:
    """What ``/readyz`` decides on. The worker reports its phase, partitions and tripped breakers.

    ``phase`` may be a callable (``lambda: worker.lifecycle.state.value``) read at probe time, so
    the lifecycle needs no extra reporting; otherwise call ``set_phase``.
    """

    def __init__(self, phase: Callable[[], str] | None = None) -> None:
        self._lock = threading.Lock()
        self._phase_source = phase
        self._phase = "created"
        self._restoring: set[int] = set()
        self._restored: set[int] = set()
        self._tripped: dict[int, Trip] = {}
        self._layout_error: str | None = None

    def bind_phase(self, phase: Callable[[], str]) -> None:
        """Read the phase from ``phase()`` at probe time from now on (e.g. the worker's lifecycle)."""
        with self._lock:
            self._phase_source = phase

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self._phase = phase

    def partitions_assigned(self, partitions: Iterable[int]) -> None:
        """Assigned (or being re-opened after a reset): not ready until ``partitions_restored``."""
        with self._lock:
            for p in partitions:
                self._restored.discard(p)
                self._restoring.add(p)

    def partitions_restored(self, partitions: Iterable[int]) -> None:
        with self._lock:
            for p in partitions:
                self._restoring.discard(p)
                self._restored.add(p)

    def partitions_revoked(self, partitions: Iterable[int]) -> None:
        """No longer ours: forgets their restore state and tripped breakers."""
        with self._lock:
            for p in partitions:
                self._restoring.discard(p)
                self._restored.discard(p)
                self._tripped.pop(p, None)

    def layout_error(self, message: str | None) -> None:
        """Assigned input partitions that have no state partition (``None``: none any more)."""
        with self._lock:
            self._layout_error = message

    def breaker_tripped(self, trip: Trip) -> None:
        with self._lock:
            self._tripped[trip.partition] = trip

    def check(self) -> ReadinessReport:
        with self._lock:
            source = self._phase_source
        # Called outside the lock: the source is the caller's code.
        phase = source() if source is not None else None
        with self._lock:
            phase = phase if phase is not None else self._phase
            restoring = sorted(self._restoring)
            restored = sorted(self._restored)
            tripped = dict(sorted(self._tripped.items()))
            layout = self._layout_error
        reasons = [layout] if layout else []
        if phase not in READY_PHASES:
            reasons.append(f"worker is {phase}")
        if restoring:
            reasons.append(f"state of partitions {restoring} is not restored yet")
        reasons.extend(trip.describe() for trip in tripped.values())
        detail = {
            "phase": phase,
            "partitions": {"restored": restored, "restoring": restoring},
            "tripped": {str(p): trip.as_json() for p, trip in tripped.items()},
            "layout_error": layout,
        }
        return ReadinessReport(not reasons, reasons, detail)


# --- the HTTP server --------------------------------------------------------------------------


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a hung scrape must not keep the process alive at exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        # Probes hit every few seconds; wsgiref would print each one to stderr.
        log.debug("http %s", format % args)


def _json(start_response: StartResponse, status: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


LivenessCheck = Callable[[], ReadinessReport]


def health_app(
    registry: CollectorRegistry, readiness: ReadinessState, liveness: LivenessCheck | None = None
) -> WsgiApp:
    """The WSGI app: ``/metrics``, ``/healthz``, ``/readyz``; 404 elsewhere."""
    metrics_app: WsgiApp = make_wsgi_app(registry)

    def answer(start_response: StartResponse, check: Callable[[], ReadinessReport], what: str) -> list[bytes]:
        try:
            report = check()
        except Exception as exc:  # a probe must answer, not hang up
            log.exception("%s check failed", what)
            report = ReadinessReport(False, [f"{what} check failed: {exc!r}"])
        status = "200 OK" if report.ready else "503 Service Unavailable"
        return _json(start_response, status, report.body())

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/healthz":
            if liveness is None:
                return _json(start_response, "200 OK", b'{"status":"alive"}')
            return answer(start_response, liveness, "liveness")
        if path == "/readyz":
            return answer(start_response, readiness.check, "readiness")
        return _json(
            start_response,
            "404 Not Found",
            b'{"error":"not found","paths":["/metrics","/healthz","/readyz"]}',
        )

    return app


class HealthServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on a background thread; ``start()`` / ``stop()``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: ReadinessState,
        *,
        port: int = DEFAULT_METRICS_PORT,
        host: str = DEFAULT_METRICS_HOST,
        liveness: LivenessCheck | None = None,
    ) -> None:
        self.host = host
        self.requested_port = port
        self._app = health_app(registry, readiness, liveness)
        self._server: _ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when started with port 0)."""
        if self._server is None:
            raise RuntimeError("the health server is not started")
        return int(self._server.server_address[1])

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the health server is already started")
        try:
            server = make_server(
                self.host,
                self.requested_port,
                self._app,
                server_class=_ThreadingWSGIServer,
                handler_class=_QuietHandler,
            )
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {self.host}:{self.requested_port}: {exc}"
            ) from exc
        assert isinstance(server, _ThreadingWSGIServer)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL_S},
            name="derender-health-http",
            daemon=True,
        )
        self._thread.start()
        log.info("serving /metrics, /healthz, /readyz on %s:%d", self.host, self.port)

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice. Blocks for at most ~0.1 s."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
