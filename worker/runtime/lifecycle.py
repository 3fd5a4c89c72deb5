"""The worker's lifecycle as an explicit state machine (cf. aiokafka's TransactionState).

A transition not in ``TRANSITIONS`` is a bug and raises, so a rebalance callback that
fires during shutdown, or a second start, is noticed instead of silently half-working.
"""

from __future__ import annotations

import enum
import logging

from worker.errors import IllegalTransitionError

log = logging.getLogger(__name__)


class WorkerState(enum.Enum):
    CREATED = "created"
    STARTING = "starting"  # clients connecting, topics checked
    RUNNING = "running"  # polling, processing, committing
    REBALANCING = "rebalancing"  # partitions revoked, waiting for the new assignment
    STOPPING = "stopping"  # last commit, leaving the group
    STOPPED = "stopped"
    FAILED = "failed"


TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.CREATED: frozenset({WorkerState.STARTING, WorkerState.STOPPED}),
    WorkerState.STARTING: frozenset({WorkerState.RUNNING, WorkerState.STOPPING, WorkerState.FAILED}),
    WorkerState.RUNNING: frozenset({WorkerState.REBALANCING, WorkerState.STOPPING, WorkerState.FAILED}),
    WorkerState.REBALANCING: frozenset({WorkerState.RUNNING, WorkerState.STOPPING, WorkerState.FAILED}),
    WorkerState.STOPPING: frozenset({WorkerState.STOPPED, WorkerState.FAILED}),
    WorkerState.STOPPED: frozenset(),
    WorkerState.FAILED: frozenset({WorkerState.STOPPED}),
}


class Lifecycle:
    def __init__(self) -> None:
        self.state = WorkerState.CREATED

    def to(self, target: WorkerState) -> None:
        if target not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(f"worker cannot go from {self.state.value} to {target.value}")
        log.debug("worker %s -> %s", self.state.value, target.value)
        self.state = target

    @property
    def accepting_partitions(self) -> bool:
        """Whether a new assignment should be opened (not while shutting down)."""
        return self.state in (WorkerState.RUNNING, WorkerState.REBALANCING)
