"""The gateway steers replies by the placement rule every writer of the output topic applies:
``kafka_client.placement`` must place each key where aiokafka (as Java clients, and librdkafka
with ``murmur2_random``) places it."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner, murmur2

from worker.runtime.kafka_client.placement import murmur2 as our_murmur2
from worker.runtime.kafka_client.placement import partition_of


def test_murmur2_equals_aiokafkas_for_every_tail_length() -> None:
    rng = random.Random(30)
    for length in range(0, 70):
        for _ in range(20):
            data = rng.randbytes(length)
            assert our_murmur2(data) == murmur2(data), data


def test_keys_are_placed_as_aiokafka_places_them() -> None:
    partitioner = DefaultPartitioner()
    rng = random.Random(31)
    keys = [
        f"{prefix}{rng.getrandbits(128):032x}{suffix}".encode()
        for prefix in ("", "resp_", "msg_")
        for suffix in ("", "-0", "-17")
        for _ in range(30)
    ]
    for count in (1, 2, 3, 4, 7, 12, 24):
        partitions = list(range(count))
        placed = [partition_of(key, count) for key in keys]
        assert placed == [partitioner(key, partitions, partitions) for key in keys]
        if count > 1:
            assert len(set(placed)) > 1  # a hash, not a constant
