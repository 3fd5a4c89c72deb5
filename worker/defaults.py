"""The defaults of the runtime's settings that the runtime's own code falls back to as well: the
dead-letter breaker, poison records, the metrics server. A leaf module, so ``worker.settings`` declares
its flags with them without importing the runtime."""

from __future__ import annotations

# The dead-letter breaker (``worker.runtime.dead_letters.policy``).
DEFAULT_MAX_RATIO = 0.5
DEFAULT_WINDOW = 100
DEFAULT_MIN_RECORDS = 20
DEFAULT_MAX_CONSECUTIVE = 20
# Resets of a partition by one record before it is dead-lettered (``worker.runtime.dead_letters.poison``).
DEFAULT_MAX_RECORD_RETRIES = 3
# /metrics, /healthz, /readyz (``worker.runtime.observability.health_server``).
DEFAULT_METRICS_PORT = 9464
DEFAULT_METRICS_HOST = "0.0.0.0"
