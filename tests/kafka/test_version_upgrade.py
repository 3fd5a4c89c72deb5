"""A worker upgraded from vLLM 0.33 to 0.34 parity takes over the old one's state topic without loss.

The first half of every plain golden stream runs on a worker matching vLLM 0.33, which is then
killed (SIGKILL); a worker of the same group matching 0.34 restores the state records the first
one wrote (0.33's window form) and runs the rest. Each output equals what vLLM 0.33 answered
before the hand-over and what vLLM 0.34 answered from that record on (the two golden sets).
"""

from __future__ import annotations

import json
from collections.abc import Coroutine
from typing import Any

import orjson
import pytest

from tests.async_helpers import run_bounded
from tests.golden_cases import GOLDEN_034_DIR, GoldenCase, load_cases, normalize
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import TopicReader, WorkerGroup, make_worker_topics, produce
from worker.core.vllm_version import VllmVersion

pytestmark = pytest.mark.kafka

PLAIN_FILES = ("plain_stream", "usage", "logprobs")


def run(coro: Coroutine[Any, Any, Any], timeout: float = 300.0) -> Any:
    return run_bounded(coro, timeout)


def _cases() -> list[tuple[GoldenCase, GoldenCase]]:
    """(0.33 case, 0.34 case) pairs of one configuration: plain streams of two records or more."""
    newer = {(c.file, c.id): c for c in load_cases(GOLDEN_034_DIR)}
    pairs = [
        (case, newer[(case.file, case.id)])
        for case in load_cases()
        if case.file in PLAIN_FILES
        and not case.uses_parser
        and len(case.input) >= 2
        and all(e["body"].get("stream") is True for e in case.input)
    ]
    config = json.dumps(pairs[0][0].config, sort_keys=True)
    return [p for p in pairs if json.dumps(p[0].config, sort_keys=True) == config]


def _renamed(envelope: dict[str, Any], number: int) -> dict[str, Any]:
    return {**envelope, "request_id": f"c{number}-{envelope['request_id']}"}


def _same(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    if "error" in want:  # compared by status, as the golden cases are
        assert got.get("error", {}).get("code") == want["error"]["code"], f"{where}: {got}"
    else:
        assert got == want, where


def test_a_state_topic_of_a_033_worker_restored_by_a_034_worker(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    pairs = _cases()
    assert len(pairs) >= 10
    config = pairs[0][0].config
    before: list[tuple[bytes, bytes]] = []
    after: list[tuple[bytes, bytes]] = []
    expected: dict[tuple[str, int], dict[str, Any]] = {}
    for number, (old, new) in enumerate(pairs):
        cut = len(old.input) // 2
        for seq, envelope in enumerate(old.input):
            sent = _renamed(envelope, number)
            (before if seq < cut else after).append((sent["request_id"].encode(), orjson.dumps(sent)))
            answer = (old if seq < cut else new).expected[seq]
            expected[(sent["request_id"], seq)] = _renamed(answer, number)
    topics = make_worker_topics(kafka_topic_factory, partitions=2)
    older = WorkerGroup(kafka_bootstrap, topics, config, version=VllmVersion.V0_33)
    newer = WorkerGroup(kafka_bootstrap, topics, config, version=VllmVersion.V0_34, group_id=older.group_id)

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        try:
            await produce(kafka_bootstrap, topics.input, before)
            first = older.start()
            await reader.wait_for(len(before), 120, "outputs before the upgrade", older.logs)
            first.kill()  # no clean shutdown: the state is what the last commit wrote
            await produce(kafka_bootstrap, topics.input, after)
            second = newer.start()
            await reader.wait_for(len(before) + len(after), 120, "outputs after the upgrade", newer.logs)
            await reader.settle(1.0)
            assert second.terminate() == 0, newer.logs()
        finally:
            await reader.stop()
        outputs = [orjson.loads(r.value) for r in reader.records]
        assert len(outputs) == len(expected), newer.logs()
        forms = set()
        logs = newer.logs()
        for output in outputs:
            output.pop("source", None)
            key = (output["request_id"], output["seq"])
            _same(normalize([output])[0], normalize([expected[key]])[0], f"{key}\n{logs}")
            state = (output.get("body") or {}).get("stream_state") or {}
            forms |= {k for k in ("prev_tokens", "prev_token_ids") if k in state}
        assert forms == {"prev_tokens", "prev_token_ids"}  # both sides of the upgrade were seen

    run(body())
