"""Poison records on the real broker: no record can stop a partition or a worker.

Each shape below once made a partition reset, reopen at its committed offset, meet the same
record and reset again, forever (or was accepted where it should not be). Mixed into good streams
and run by two workers, every one of them must end as exactly one outcome (an output or error
record, or a dead letter), the group's committed offsets must pass every one of them, every good
stream must come out exactly once and equal to ``replay``, and both workers must stay up.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Coroutine
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.async_helpers import run_bounded
from tests.golden_cases import derenderer_for
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import (
    CLIENTS,
    QWEN3_CONFIG,
    TopicReader,
    WorkerGroup,
    assert_identical,
    generate_sequences,
    interleave,
    make_worker_topics,
    produce,
    replay,
)

pytestmark = pytest.mark.kafka

BIG = "18446744073709551616"  # 2**64 as a JSON string: pydantic's lax mode makes it a Python int
NUL_BYTES = 3 * 1024 * 1024
MAX_RECORD_BYTES = 4 * 1024 * 1024


def run(coro: Coroutine[Any, Any, Any], timeout: float = 300.0) -> Any:
    return run_bounded(coro, timeout)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def _first(rid: str, endpoint: str = "chat") -> dict[str, Any]:
    """The first record of a fresh one-token chat (or completion) stream."""
    body: dict[str, Any] = {
        "stream": True,
        "generate_chunk": {"request_id": rid, "choices": [{"index": 0, "token_ids": [9707]}]},
        "prompt_tokens": 3,
        "prompt_token_ids": [9707, 11, 1879],
    }
    if endpoint == "chat":
        body["chat_request"] = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
    else:
        body["completion_request"] = {"model": "test-model", "prompt": "hi"}
    return {"request_id": rid, "seq": 0, "endpoint": endpoint, "body": body}


def poison_records() -> dict[str, tuple[bytes | None, bytes]]:
    """Name -> (key, value) of each poison shape; each uses its own request id."""
    shapes: dict[str, dict[str, Any]] = {}
    e = shapes["big-seq"] = _first("p-big-seq")
    e["seq"] = BIG
    e = shapes["big-token"] = _first("p-big-token")
    e["body"]["generate_chunk"]["choices"][0]["token_ids"] = [BIG]
    e = shapes["big-index"] = _first("p-big-index")
    e["body"]["generate_chunk"]["choices"][0]["index"] = BIG
    e = shapes["big-read-offset"] = _first("p-big-read-offset")
    e["body"]["stream_state"] = {"prev_tokens": ["a"], "prefix_offset": 0, "read_offset": BIG}
    e = shapes["big-logprob-context"] = _first("p-big-logprob-context")
    e["body"]["stream_state"] = {"logprob_context_token_ids": [BIG]}
    e = shapes["deep-metrics"] = _first("p-deep-metrics")
    e["body"]["generate_chunk"]["metrics"] = {"deep": _nested(400)}
    # Accepted by processing; only the state snapshot at commit time cannot be written.
    e = shapes["deep-tools"] = _first("p-deep-tools")
    e["body"]["chat_request"]["tools"] = [
        {"type": "function", "function": {"name": "f", "parameters": _nested(400)}}
    ]
    e = shapes["prefix-past-prev-tokens"] = _first("p-prefix-past")
    e["body"]["stream_state"] = {"prev_tokens": ["a"], "prefix_offset": 5, "read_offset": 6}
    e = shapes["index-past-n"] = _first("p-index-past-n")
    e["body"]["generate_chunk"]["choices"][0]["index"] = 1999
    e = shapes["control-characters"] = _first("p-ctl\x01\x1b[2J")
    # The standard library writes nesting deeper than orjson's 254 levels (orjson reads 1,024).
    records = {name: (e["request_id"].encode(), json.dumps(e).encode()) for name, e in shapes.items()}
    records["key-less"] = (None, orjson.dumps(_first("p-key-less")))
    # Not JSON: a dead letter whose original (NUL escaped as \u0000) is six times its size.
    records["nul-bytes"] = (b"p-nul", b"\x00" * NUL_BYTES)
    return records


# Shapes that broke a partition before each record had one boundary: they must not come out as
# an ordinary output. The others must come out as exactly one outcome of any kind.
MUST_FAIL = {
    "big-seq",
    "big-token",
    "big-index",
    "big-read-offset",
    "big-logprob-context",
    "deep-metrics",
    "nul-bytes",
}


async def _committed(bootstrap: str, group_id: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False)
    await consumer.start()
    try:
        out = {}
        for p in range(partitions):
            out[p] = await consumer.committed(TopicPartition(topic, p)) or 0
        return out
    finally:
        await consumer.stop()


async def _ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: offset for tp, offset in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_poison_shapes_pass_two_workers(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, client: str
) -> None:
    good = interleave(generate_sequences(50, seed=41, prefix="good"), window=20)
    reference = replay(derenderer_for(QWEN3_CONFIG), good)
    poison = poison_records()
    rng = random.Random(8)
    records = list(good)
    for item in poison.values():
        records.insert(rng.randrange(len(records)), item)
    name_of = {item: name for name, item in poison.items()}
    large = {"max.message.bytes": str(MAX_RECORD_BYTES + 1024)}
    topics = make_worker_topics(kafka_topic_factory, partitions=6, input_config=large)
    group = WorkerGroup(
        kafka_bootstrap,
        topics,
        QWEN3_CONFIG,
        extra=["--max-record-bytes", str(MAX_RECORD_BYTES), "--max-record-retries", "2"],
        client=client,
    )

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        dlq = await TopicReader(kafka_bootstrap, topics.dlq).start()
        group.start()
        group.start()
        try:
            positions = await produce(
                kafka_bootstrap, topics.input, records, max_request_size=MAX_RECORD_BYTES + 1024
            )
            poison_at = {
                pos: name_of[item] for item, pos in zip(records, positions, strict=True) if item in name_of
            }
            good_rids = set(reference.outputs)

            def outcomes() -> dict[tuple[int, int], list[str]]:
                found: dict[tuple[int, int], list[str]] = {pos: [] for pos in poison_at}
                for record in reader.records:
                    out = orjson.loads(record.value)
                    source = out.get("source") or {}
                    pos = (source.get("partition"), source.get("offset"))
                    if pos in found:
                        found[pos].append("error" if "error" in out else "output")
                for record in dlq.records:
                    source = orjson.loads(record.value)["source"]
                    pos = (source["partition"], source["offset"])
                    if pos in found:
                        found[pos].append("dead letter")
                return found

            deadline = asyncio.get_running_loop().time() + 240
            while True:
                good_seen = sum(
                    1 for r in reader.records if r.key is not None and r.key.decode() in good_rids
                )
                done = good_seen >= reference.output_count and all(outcomes().values())
                if done or asyncio.get_running_loop().time() > deadline:
                    break
                group.check_no_unexpected_exit()
                await asyncio.sleep(0.5)
            await reader.settle(1.5)
            await asyncio.sleep(1.0)  # the last commit interval
            committed = await _committed(kafka_bootstrap, group.group_id, topics.input, topics.partitions)
            ends = await _ends(kafka_bootstrap, topics.input, topics.partitions)
            assert len(group.alive) == 2, group.logs()
        finally:
            statuses = group.stop_all()
            await reader.stop()
            await dlq.stop()
        assert statuses == [0, 0], group.logs()
        found = outcomes()
        for pos, kinds in sorted(found.items()):
            name = poison_at[pos]
            assert len(kinds) == 1, f"{name} at {pos}: outcomes {kinds}\n{group.logs()}"
            if name in MUST_FAIL:
                assert kinds != ["output"], f"{name} at {pos} came out as an ordinary output"
        assert committed == ends, f"committed {committed}, partition ends {ends}\n{group.logs()}"
        good_records = [r for r in reader.records if r.key is not None and r.key.decode() in good_rids]
        assert_identical(good_records, reference, group.logs())

    run(body())
