"""The consumer-group listener: hands revocations and assignments to the worker.

aiokafka awaits these coroutines before it rejoins (revoke) and before it fetches for the
new assignment (assign), and every member's revoke runs before any member's assign. So a
revoked partition's open transaction is committed before its next owner starts, and the
next owner restores state and seeks before its first record. aiokafka only logs an
exception raised here, so the worker must not depend on these calls succeeding: it
re-opens assigned partitions without a task on its own (``Worker._heal``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiokafka import ConsumerRebalanceListener, TopicPartition

if TYPE_CHECKING:
    from worker.runtime.worker import Worker


class RebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._worker.partitions_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._worker.partitions_assigned(set(assigned))
