"""Bounding partition resets: a record that keeps resetting its partition is dead-lettered and skipped.

Any error that escapes a record's processing or its partition's commit resets the partition: its
transaction is aborted and it reopens from committed state. If the cause is the record itself (a
poison pill), the reopened partition meets it again, forever. This module counts resets per input
partition and offset, in a row, and tells the partition to skip the record after
``--max-record-retries`` of them (Kafka Streams' "log and continue" after a bounded retry):

* **A failure while handling record ``o``** (processing, serialization, sending): the culprit is
  known, the reset counts against ``o``.
* **A failed commit** covers every record since the previous commit, so its culprit is unknown.
  The reset counts against no record; instead the reopened partition *isolates* the failed range:
  it commits after every record up to where the failed commit would have ended. A commit failing
  there holds one record, whose offset is then known and counted as above. Isolation costs one
  commit per record of that range (bounded by ``--max-uncommitted-records``), once per failure.
* **A topic refusing a record as too large** (its ``max.message.bytes`` lowered below the core's
  output limit after start-up; the worker refuses to start with it) fails the commit. The isolated
  commit that fails the same way names the record, which is then skipped at once: retrying
  produces the same bytes.

Counts are per record (several poison records may wait in one uncommitted range) and are
forgotten once the partition commits past them; a skipped record is committed at once.
The count lives in the worker (not in the owned partition, which a reset drops) and survives a
revocation: if the partition comes back, its committed offset decides whether the count still
applies. The skip itself is an ordinary dead letter whose reason names the resets and the last
error; should even that fail to send (the original is too large for the dead-letter topic), the
next attempt sends it again with the original cut to a size any topic takes (``truncated``; its
key, size and SHA-256 still describe the whole record).

The dead-letter breaker sees each record once: a range replayed after a reset was observed the
first time (and the reset too), so only a poison skip in it is observed again (``replayed``).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.defaults import DEFAULT_MAX_RECORD_RETRIES
from worker.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class Skip:
    """How to skip a poison record: a dead letter with this reason; ``cut``: its original cut short."""

    reason: str
    cut: bool


@dataclass(slots=True)
class _Count:
    offset: int
    resets: int
    last_error: str
    too_large: bool = False  # a topic refused what it produced: skip it at once, cut


class ResetTracker:
    def __init__(self, max_retries: int = DEFAULT_MAX_RECORD_RETRIES) -> None:
        if max_retries <= 0:
            raise ConfigurationError(f"--max-record-retries must be positive, got {max_retries}")
        self.max_retries = max_retries
        self._counts: dict[int, dict[int, _Count]] = {}  # partition -> offset -> count
        self._isolate_until: dict[int, int] = {}
        self._handled: dict[int, int] = {}  # partition -> highest offset handled in this process

    def record_failed(self, partition: int, offset: int, error: str, *, too_large: bool = False) -> int:
        """A reset caused by the record at ``offset``; how many in a row it has caused now.

        ``too_large``: a topic refused a record it produced as too large. Retrying gives the same
        bytes, so it is skipped at once, its original cut to a size any topic takes.
        """
        counts = self._counts.setdefault(partition, {})
        count = counts.get(offset)
        if count is None:
            count = counts[offset] = _Count(offset, 0, error)
        count.resets += 1
        count.last_error = error[:500]
        count.too_large = count.too_large or too_large
        return count.resets

    def commit_failed(self, partition: int, committed: int, attempted: int) -> None:
        """A commit of ``[committed, attempted)`` failed: commit record by record over that range."""
        if attempted > committed:
            self._isolate_until[partition] = max(attempted, self._isolate_until.get(partition, 0))

    def isolating(self, partition: int, position: int) -> bool:
        """Whether the record at ``position`` must be committed on its own."""
        until = self._isolate_until.get(partition)
        if until is None:
            return False
        if position >= until:
            del self._isolate_until[partition]
            return False
        return True

    def committed(self, partition: int, position: int) -> None:
        """``position`` is committed: a count for an earlier offset no longer applies."""
        counts = self._counts.get(partition)
        if counts:
            for offset in [o for o in counts if o < position]:
                del counts[offset]

    def replayed(self, partition: int, offset: int) -> bool:
        """Whether the record at ``offset`` was handled before (a range replayed after a reset).

        The breaker counts a record once: its first handling was observed, and so was the reset.
        """
        if offset <= self._handled.get(partition, -1):
            return True
        self._handled[partition] = offset
        return False

    def skip(self, partition: int, offset: int) -> Skip | None:
        """How to skip the record at ``offset`` if it has used up its retries, else ``None``."""
        count = self._counts.get(partition, {}).get(offset)
        if count is not None and count.too_large:
            return Skip(f"what this record produced is too large for its topic: {count.last_error}", True)
        if count is None or count.resets < self.max_retries:
            return None
        reason = (
            f"poison record: it reset its partition {count.resets} times in a row "
            f"(--max-record-retries {self.max_retries}); last error: {count.last_error}"
        )
        # Past that, even the dead letter with the whole original failed: cut it.
        return Skip(reason, cut=count.resets > self.max_retries)

    def is_poison(self, partition: int, offset: int) -> bool:
        """Whether the record at ``offset`` is to be skipped (and then committed on its own)."""
        count = self._counts.get(partition, {}).get(offset)
        return count is not None and (count.too_large or count.resets >= self.max_retries)

    def resets(self, partition: int, offset: int) -> int:
        count = self._counts.get(partition, {}).get(offset)
        return count.resets if count is not None else 0
