"""Which assigned input partitions the worker can serve, and when to look again.

An input topic grown without (or before) the state topic leaves its new partitions nowhere to keep
state. They are not opened, the worker is not ready and says why, and the layout is read again every
``LAYOUT_RECHECK_S``, so growing the state topic heals it. ``missing`` is what the worker's heal
opens: assigned partitions without a task, less those known to have no state partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Set
from typing import Any

from worker.runtime.kafka_client.base import TopicPartition
from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.health_server import ReadinessState
from worker.runtime.observability.metrics import Metrics
from worker.runtime.topics import TopicNames, layout_problem, partition_counts

log = logging.getLogger(__name__)

LAYOUT_RECHECK_S = 10.0


class LayoutWatch:
    """The assigned input partitions that have no state partition (``unplaced``), and the readiness
    message that names them."""

    def __init__(
        self,
        bootstrap_servers: str,
        topics: TopicNames,
        security: dict[str, Any],
        metrics: Metrics,
        readiness: ReadinessState,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topics = topics
        self.security = security
        self.metrics = metrics
        self.readiness = readiness
        self.unplaced: set[TopicPartition] = set()
        self._next_check_at = 0.0
        self._message: str | None = None

    async def placeable(
        self, tps: set[TopicPartition], assignment: Set[TopicPartition]
    ) -> set[TopicPartition]:
        """The partitions of ``tps`` that can be opened: those with a state partition."""
        try:
            counts = await partition_counts(
                self.bootstrap_servers, [self.topics.input, self.topics.state], self.security
            )
        except Exception as exc:  # noqa: BLE001 - the open itself will fail too and be retried
            log.warning("could not read the partition counts: %r", exc)
            return tps
        state_partitions = counts.get(self.topics.state, 0)
        problem = layout_problem(self.topics, counts.get(self.topics.input, 0), state_partitions)
        unplaced = {tp for tp in tps if tp.partition >= state_partitions} if problem else set()
        self.unplaced = ((self.unplaced - tps) | unplaced) & set(assignment)
        message = None
        if self.unplaced:
            self._next_check_at = time.monotonic() + LAYOUT_RECHECK_S
            message = f"input partitions {sorted(tp.partition for tp in self.unplaced)} not served: {problem}"
        if message != self._message:
            if message is not None:
                log.error(message)
                self.metrics.increment(m.LAYOUT_ERRORS)
            else:
                log.info("every assigned input partition has its state partition again")
            self._message = message
            self.readiness.layout_error(message)
        return tps - unplaced

    def missing(self, assignment: Set[TopicPartition], owned: Set[TopicPartition]) -> set[TopicPartition]:
        """Assigned partitions without a task; the unplaced ones only when their recheck is due."""
        missing = set(assignment) - set(owned)
        if time.monotonic() < self._next_check_at:
            missing -= self.unplaced
        return missing

    def lost(self, tps: Set[TopicPartition]) -> None:
        self.unplaced -= set(tps)

    def revoked(self, tps: Set[TopicPartition]) -> None:
        """Every revoked partition, also one that never opened; the message goes with the last one."""
        self.unplaced -= set(tps)
        if not self.unplaced and self._message is not None:
            self._message = None
            self.readiness.layout_error(None)
