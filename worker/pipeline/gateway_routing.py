"""Which output partitions a gateway replica reads, and the request ids that put its replies there.

Key steering (docs/decisions/0023-gateway-reply-routing.md): every writer of the output topic places
a record by the murmur2 hash of its key, the request id (or ``<id>-<prompt>`` for each prompt of a
streaming completion), over the topic's partitions (``kafka_client.placement``). Gateway replicas
share the output partitions out through a consumer group (``kafka_client.membership``: membership
only, no fetch, no commit), and each replica mints its request ids so that their keys hash to
partitions it owns. Nothing on the wire and nothing in the worker changes: the replies land where
the replica reads.

A replica reads (``kafka_client.follower``):

* the partitions it owns, each from its end when it was given (from its beginning when it is new to
  the topic);
* every partition an open request of its own has a key on, until the request ends (an id it could
  not choose: a batch line, a request given while it owns nothing, a prompt of a completion that
  was not steered; and a partition revoked in a rebalance while its requests run). Such a partition
  is followed from its end before the request is written, so no reply can come before the read
  position; it is kept for ``LINGER_S`` after its last request, so a run of them costs one lookup;
* after the output topic grew, every partition for ``SETTLE_S``: the writers learn the new count at
  their own metadata refreshes, so until then a key may land on either count's partition. The
  partitions not read yet are read from the start of the oldest open request (less
  ``CLOCK_SLACK_S``), the new ones from their beginning.

``--reply-routing all`` reads every partition always (the behaviour before this routing: each
replica reads the whole output topic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from worker.errors import KafkaClientError
from worker.pipeline.connection import Connection, require_topics
from worker.runtime.kafka_client import make_client
from worker.runtime.kafka_client.base import ClientKind, ConsumerConfig, KafkaClient, ReaderConfig
from worker.runtime.kafka_client.follower import BEGINNING, END, PartitionFollower, Start
from worker.runtime.kafka_client.membership import GroupMembership
from worker.runtime.kafka_client.placement import partition_of
from worker.settings import ReplyRoutingMode

log = logging.getLogger(__name__)

FETCH_MS = 100
SWEEP_S = 1.0
LINGER_S = 30.0  # a partition read for requests not steered stays read this long after the last ends
# Writers refresh their metadata at least every 5 minutes (aiokafka's and librdkafka's default), so
# this long after the gateway saw the output topic grow, every writer places keys by the new count.
SETTLE_S = 330.0
CLOCK_SLACK_S = 60.0  # how far a writer's clock may lag the gateway's (record times are theirs)
FOLLOW_TIMEOUT_S = 10.0  # a request waits this long for its partitions to be read (then 503)
# Minting hashes at most this many keys per request on the event loop (about 20 us each, so 5 ms at
# worst): a one-key id needs R tries with R replicas, all three keys of a two-prompt stream 8 with
# half the partitions owned. Past it the candidate with the most keys steered is taken. A request
# with more than ``MAX_ROUTED_KEYS`` keys has every partition read while it runs instead.
MAX_MINT_HASHES = 256
MAX_ROUTED_KEYS = 64
# The membership's session. Long, because it costs little: the partitions of a replica that died
# are unowned until it expires, so no live replica's requests are steered there; a short one made
# a loaded replica (or broker) drop out and churn the group, which moves partitions under everyone.
SESSION_TIMEOUT_MS = 30_000
HEARTBEAT_MS = 3_000
REBALANCE_TIMEOUT_MS = 30_000


@dataclass
class RoutingStats:
    """What this replica read of the output topic: ``read`` records, ``delivered`` of them to one of
    its open requests; the rest (``foreign``) were another replica's, or of a request already ended."""

    read: int = 0
    delivered: int = 0

    @property
    def foreign(self) -> int:
        return self.read - self.delivered


@dataclass(eq=False)
class Route:
    """One open request's claim on the partitions its replies come on."""

    partitions: frozenset[int]
    started_s: float = field(default_factory=time.time)


