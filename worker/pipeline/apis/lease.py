"""Leases on the records of a compacted table: which gateway replica runs a background response or a batch.

The record of running work carries ``lease: {"id", "owner", "until", "prev"}``. Its owner renews ``until``
(``now + lease_s``) every ``lease_s / 3``; it starts nothing new (no request, no output chunk) once its last
confirmed renewal is ``2/3 lease_s`` old, so a stalled owner goes quiet before its lease ends. Another
replica that finds the lease past ``until`` claims it by writing the record with a new lease whose ``prev``
is the expired lease's id.

Every replica decides which records count by one rule over the topic's order (``accepts``): a record counts
when it carries the current lease (the owner's progress, renewals, its last write) or claims it (``prev`` is
the current id). Of two claims of the same lease the first by offset wins; the second names a lease that is
no longer current and is ignored everywhere. A claimant reads the topic up to its own claim before it acts,
so it knows whether it won; a zombie owner's late writes name a lease that is no longer current and are
ignored too.

An owner that stops gracefully (SIGTERM) writes its last record with the lease *released*: expired at once,
so another replica claims it in its next round instead of waiting out ``lease_s``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

JsonDict = dict[str, Any]

log = logging.getLogger(__name__)

RENEWALS_PER_LEASE = 3  # renewed every lease_s / 3
QUIET_AFTER = 2 / 3  # an owner whose last renewal is older than this share of lease_s starts nothing new


def new_owner() -> str:
    """This replica's name in the leases it holds."""
    return uuid.uuid4().hex[:16]


def lease_of(record: JsonDict | None) -> JsonDict | None:
    lease = record.get("lease") if isinstance(record, dict) else None
    return lease if isinstance(lease, dict) and isinstance(lease.get("id"), str) else None


def accepts(current: JsonDict | None, incoming: JsonDict) -> bool:
    """Whether ``incoming`` replaces ``current`` under the lease rule (records without a lease always do)."""
    held, coming = lease_of(current), lease_of(incoming)
    if held is None or coming is None:
        return True
    return bool(coming["id"] == held["id"] or coming.get("prev") == held["id"])


def same_lease(record: JsonDict | None, other: JsonDict) -> bool:
    """Whether ``record`` carries the lease ``other`` carries (a claim read back: it won)."""
    held, wanted = lease_of(record), lease_of(other)
    return held is not None and wanted is not None and held["id"] == wanted["id"]


def expired(record: JsonDict, now: float) -> bool:
    """Whether another replica may claim the record's lease: it ran out, or its owner released it."""
    lease = lease_of(record)
    if lease is None:
        return False
    until = lease.get("until")
    return lease.get("released") is True or (isinstance(until, int | float) and until < now)


@dataclass
class Holding:
    """A lease this replica holds: the record field to write, and until when it may act on it."""

    owner: str
    lease_s: float
    prev: str | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    renewed_at: float = field(default_factory=time.time)  # the start of the last confirmed renewal
    lost: bool = False

    def field(self, now: float | None = None) -> JsonDict:
        """The lease as written now (``until`` counted from ``now``)."""
        at = time.time() if now is None else now
        return {"id": self.id, "owner": self.owner, "until": at + self.lease_s, "prev": self.prev}

    def released(self) -> JsonDict:
        """The lease as its owner's last write: claimable at once. The owner acts on it no more."""
        self.lost = True
        return {**self.field(), "until": time.time(), "released": True}

    def confirmed(self, at: float) -> None:
        self.renewed_at = max(self.renewed_at, at)

    def may_act(self) -> bool:
        return not self.lost and time.time() < self.renewed_at + self.lease_s * QUIET_AFTER

    def due(self) -> bool:
        """Whether the next renewal is due."""
        return time.time() >= self.renewed_at + self.renew_every()

    def renew_every(self) -> float:
        return self.lease_s / RENEWALS_PER_LEASE

    def holds(self, record: JsonDict | None) -> bool:
        lease = lease_of(record)
        return lease is not None and lease["id"] == self.id


@dataclass(frozen=True)
class Takeover:
    """One kind of leased work (background responses, batches) as the takeover rounds see it."""

    what: str  # for the log: "background response", "batch"
    owner: str
    lease_s: float
    candidates: Callable[[], Iterable[tuple[str, JsonDict]]]  # unfinished, not run here, with a run
    claim: Callable[[str, JsonDict], Awaitable[bool]]  # writes the record; whether this claim won
    start: Callable[[str, JsonDict, Holding], None]  # runs what was won
    stopping: Callable[[], bool]

    async def rounds(self) -> None:
        """Every renewal period (jittered, so replicas do not claim in step): claim each candidate
        whose lease expired, and start what was won. Returns when the replica stops."""
        while True:
            await asyncio.sleep(self.lease_s / RENEWALS_PER_LEASE * random.uniform(0.5, 1.0))
            if self.stopping():
                return  # it would only hand the work over again
            now = time.time()
            for key, record in list(self.candidates()):
                lease = lease_of(record)
                if lease is None or not isinstance(record.get("run"), dict) or not expired(record, now):
                    continue
                holding = Holding(self.owner, self.lease_s, prev=lease["id"])
                try:
                    won = await self.claim(key, {**record, "lease": holding.field()})
                except Exception as exc:  # noqa: BLE001 (Kafka unavailable: the next round tries again)
                    log.warning("%s %s: could not be claimed: %r", self.what, key, exc)
                    continue
                if not won:
                    continue
                log.info("%s %s: taken over from %s", self.what, key, lease.get("owner"))
                try:
                    self.start(key, record, holding)
                except Exception:  # one bad record must not end the rounds for every other one
                    log.exception("%s %s: could not be started", self.what, key)
