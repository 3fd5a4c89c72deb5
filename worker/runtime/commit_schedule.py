"""When the worker commits: the interval, its early start, and the forced commit.

Pure arithmetic on the clock readings the caller passes in (monotonic ``now``, wall-clock
``wall_s``), so the schedule is tested without a worker and the loop owns the clock.
"""

from __future__ import annotations

MAX_POLL_TIMEOUT_MS = 100
# Weight of the newest periodic commit in the running estimate of how long one takes.
COMMIT_ESTIMATE_WEIGHT = 0.2


def commit_delay_s(interval_s: float, age_s: float, commit_estimate_s: float) -> float:
    """How long from now the next commit starts, for work whose oldest input is ``age_s`` old.

    Its outputs become visible when the commit ends, so it starts one interval after that input
    was created less what commits recently took (at most half the interval): the interval bounds
    produce-to-visible, not produce-to-commit-start. Never later than one interval from now, so a
    producer's skewed clock cannot delay a commit.
    """
    lead = min(max(0.0, commit_estimate_s), interval_s / 2)
    return max(0.0, interval_s - lead - max(0.0, age_s))


class CommitSchedule:
    """The next commit's due time for the work handled since the last one.

    ``due_at`` is set by the first record (or expiry) after a commit and cleared when a periodic
    commit starts; ``estimate_s`` is the running mean of what periodic commits took.
    """

    def __init__(self, interval_ms: int, max_uncommitted_records: int) -> None:
        self.interval_s = interval_ms / 1000
        self.max_uncommitted_records = max_uncommitted_records
        self.due_at: float | None = None
        self.open_since: float | None = None  # when the first record since the last commit was handled
        self.estimate_s = 0.0

    def record_handled(self, timestamp_ms: int, now: float, wall_s: float) -> None:
        """A record created at ``timestamp_ms`` was handled: the first since a commit sets the due time.

        Counting the interval from the input's create time rather than from when it was processed
        keeps the time a commit spent blocking the loop out of the latency budget.
        """
        if self.due_at is None:
            age = wall_s - timestamp_ms / 1000
            self.due_at = now + commit_delay_s(self.interval_s, age, self.estimate_s)
            self.open_since = now

    def work_without_record(self, now: float) -> None:
        """Work with no input record (an expiry's outputs) commits an interval from now."""
        if self.due_at is None:
            self.due_at = now + self.interval_s
            self.open_since = now

    def due_within_batch(self, now: float) -> bool:
        """Whether to commit before the rest of a batch: once the commit is due and the transaction
        has been open for an interval (so a backlog of old records still commits an interval's work
        at a time, not record by record)."""
        if self.due_at is None or self.open_since is None:
            return False
        return now >= max(self.due_at, self.open_since + self.interval_s)

    def poll_timeout_ms(self, now: float) -> int:
        if self.due_at is None:
            return MAX_POLL_TIMEOUT_MS
        return max(0, min(MAX_POLL_TIMEOUT_MS, int((self.due_at - now) * 1000)))

    def due(self, now: float) -> bool:
        return self.due_at is not None and now >= self.due_at

    def forced(self, uncommitted_records: int) -> bool:
        """Backpressure: this many processed but uncommitted inputs commit whatever the clock says."""
        return uncommitted_records >= self.max_uncommitted_records

    def periodic_commit_started(self) -> None:
        self.due_at = self.open_since = None

    def periodic_commit_took(self, taken_s: float) -> None:
        """What the next commit's early start is based on."""
        self.estimate_s += COMMIT_ESTIMATE_WEIGHT * (taken_s - self.estimate_s)
