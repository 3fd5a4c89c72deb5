"""A circuit breaker per input partition over dead-lettered records (cf. getsentry/arroyo's DLQ policy).

Why: a bad deployment (wrong model directory, a schema change on the producer side) turns
every record into a dead letter. Without a limit the worker would drain the whole input into
the dead-letter topic and commit past it. With this policy the partition stops instead: the
worker pauses it, turns not-ready (``/readyz`` says which partition and why) and the records
stay in the input topic for the fixed deployment.

Each partition's breaker watches its processed records and trips when either limit is passed:

* **ratio**: more than ``max_ratio`` of the last ``window`` records were dead-lettered, once at
  least ``min_records`` records are in the window (so two bad records out of three at start-up
  do not trip it);
* **consecutive**: ``max_consecutive`` dead letters in a row (a valid record resets the run).

State machine (``TRANSITIONS``)::

    CLOSED --(a limit passed)--> TRIPPED

``TRIPPED`` is final for the breaker. Nothing in-process closes it again: the partition resumes
only when the worker restarts, because whatever made the records invalid needs a human or a new
deployment, not a timer. Breakers survive a revocation within the process: a rebalance (any
member joining or leaving) must not reopen a tripped partition nor wipe the count of a poison
record that keeps resetting it (``poison``); another worker that takes the partition over starts
with its own breaker.

Besides dead letters, a partition reset is observed as a dead-lettered record (its reason says
why; not one a Kafka client error caused), so a record that crashes its partition counts towards
the limits too. The records a reset makes the partition handle again are not observed again.

Pure: no I/O, no clock, no Kafka. The worker feeds it one observation per processed record.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Any

from worker.defaults import DEFAULT_MAX_CONSECUTIVE, DEFAULT_MAX_RATIO, DEFAULT_MIN_RECORDS, DEFAULT_WINDOW
from worker.errors import ConfigurationError, IllegalBreakerTransitionError


class BreakerState(enum.Enum):
    CLOSED = "closed"  # records flow; dead letters are counted
    TRIPPED = "tripped"  # the partition must be paused until restart / re-assignment


TRANSITIONS: dict[BreakerState, frozenset[BreakerState]] = {
    BreakerState.CLOSED: frozenset({BreakerState.TRIPPED}),
    BreakerState.TRIPPED: frozenset(),
}


class TripCause(enum.Enum):
    RATIO = "ratio"
    CONSECUTIVE = "consecutive"


@dataclass(frozen=True, slots=True)
class DeadLetterLimits:
    """When a partition's breaker trips; ``None`` disables a limit (both ``None``: never trips)."""

    max_ratio: float | None = DEFAULT_MAX_RATIO
    window: int = DEFAULT_WINDOW
    min_records: int = DEFAULT_MIN_RECORDS
    max_consecutive: int | None = DEFAULT_MAX_CONSECUTIVE

    def __post_init__(self) -> None:
        if self.max_ratio is not None and not 0.0 <= self.max_ratio < 1.0:
            # 1.0 could never be exceeded: say "off" instead of silently never tripping.
            raise ConfigurationError(f"--dlq-max-ratio must be in [0, 1) (or 'off'), got {self.max_ratio}")
        if self.window <= 0:
            raise ConfigurationError(f"--dlq-window must be positive, got {self.window}")
        if not 0 < self.min_records <= self.window:
            raise ConfigurationError(
                f"--dlq-min-records must be in [1, --dlq-window={self.window}], got {self.min_records}"
            )
        if self.max_consecutive is not None and self.max_consecutive <= 0:
            raise ConfigurationError(
                f"--dlq-max-consecutive must be positive (or 'off'), got {self.max_consecutive}"
            )


@dataclass(frozen=True, slots=True)
class Trip:
    """Why a partition's breaker tripped: what ``/readyz`` and the log say."""

    partition: int
    cause: TripCause
    invalid_in_window: int
    window_size: int
    consecutive: int
    last_reason: str
    offset: int | None

    def describe(self) -> str:
        if self.cause is TripCause.RATIO:
            what = f"{self.invalid_in_window} of the last {self.window_size} records were dead-lettered"
        else:
            what = f"{self.consecutive} consecutive records were dead-lettered"
        at = f" (at offset {self.offset})" if self.offset is not None else ""
        return f"partition {self.partition} paused: {what}{at}; last reason: {self.last_reason}"

    def as_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "cause": self.cause.value,
            "invalid_in_window": self.invalid_in_window,
            "window_size": self.window_size,
            "consecutive": self.consecutive,
            "offset": self.offset,
            "last_reason": self.last_reason,
            "message": self.describe(),
        }