class ReplyRouting:
    def __init__(
        self,
        topic: str,
        connection: Connection,
        deliver: Callable[[str, bytes], bool],
        *,
        mode: ReplyRoutingMode = ReplyRoutingMode.OWNED,
        group_id: str = "derender-gateway",
        refresh_s: float = 30.0,
    ) -> None:
        self.topic = topic
        self.mode = mode
        self.stats = RoutingStats()
        self.count = 0  # the output topic's partitions, as last seen
        self._connection = connection
        self._deliver = deliver
        self._refresh_s = refresh_s
        client: KafkaClient = make_client(ClientKind.AIOKAFKA, connection.security)
        self._follower = PartitionFollower(
            client,
            ReaderConfig(
                connection.bootstrap_servers, f"{connection.client_id}-replies", connection.security
            ),
            topic,
        )
        self._membership: GroupMembership | None = None
        if mode is ReplyRoutingMode.OWNED:
            config = ConsumerConfig(
                bootstrap_servers=connection.bootstrap_servers,
                client_id=f"{connection.client_id}-membership",
                group_id=group_id,
                session_timeout_ms=SESSION_TIMEOUT_MS,
                rebalance_timeout_ms=REBALANCE_TIMEOUT_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
                max_poll_records=1,
                metadata_max_age_ms=max(1000, int(refresh_s * 1000)),
                security=connection.security,
            )
            self._membership = GroupMembership(client, config, topic, lambda owned: self._wake.set())
        self._refs: dict[int, int] = {}
        self._released: dict[int, float] = {}  # partition -> when its last request ended
        self._routes: set[Route] = set()
        self._settle_until = 0.0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- life --------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.count = await self._partition_count()
        await self._follower.start()
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._keep())]
        if self.mode is ReplyRoutingMode.ALL:  # read by the task just started
            async with asyncio.timeout(FOLLOW_TIMEOUT_S):
                await self._follower.follow(range(self.count))
        if self._membership is not None:
            await self._membership.start()

    @property
    def alive(self) -> bool:
        return bool(self._tasks) and not any(t.done() for t in self._tasks)

    def add_done_callback(self, callback: Callable[[asyncio.Task[None]], None]) -> None:
        for task in self._tasks:
            task.add_done_callback(callback)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            if self._membership is not None:
                await self._membership.stop()
        finally:
            await self._follower.stop()

    @property
    def owned(self) -> frozenset[int]:
        return self._membership.owned if self._membership is not None else frozenset()

    @property
    def followed(self) -> frozenset[int]:
        return self._follower.followed

    # --- requests ----------------------------------------------------------------------------------

    def mint(self, prefix: str = "", keys_of: Callable[[str], Collection[str]] = lambda rid: (rid,)) -> str:
        """A new request id (``prefix`` + 32 hex digits) whose reply keys (``keys_of(id)``) hash to
        partitions this replica owns and reads, as far as a few tries get; a random one when it
        owns none, or the keys are too many to steer."""
        usable = self._steerable()
        first = prefix + uuid.uuid4().hex
        if not usable:
            return first
        keys = len(keys_of(first))
        if keys > MAX_ROUTED_KEYS:  # every partition is read for it anyway
            return first
        best, best_score, candidate = first, -1, first
        for _ in range(MAX_MINT_HASHES // keys):
            score = sum(partition_of(k.encode(), self.count) in usable for k in keys_of(candidate))
            if score == keys:
                return candidate
            if score > best_score:
                best, best_score = candidate, score
            candidate = prefix + uuid.uuid4().hex
        return best

    def _steerable(self) -> frozenset[int]:
        if self._membership is None or self.count == 0:
            return frozenset()
        return frozenset(p for p in self._membership.owned & self._follower.followed if p < self.count)

    async def open(self, keys: Sequence[str]) -> Route:
        """Claim the partitions ``keys`` are placed on; returns once they are read, so the request may
        be written. ``KafkaClientError`` when they cannot be read in time."""
        if len(keys) > MAX_ROUTED_KEYS:
            partitions = frozenset(range(self.count))
        else:
            partitions = frozenset(partition_of(k.encode(), self.count) for k in keys)
        route = Route(partitions)
        self._routes.add(route)
        for p in partitions:
            self._refs[p] = self._refs.get(p, 0) + 1
        try:
            async with asyncio.timeout(FOLLOW_TIMEOUT_S):
                await self._follower.follow(partitions)
        except (TimeoutError, KafkaClientError, ConnectionError) as exc:
            self.close(route)
            raise KafkaClientError(
                f"the replies' partitions {sorted(partitions)} cannot be read: {exc!r}"
            ) from exc
        return route

    def close(self, route: Route) -> None:
        """The request ended: its partitions are no longer needed for it."""
        if route not in self._routes:
            return
        self._routes.discard(route)
        now = time.monotonic()
        for p in route.partitions:
            left = self._refs.get(p, 0) - 1
            if left > 0:
                self._refs[p] = left
            else:
                self._refs.pop(p, None)
                self._released[p] = now

    # --- reading -----------------------------------------------------------------------------------

    async def _read(self) -> None:
        follower, deliver, stats = self._follower, self._deliver, self.stats
        while True:
            try:
                records = await follower.fetch(FETCH_MS)
            except (KafkaClientError, ConnectionError) as exc:
                log.warning("reading %s: %r; again in 1s", self.topic, exc)
                await asyncio.sleep(1.0)
                continue
            for record in records:
                stats.read += 1
                if record.value is None:
                    continue
                key = record.key.decode(errors="replace") if record.key else ""
                if deliver(key, record.value):
                    stats.delivered += 1

    async def _keep(self) -> None:
        """Follow what is owned, drop what nobody needs, notice a grown topic."""
        next_refresh = time.monotonic() + self._refresh_s
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SWEEP_S):
                    await self._wake.wait()
            self._wake.clear()
            try:
                if time.monotonic() >= next_refresh or max(self.owned, default=-1) >= self.count:
                    next_refresh = time.monotonic() + self._refresh_s
                    await self._refresh()
                await self._sweep()
            except (KafkaClientError, ConnectionError, OSError) as exc:
                log.warning("keeping the partitions of %s read: %r", self.topic, exc)
            except Exception as exc:  # noqa: BLE001 (a metadata hiccup: again at the next sweep)
                log.warning("keeping the partitions of %s read: %r", self.topic, exc)

    async def _refresh(self) -> None:
        count = await self._partition_count()
        if count <= self.count:
            return
        old, self.count = self.count, count
        if self.mode is ReplyRoutingMode.ALL:
            await self._follower.follow(range(old, count), BEGINNING)
            log.info("reading %d new partition(s) of %s", count - old, self.topic)
            return
        # Until every writer places keys by the new count, a key may be on either count's partition.
        self._settle_until = time.monotonic() + SETTLE_S
        followed = self._follower.followed
        oldest = min((r.started_s for r in self._routes), default=None)
        since: Start = END if oldest is None else int((oldest - CLOCK_SLACK_S) * 1000)
        await asyncio.gather(
            self._follower.follow([p for p in range(old) if p not in followed], since),
            self._follower.follow([p for p in range(old, count) if p not in followed], BEGINNING),
        )
        log.info("%s grew from %d to %d partitions: all are read for %gs", self.topic, old, count, SETTLE_S)

    async def _sweep(self) -> None:
        if self.mode is ReplyRoutingMode.ALL:
            return
        now = time.monotonic()
        followed = self._follower.followed
        owned = self.owned
        # An owned partition new to the topic may hold replies already: from its beginning.
        await asyncio.gather(
            self._follower.follow([p for p in owned if p not in followed and p < self.count]),
            self._follower.follow([p for p in owned if p not in followed and p >= self.count], BEGINNING),
        )
        if now < self._settle_until:
            return
        for p, when in list(self._released.items()):
            if now - when > LINGER_S:
                del self._released[p]
        needed = owned | self._refs.keys() | self._released.keys()
        self._follower.unfollow(p for p in followed if p not in needed)

    async def _partition_count(self) -> int:
        return (await require_topics(self._connection, self.topic))[self.topic]
