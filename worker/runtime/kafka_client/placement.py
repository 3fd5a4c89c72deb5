"""Where a keyed record lands: murmur2 of the key over the topic's partitions.

The rule Java clients and aiokafka apply, and the ``confluent`` backend too (``partitioner=
murmur2_random``; docs/kafka-worker.md#output-placement). The gateway steers a request's replies with
it (``worker.pipeline.gateway_routing``), so it must agree with every writer of the output topic:
``tests/runtime/test_placement_hash.py`` checks it against aiokafka's own partitioner.

Written for speed over aiokafka's pure-Python one (the gateway hashes on its event loop): the
32-bit words are unpacked at once.
"""

from __future__ import annotations

import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data`` (unsigned)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    words = length // 4
    for k in struct.unpack_from(f"<{words}I", data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        rest = data[words * 4 :]
        if tail == 3:
            h ^= rest[2] << 16
        if tail >= 2:
            h ^= rest[1] << 8
        h ^= rest[0]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_of(key: bytes, partitions: int) -> int:
    """The partition a record keyed ``key`` goes to in a topic of ``partitions`` partitions."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