class PartitionBreaker:
    """The breaker of one partition."""

    def __init__(self, partition: int, limits: DeadLetterLimits) -> None:
        self.partition = partition
        self.limits = limits
        self.state = BreakerState.CLOSED
        self.trip: Trip | None = None
        # True = dead-lettered. A bounded deque keeps the window O(1) per record.
        self._window: deque[bool] = deque(maxlen=limits.window)
        self._invalid_in_window = 0
        self.consecutive = 0
        self.last_reason: str | None = None

    @property
    def invalid_in_window(self) -> int:
        return self._invalid_in_window

    @property
    def window_size(self) -> int:
        return len(self._window)

    def _to(self, target: BreakerState) -> None:
        if target not in TRANSITIONS[self.state]:
            raise IllegalBreakerTransitionError(
                f"breaker of partition {self.partition} cannot go from {self.state.value} to {target.value}"
            )
        self.state = target

    def observe(self, dead_letter_reason: str | None, offset: int | None = None) -> Trip | None:
        """Count one processed record (``None``: it was valid). Returns the ``Trip`` when this one trips.

        After tripping, further observations change nothing and return ``None``: the worker
        should have stopped feeding records, and the first trip's numbers are the ones to report.
        """
        if self.state is BreakerState.TRIPPED:
            return None
        invalid = dead_letter_reason is not None
        if len(self._window) == self._window.maxlen and self._window[0]:
            self._invalid_in_window -= 1  # the oldest observation falls out of the window
        self._window.append(invalid)
        if not invalid:
            self.consecutive = 0
            return None
        assert dead_letter_reason is not None
        self._invalid_in_window += 1
        self.consecutive += 1
        self.last_reason = dead_letter_reason
        cause = self._cause()
        if cause is None:
            return None
        self._to(BreakerState.TRIPPED)
        self.trip = Trip(
            partition=self.partition,
            cause=cause,
            invalid_in_window=self._invalid_in_window,
            window_size=len(self._window),
            consecutive=self.consecutive,
            last_reason=dead_letter_reason,
            offset=offset,
        )
        return self.trip

    def _cause(self) -> TripCause | None:
        limits = self.limits
        if limits.max_consecutive is not None and self.consecutive >= limits.max_consecutive:
            return TripCause.CONSECUTIVE
        size = len(self._window)
        if (
            limits.max_ratio is not None
            and size >= limits.min_records
            and self._invalid_in_window > limits.max_ratio * size
        ):
            return TripCause.RATIO
        return None


class DeadLetterPolicy:
    """One ``PartitionBreaker`` per input partition, created on first use."""

    def __init__(self, limits: DeadLetterLimits | None = None) -> None:
        self.limits = limits or DeadLetterLimits()
        self._breakers: dict[int, PartitionBreaker] = {}

    def breaker(self, partition: int) -> PartitionBreaker:
        breaker = self._breakers.get(partition)
        if breaker is None:
            breaker = self._breakers[partition] = PartitionBreaker(partition, self.limits)
        return breaker

    def observe(
        self, partition: int, dead_letter_reason: str | None, offset: int | None = None
    ) -> Trip | None:
        """One processed record of ``partition``; the ``Trip`` if this record tripped its breaker."""
        return self.breaker(partition).observe(dead_letter_reason, offset)

    def is_tripped(self, partition: int) -> bool:
        breaker = self._breakers.get(partition)
        return breaker is not None and breaker.state is BreakerState.TRIPPED

    def tripped(self) -> dict[int, Trip]:
        return {p: b.trip for p, b in sorted(self._breakers.items()) if b.trip is not None}

    def forget(self, partition: int) -> None:
        """Start the partition over with a fresh, closed breaker (library use; the worker keeps them)."""
        self._breakers.pop(partition, None)
