"""Request ids minted by a gateway replica put their replies on the partitions it owns and reads
(``gateway_routing.ReplyRouting.mint``); no broker: the replica's share is set as its group and
reader would set it."""

from __future__ import annotations

import asyncio

from worker.pipeline.connection import Connection
from worker.pipeline.gateway_routing import ReplyRouting
from worker.runtime.kafka_client.placement import partition_of
from worker.runtime.security.kafka_security import KafkaSecurity


def _routing(count: int, owned: set[int], followed: set[int]) -> ReplyRouting:
    # Clients are built, never started: nothing connects.
    routing = ReplyRouting("out", Connection("127.0.0.1:1", "test", KafkaSecurity()), lambda k, v: False)
    routing.count = count
    assert routing._membership is not None
    routing._membership.owned = frozenset(owned)
    routing._follower._followed = set(followed)
    return routing


def test_ids_hash_to_owned_partitions_that_are_read() -> None:
    async def go() -> None:
        routing = _routing(6, owned={1, 4}, followed={1, 4, 5})
        ids = [routing.mint("resp_") for _ in range(200)]
        assert all(i.startswith("resp_") and len(i) == 37 for i in ids)
        assert {partition_of(i.encode(), 6) for i in ids} == {1, 4}
        # Owned but not read yet (its end not looked up): not steered onto.
        routing = _routing(6, owned={1, 4}, followed={4})
        assert {partition_of(routing.mint().encode(), 6) for _ in range(200)} == {4}

    asyncio.run(go())


def test_every_key_of_a_two_prompt_stream_is_steered() -> None:
    async def go() -> None:
        routing = _routing(4, owned={0, 1, 3}, followed={0, 1, 3})
        for _ in range(50):
            rid = routing.mint("", lambda r: {r, f"{r}-0", f"{r}-1"})
            assert {partition_of(k.encode(), 4) for k in (rid, f"{rid}-0", f"{rid}-1")} <= {0, 1, 3}

    asyncio.run(go())


def test_a_replica_that_owns_nothing_mints_plain_ids() -> None:
    async def go() -> None:
        routing = _routing(4, owned=set(), followed={0, 1, 2, 3})
        spread = {partition_of(routing.mint().encode(), 4) for _ in range(200)}
        assert spread == {0, 1, 2, 3}

    asyncio.run(go())
