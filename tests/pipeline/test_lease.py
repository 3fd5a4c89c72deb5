"""The lease rule on the API stores' records: of two claims of one expired lease the first written wins on
every replica, a replaced owner's late writes are ignored, and a cancel counts whoever holds the lease.
Without Kafka: each store's topic is in memory, every write read back through the store's own rules."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import orjson
import pytest

from tests.pipeline.chat_stand_in import ChatStandIn
from tests.pipeline.memory_stores import MemoryBatchStore, MemoryResponsesStore
from worker.pipeline.apis.batch_run import BatchRun
from worker.pipeline.apis.lease import Holding, Takeover, accepts, expired
from worker.settings import GatewayOptions

KEY = "batch:batch_1"


def batch(holding: Holding, status: str = "in_progress", **fields: object) -> dict[str, object]:
    return {"id": "batch_1", "status": status, "lease": holding.field(), "run": {}, **fields}


def test_the_first_claim_of_an_expired_lease_wins_and_the_old_owner_is_fenced() -> None:
    async def scenario() -> None:
        store = MemoryBatchStore()
        first = Holding("replica-a", 3.0)
        assert await store.put_meta(KEY, batch(first))
        b = Holding("replica-b", 3.0, prev=first.id)
        c = Holding("replica-c", 3.0, prev=first.id)
        assert await store.claim(KEY, batch(b))  # first by offset
        assert not await store.claim(KEY, batch(c))  # names a lease that is no longer current
        assert b.holds(store.meta[KEY])
        # The old owner wakes up and writes progress: refused, here and on every replica.
        assert not await store.put_meta(KEY, batch(first, request_counts={"completed": 99}))
        assert "request_counts" not in store.meta[KEY]
        # The new owner's progress counts.
        assert await store.put_meta(KEY, batch(b, request_counts={"completed": 1}))
        # A replica reading the topic from its start decides the same.
        fresh = MemoryBatchStore()
        for key, value in store.log:
            fresh.take(key.encode(), value)
        assert fresh.meta[KEY] == store.meta[KEY]

    asyncio.run(scenario())


def test_a_cancel_written_from_a_stale_view_still_cancels_and_keeps_the_lease() -> None:
    async def scenario() -> None:
        store = MemoryBatchStore()
        first = Holding("replica-a", 3.0)
        await store.put_meta(KEY, batch(first))
        second = Holding("replica-b", 3.0, prev=first.id)
        assert await store.claim(KEY, batch(second))
        assert await store.put_meta(KEY, batch(first, status="cancelling", cancelling_at=5))
        assert store.meta[KEY]["status"] == "cancelling" and second.holds(store.meta[KEY])
        # The owner's next progress write does not undo it.
        await store.put_meta(KEY, batch(second))
        assert store.meta[KEY]["status"] == "cancelling"

    asyncio.run(scenario())


def test_background_response_records_follow_the_same_rule_and_running_ones_are_never_dropped() -> None:
    async def scenario() -> None:
        store = MemoryResponsesStore(max_bytes=1)  # over its cap with any record
        owner = Holding("replica-a", 3.0)

        def record(holding: Holding, status: str) -> dict[str, object]:
            return {"response": {"id": "resp_1", "status": status}, "events": [], "lease": holding.field()}

        await store.put("resp_1", record(owner, "in_progress"))
        await store.put("resp_2", {"response": {"id": "resp_2", "status": "completed"}, "events": None})
        await store.put("resp_3", {"response": {"id": "resp_3", "status": "completed"}, "events": None})
        assert list(store.records) == ["resp_1", "resp_3"]  # the finished one went, not the running one
        taker = Holding("replica-b", 3.0, prev=owner.id)
        assert await store.claim("resp_1", record(taker, "in_progress"))
        assert not await store.put("resp_1", record(owner, "completed"))
        assert store.records["resp_1"]["response"]["status"] == "in_progress"

    asyncio.run(scenario())


def test_a_lease_expires_at_its_until_and_records_without_one_always_count() -> None:
    holding = Holding("replica-a", 3.0)
    record = batch(holding)
    assert not expired(record, time.time()) and expired(record, time.time() + 4)
    assert not expired({"status": "in_progress"}, time.time())  # no lease: nothing to take over
    assert accepts(record, {"status": "x"}) and accepts(None, record)


def test_an_owner_goes_quiet_before_its_lease_ends() -> None:
    holding = Holding("replica-a", 3.0)
    assert holding.may_act()
    holding.renewed_at -= 2.1  # its last confirmed renewal is over 2/3 of the lease old
    assert not holding.may_act() and holding.due()


def test_a_released_lease_is_claimable_at_once_and_its_owner_writes_no_more() -> None:
    async def scenario() -> None:
        store = MemoryBatchStore()
        owner = Holding("replica-a", 3600.0)  # would run for an hour unless released
        assert await store.put_meta(KEY, batch(owner))
        assert not expired(store.meta[KEY], time.time())
        # The owner's last write (a graceful stop): the lease released, not waited out.
        assert await store.put_meta(KEY, {**batch(owner), "lease": owner.released()})
        assert expired(store.meta[KEY], time.time())
        assert owner.lost and not owner.may_act()
        # Claimed in the next round, and the claim wins on every replica.
        claimant = Holding("replica-b", 3600.0, prev=owner.id)
        assert await store.claim(KEY, batch(claimant))
        assert claimant.holds(store.meta[KEY]) and not expired(store.meta[KEY], time.time())

    asyncio.run(scenario())


def test_a_takeover_round_claims_only_expired_runs_and_starts_what_it_won() -> None:
    async def scenario() -> None:
        store = MemoryBatchStore()
        gone = Holding("replica-a", 0.01)  # expires at once
        alive = Holding("replica-a", 60.0)
        await store.put_meta("batch:expired", {**batch(gone), "id": "expired"})
        await store.put_meta("batch:renewed", {**batch(alive), "id": "renewed"})
        # Nothing to resume: no run.
        await store.put_meta("batch:unsent", {**batch(gone), "id": "unsent", "run": None})
        await store.put_meta("batch:flaky", {**batch(gone), "id": "flaky"})
        await asyncio.sleep(0.02)
        started: list[tuple[str, Holding]] = []
        stop = asyncio.Event()
        failed_once: set[str] = set()

        async def claim(key: str, record: dict[str, object]) -> bool:
            if key == "batch:flaky" and key not in failed_once:  # Kafka unavailable: the next round retries
                failed_once.add(key)
                raise ConnectionError("broker down")
            return await store.claim(key, record)

        def start(key: str, record: dict[str, object], holding: Holding) -> None:
            started.append((key, holding))
            if len(started) == 2:
                stop.set()

        takeover = Takeover(
            what="batch",
            owner="replica-b",
            lease_s=0.03,
            candidates=lambda: [(k, v) for k, v in store.meta.items() if k not in dict(started)],
            claim=claim,
            start=start,
            stopping=stop.is_set,
        )
        async with asyncio.timeout(5):
            await takeover.rounds()
        assert [key for key, _ in started] == ["batch:expired", "batch:flaky"]
        for key, holding in started:
            assert holding.holds(store.meta[key]) and holding.prev == gone.id
        assert alive.holds(store.meta["batch:renewed"])
        assert gone.holds(store.meta["batch:unsent"])

    asyncio.run(scenario())


def test_a_takeover_round_starts_nothing_it_lost_and_goes_on_after_a_start_that_fails() -> None:
    async def scenario() -> None:
        store = MemoryBatchStore()
        gone = Holding("replica-a", 0.01)
        for name in ("lost", "broken", "fine"):
            await store.put_meta(f"batch:{name}", {**batch(gone), "id": name})
        stale = dict(store.meta)  # this replica's view, from before another one claimed "lost"
        assert await store.claim(
            "batch:lost", {**batch(Holding("replica-c", 60.0, prev=gone.id)), "id": "lost"}
        )
        await asyncio.sleep(0.02)
        attempted: list[str] = []
        stop = asyncio.Event()

        def start(key: str, record: dict[str, object], holding: Holding) -> None:
            attempted.append(key)
            if key == "batch:broken":
                raise KeyError("created_at")
            stop.set()

        takeover = Takeover(
            what="batch",
            owner="replica-b",
            lease_s=0.03,
            candidates=lambda: [(k, v) for k, v in stale.items() if k not in attempted],
            claim=store.claim,
            start=start,
            stopping=stop.is_set,
        )
        async with asyncio.timeout(5):
            await takeover.rounds()
        assert attempted == ["batch:broken", "batch:fine"]  # "lost" was claimed, lost, not started
        assert store.meta["batch:lost"]["lease"]["owner"] == "replica-c"

    asyncio.run(scenario())


class SlowTopic(MemoryBatchStore):
    """A batch topic whose writes take a moment, so a cancel can come in the middle of one."""

    async def send(self, key: str, value: bytes) -> None:
        await asyncio.sleep(0.05)
        await super().send(key, value)


def test_a_release_cancelled_half_way_is_finished_by_the_next_call_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Seen in the SIGTERM handover test: the runner released on seeing the gateway close, the stop then
    # cancelled it mid-write, and its cancel handler's release found the lease "taken over".
    async def scenario() -> None:
        store = SlowTopic()
        holding = Holding("replica-a", 60.0)
        await store.put_meta(KEY, batch(holding))
        run = BatchRun(ChatStandIn(GatewayOptions(allow_no_api_key=True)), store, KEY, holding)
        first = asyncio.ensure_future(run.release())  # the runner saw the gateway closing
        await asyncio.sleep(0.01)  # its write is under way
        first.cancel()  # the stop cancels the runner
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await run.release()  # the runner's cancel handler
        written = orjson.loads(store.log[-1][1])
        assert store.log[-1][0] == KEY and written["lease"]["released"] is True
        assert expired(written, time.time())

    with caplog.at_level(logging.INFO, logger="worker.pipeline.apis.batch_run"):
        asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if "handed over" in r.getMessage()]
    assert said == ["batch batch_1: handed over before it started (its lease released)"]
