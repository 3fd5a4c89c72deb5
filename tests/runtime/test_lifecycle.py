"""The worker's lifecycle: the transitions its table has, and refusing the others."""

from __future__ import annotations

import pytest

from worker.errors import IllegalTransitionError
from worker.runtime.lifecycle import Lifecycle, WorkerState


def test_lifecycle_transitions() -> None:
    life = Lifecycle()
    for state in (WorkerState.STARTING, WorkerState.RUNNING, WorkerState.REBALANCING, WorkerState.RUNNING):
        life.to(state)
    assert life.accepting_partitions
    life.to(WorkerState.STOPPING)
    assert not life.accepting_partitions
    with pytest.raises(IllegalTransitionError):
        life.to(WorkerState.RUNNING)
    life.to(WorkerState.STOPPED)
    with pytest.raises(IllegalTransitionError):
        life.to(WorkerState.STARTING)
