"""Membership of a consumer group, only to share a topic's partitions out: nothing is fetched (every
assigned partition is paused as it is assigned) and nothing is committed.

Gateway replicas share the output topic's partitions this way (``worker.pipeline.gateway_routing``):
the group's assignment says which partitions a replica's own requests should have their replies
on; the replies themselves are read by a ``follower.PartitionFollower``. Partitions added to the
topic reach the group at a metadata refresh and are assigned like the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from worker.errors import KafkaClientError
from worker.runtime.kafka_client.base import (
    ConsumerConfig,
    GroupConsumer,
    KafkaClient,
    Partitions,
    RebalanceCallbacks,
)

log = logging.getLogger(__name__)

POLL_MS = 1000  # a member must poll to stay one; it fetches nothing, so this only paces the loop
RETRY_S = 2.0


class GroupMembership:
    """``owned``: the partitions of ``topic`` the group gives this member now (empty while it joins,
    between an eager rebalance's revocation and assignment, and after it left). ``on_change`` is
    called with the new set after every change."""

    def __init__(
        self,
        client: KafkaClient,
        config: ConsumerConfig,
        topic: str,
        on_change: Callable[[frozenset[int]], None] = lambda owned: None,
    ) -> None:
        self.topic = topic
        self.owned: frozenset[int] = frozenset()
        self._consumer: GroupConsumer = client.consumer(config)
        self._on_change = on_change
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.subscribe(
            [self.topic], RebalanceCallbacks(self._assigned, self._revoked, self._revoked)
        )
        self._task = asyncio.create_task(self._poll())

    async def stop(self) -> None:
        """Leave the group (the others are given this member's partitions) and close."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self._consumer.stop()
        finally:
            self._set(frozenset())

    async def _poll(self) -> None:
        while True:
            try:
                await self._consumer.poll(POLL_MS, 1)  # records: none, every partition is paused
            except KafkaClientError as exc:  # the group or the broker: membership comes back by itself
                log.warning("group membership on %s: %r; polling again in %gs", self.topic, exc, RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def _assigned(self, partitions: Partitions) -> None:
        for tp in partitions:
            self._consumer.pause(tp)
        self._set(self.owned | {tp.partition for tp in partitions if tp.topic == self.topic})

    async def _revoked(self, partitions: Partitions) -> None:
        self._set(self.owned - {tp.partition for tp in partitions})

    def _set(self, owned: frozenset[int]) -> None:
        if owned != self.owned:
            self.owned = owned
            log.info("owning partition(s) %s of %s", sorted(owned), self.topic)
            self._on_change(owned)
