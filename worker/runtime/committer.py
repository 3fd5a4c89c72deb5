"""A commit of the owned partitions' work: per partition, or in the worker's one transaction.

The committer commits and books the outcome (positions, checkpoints, the reset tracker); it
resets nothing itself. It returns the partitions whose work was lost, and the worker, which owns
the partitions, reopens them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from worker.runtime.dead_letters.poison import ResetTracker
from worker.runtime.delivery import Transaction
from worker.runtime.kafka_client.base import TopicPartition
from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.metrics import Metrics
from worker.runtime.partition import OwnedPartition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LostWork:
    """A partition whose uncommitted work a failed commit lost: reopen it from committed state."""

    tp: TopicPartition
    error: BaseException


@dataclass(frozen=True)
class CommitOutcome:
    committed_any: bool  # whether any partition had work to commit
    lost: list[LostWork]


class Committer:
    """Commits the owned partitions' work.

    ``shared``: with ``--transactional-id-mode per-worker``, the one transaction every partition
    writes into (``None``: each partition commits through its own sink).
    """

    def __init__(self, metrics: Metrics, resets: ResetTracker, shared: Transaction | None = None) -> None:
        self.metrics = metrics
        self.resets = resets
        self.shared = shared

    async def commit(
        self, owned: Mapping[TopicPartition, OwnedPartition], only: set[TopicPartition] | None = None
    ) -> CommitOutcome:
        """Commit every partition of ``owned`` with work (or those of them in ``only``)."""
        tasks = [t for t in owned.values() if t.needs_commit and (only is None or t.tp in only)]
        if not tasks:
            return CommitOutcome(committed_any=False, lost=[])
        if self.shared is not None:
            return CommitOutcome(committed_any=True, lost=await self.commit_shared(tasks, owned))
        results = await asyncio.gather(*(t.commit() for t in tasks), return_exceptions=True)
        lost = []
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("commit of %s failed, resetting it: %r", task.tp, result)
                self.metrics.increment(m.COMMITS_FAILED)
                # Which record is to blame is unknown: the reopened partition isolates the range.
                self.resets.commit_failed(task.tp.partition, task.committed_position, task.position)
                lost.append(LostWork(task.tp, result))
            else:
                self.resets.committed(task.tp.partition, task.position)
        return CommitOutcome(committed_any=True, lost=lost)

    async def commit_shared(
        self,
        tasks: list[OwnedPartition],
        owned: Mapping[TopicPartition, OwnedPartition],
        *,
        raise_errors: bool = False,
    ) -> list[LostWork]:
        """Per-worker transactions: ``tasks`` and every other partition of ``owned`` with work commit
        in one transaction, since it holds their outputs too.

        On failure all of them lost their work (with ``raise_errors`` the error is raised instead, for
        the caller to reset with blame).
        """
        assert self.shared is not None
        joined = {t.tp: t for t in tasks} | {tp: t for tp, t in owned.items() if t.needs_commit}
        started = time.perf_counter()
        states = {tp: task.state_records() for tp, task in joined.items()}
        try:
            await self.shared.commit(
                [r for state in states.values() for r in state],
                {tp: task.position for tp, task in joined.items()},
            )
        except Exception as exc:
            if raise_errors:
                raise
            log.warning("commit of %s failed, resetting them: %r", sorted(tp.partition for tp in joined), exc)
            self.metrics.increment(m.COMMITS_FAILED)
            for tp, task in joined.items():
                self.resets.commit_failed(tp.partition, task.committed_position, task.position)
            return [LostWork(tp, exc) for tp in joined]
        for tp, task in joined.items():
            task.committed(states[tp], started)
            self.resets.committed(tp.partition, task.position)
        return []
