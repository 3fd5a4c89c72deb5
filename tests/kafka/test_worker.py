"""The Kafka worker against a real broker: real processes, real signals, compared with replay.

Every test produces input envelopes, runs ``derender-worker run`` processes, reads the
output topic with ``read_committed`` and compares each request's outputs (after dropping
``source`` and normalizing ``created``) with ``replay``: the same records through an
in-process ``EnvelopeProcessor``.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Coroutine
from typing import Any

import orjson
import pytest

from tests.async_helpers import run_bounded
from tests.golden_cases import derenderer_for, load_cases
from tests.kafka_broker import KafkaBroker, TopicFactory
from tests.kafka_helpers import (
    CLIENTS,
    QWEN3_CONFIG,
    TopicReader,
    WorkerGroup,
    assert_identical,
    duplicates,
    free_port,
    generate_sequences,
    http_get,
    interleave,
    make_worker_topics,
    metric,
    produce,
    replay,
)
from worker.runtime.state.changelog import StateKeys

pytestmark = pytest.mark.kafka

PLAIN_FILES = ("plain_stream", "nonstream", "logprobs", "usage", "errors")


def run(coro: Coroutine[Any, Any, Any], timeout: float = 240.0) -> Any:
    return run_bounded(coro, timeout)


def _plain_configs() -> list[str]:
    configs = {
        json.dumps(c.config, sort_keys=True)
        for c in load_cases()
        if c.file in PLAIN_FILES and not c.uses_parser
    }
    return sorted(configs)


def _parser_config() -> str:
    """The parser configuration with the most golden records (reasoning + tool parser)."""
    sizes: dict[str, int] = {}
    for case in load_cases():
        if case.uses_parser:
            key = json.dumps(case.config, sort_keys=True)
            sizes[key] = sizes.get(key, 0) + len(case.input)
    return max(sizes, key=lambda k: sizes[k])


def _golden_records(config_key: str) -> list[tuple[bytes, bytes]]:
    """The config's cases as one stream; request ids made unique per case (cases reuse ids)."""
    records = []
    for number, case in enumerate(load_cases()):
        if json.dumps(case.config, sort_keys=True) != config_key:
            continue
        if not case.uses_parser and case.file not in PLAIN_FILES:
            continue
        for envelope in case.input:
            envelope = {**envelope, "request_id": f"c{number}-{envelope['request_id']}"}
            records.append((envelope["request_id"].encode(), orjson.dumps(envelope)))
    return records


def _config_id(key: str) -> str:
    config = json.loads(key)
    parts = [config["model_dir"], config["reasoning_parser"], config["tool_parser"]]
    if config["max_logprobs"] is not None:
        parts.append(f"max_logprobs={config['max_logprobs']}")
    return "-".join(str(p) for p in parts if p)


@pytest.mark.parametrize("config_key", [*_plain_configs(), _parser_config()], ids=_config_id)
def test_golden_end_to_end(kafka_bootstrap: str, kafka_topic_factory: TopicFactory, config_key: str) -> None:
    config = json.loads(config_key)
    records = _golden_records(config_key)
    reference = replay(derenderer_for(config), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=3)
    group = WorkerGroup(kafka_bootstrap, topics, config)

    async def body() -> None:
        positions = await produce(kafka_bootstrap, topics.input, records)
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        dlq = await TopicReader(kafka_bootstrap, topics.dlq).start()
        worker = group.start()
        try:
            await reader.wait_for(reference.output_count, 90, "outputs", group.logs)
            await dlq.wait_for(len(reference.dead_letters), 30, "dead letters", group.logs)
            await reader.settle(1.0)
        finally:
            status = worker.terminate()
            await reader.stop()
            await dlq.stop()
        assert status == 0, group.logs()
        assert_identical(reader.records, reference, group.logs())
        # source names the input record each output answers.
        by_position = {pos: orjson.loads(value) for pos, (_, value) in zip(positions, records, strict=True)}
        for record in reader.records:
            out = orjson.loads(record.value)
            src = out["source"]
            assert src["topic"] == topics.input
            envelope = by_position[(src["partition"], src["offset"])]
            assert (envelope["request_id"], envelope["seq"]) == (out["request_id"], out["seq"])
        assert sorted(orjson.loads(r.value)["reason"] for r in dlq.records) == sorted(reference.dead_letters)

    run(body())


def test_poison_records_go_to_dead_letters(kafka_bootstrap: str, kafka_topic_factory: TopicFactory) -> None:
    max_bytes = 4096
    good = interleave(generate_sequences(60, seed=3, prefix="ok"), window=20)
    valid = orjson.loads(good[0][1])
    poison: list[tuple[bytes | None, bytes]] = [
        (b"bad-json", b'{"request_id": "bad-json", "seq": 0, '),
        (b"not-object", b"[1, 2, 3]"),
        (b"wrong-shape", orjson.dumps({"request_id": "wrong-shape", "seq": -1, "endpoint": "chat"})),
        (b"extra", orjson.dumps({**valid, "request_id": "extra", "unexpected": 1})),
        (b"big", orjson.dumps({**valid, "request_id": "big", "pad": "x" * max_bytes})),
        (b"someone-else", orjson.dumps({**valid, "request_id": "mismatch"})),
        (b"binary", b"\xff\xfe\x00garbage"),
    ]
    rng = random.Random(5)
    records = list(good)
    for item in poison:
        records.insert(rng.randrange(len(records)), item)
    # A redelivered record (same request_id and seq) right after the original: counted, skipped.
    dup_at = next(i for i, r in enumerate(records) if r in good[10:])
    records.insert(dup_at + 1, records[dup_at])
    reference = replay(derenderer_for(QWEN3_CONFIG), records, max_record_bytes=max_bytes)
    assert len(reference.dead_letters) == len(poison)
    topics = make_worker_topics(kafka_topic_factory, partitions=3)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG, extra=["--max-record-bytes", str(max_bytes)])
    port = free_port()

    async def body() -> None:
        positions = await produce(kafka_bootstrap, topics.input, records)
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        dlq = await TopicReader(kafka_bootstrap, topics.dlq).start()
        worker = group.start(["--metrics-port", str(port)])
        try:
            await reader.wait_for(reference.output_count, 90, "outputs", group.logs)
            await dlq.wait_for(len(poison), 30, "dead letters", group.logs)
            await reader.settle(1.0)
            metrics = http_get(f"http://127.0.0.1:{port}/metrics")[1].decode()
        finally:
            assert worker.terminate() == 0, group.logs()
            await reader.stop()
            await dlq.stop()
        assert_identical(reader.records, reference, group.logs())
        assert metric(metrics, "derender_records_duplicate_total") == 1, metrics
        assert len(dlq.records) == len(poison)
        position_of = dict(zip(records, positions, strict=True))
        for record in dlq.records:
            letter = orjson.loads(record.value)
            assert letter["reason"], letter
            assert letter["source"]["topic"] == topics.input
            original: tuple[bytes | None, bytes] = next(
                item
                for item in poison
                if position_of[item] == (letter["source"]["partition"], letter["source"]["offset"])
            )
            assert record.key == original[0]
            if letter["original_encoding"] == "utf-8":
                assert letter["original"].encode() == original[1]
            else:
                assert original[0] == b"binary"
        reasons = " | ".join(sorted(orjson.loads(r.value)["reason"] for r in dlq.records))
        for expected in (
            "malformed JSON",
            "exceeds the limit",
            "differs from request_id",
            "not a valid envelope",
        ):
            assert expected in reasons, reasons

    run(body())


def test_scale_out_three_workers(kafka_bootstrap: str, kafka_topic_factory: TopicFactory) -> None:
    records = interleave(generate_sequences(1000, seed=17, prefix="scale"))
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=12)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG)

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        for _ in range(3):
            group.start()
        try:
            await produce(kafka_bootstrap, topics.input, records)
            await reader.wait_for(reference.output_count, 120, "outputs", group.logs)
            await reader.settle(1.0)
        finally:
            statuses = group.stop_all()
            await reader.stop()
        assert statuses == [0, 0, 0], group.logs()
        assert_identical(reader.records, reference, group.logs())
        # Every input partition carried records, and every worker owned some of them.
        sources = {orjson.loads(r.value)["source"]["partition"] for r in reader.records}
        assert sources == set(range(12))
        for worker in group.workers:
            assert "opened partitions" in worker.log_path.read_text(), worker.log_tail()

    run(body())


@pytest.mark.parametrize("client", CLIENTS)
def test_rebalance_under_load(kafka_bootstrap: str, kafka_topic_factory: TopicFactory, client: str) -> None:
    records = interleave(generate_sequences(800, seed=23, prefix="rebal"))
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=12)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG, client=client)

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        first, _second = group.start(), group.start()
        try:
            producing = asyncio.create_task(
                produce(kafka_bootstrap, topics.input, records, pace_per_s=len(records) / 12)
            )
            await reader.wait_for(len(records) // 6, 60, "outputs before the rebalance", group.logs)
            group.start()  # scale out mid-run
            await reader.wait_for(len(records) // 2, 60, "outputs after adding a worker", group.logs)
            status = await asyncio.to_thread(first.terminate)  # scale in mid-run
            assert status == 0, first.log_tail()
            await producing
            await reader.wait_for(reference.output_count, 120, "outputs", group.logs)
            await reader.settle(2.0)
        finally:
            statuses = group.stop_all()
            await reader.stop()
        assert all(s == 0 for s in statuses), group.logs()
        assert_identical(reader.records, reference, group.logs())
        assert _restored_requests(group) > 0, "no open request was ever handed over between workers"

    run(body())


@pytest.mark.parametrize("client", CLIENTS)
def test_crash_sigkill_repeatedly(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, client: str
) -> None:
    """Kafka's transactions_test.py pattern: kill -9 workers while a read_committed reader watches."""
    records = interleave(generate_sequences(700, seed=29, prefix="crash"))
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=12)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG, client=client)
    rng = random.Random(31)

    async def body() -> None:
        concurrent = await TopicReader(kafka_bootstrap, topics.output).start()
        for _ in range(3):
            group.start()
        # Streams must be in flight when the kills come: a worker still loading its tokenizer while
        # the whole input is produced could find it all there and finish it before the first kill.
        await _wait_for_log(group, "opened partitions", 1, 120)
        kills = 0
        try:
            producing = asyncio.create_task(
                produce(kafka_bootstrap, topics.input, records, pace_per_s=len(records) / 20)
            )
            for fraction in (0.15, 0.4, 0.65):
                await concurrent.wait_for(int(len(records) * fraction), 120, "outputs", group.logs)
                await asyncio.sleep(rng.uniform(0.0, 1.0))
                victim = rng.choice(group.alive)
                victim.kill()
                kills += 1
                group.start()  # a replacement, as an orchestrator would
                dups = duplicates(concurrent.records)
                assert not dups, f"duplicates seen by the concurrent reader after kill {kills}: {dups[:10]}"
            await producing
            await concurrent.wait_for(reference.output_count, 150, "outputs", group.logs)
            await concurrent.settle(2.0)
        finally:
            statuses = group.stop_all()
            await concurrent.stop()
        assert kills >= 3
        assert all(s == 0 for s in statuses), group.logs()
        assert _restored_requests(group) > 0, "no open request was ever restored from the state topic"
        assert_identical(concurrent.records, reference, group.logs())
        final = await TopicReader(kafka_bootstrap, topics.output).start()
        try:
            await final.wait_for(reference.output_count, 30, "outputs (final read)")
            await final.settle(1.0)
        finally:
            await final.stop()
        assert_identical(final.records, reference, group.logs())

    run(body(), timeout=300)


@pytest.mark.parametrize("client", CLIENTS)
def test_frozen_worker_is_fenced_when_it_wakes_up(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, client: str
) -> None:
    """A zombie: SIGSTOP a worker past its session timeout so its partitions move, then SIGCONT it.

    Per partition, its open transaction was aborted by the new owner's init_transactions (same
    transactional_id); per worker, its offsets carry a stale group generation (KIP-447). Either way
    its late writes must be fenced: no duplicates, nothing lost.
    """
    records = interleave(generate_sequences(500, seed=43, prefix="zombie"))
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=6)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG, client=client)

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        zombie, _other = group.start(), group.start()
        await _wait_for_log(group, "opened partitions", 2, 60)
        try:
            producing = asyncio.create_task(
                produce(kafka_bootstrap, topics.input, records, pace_per_s=len(records) / 18)
            )
            await reader.wait_for(len(records) // 5, 60, "outputs before the freeze", group.logs)
            zombie.pause()
            try:
                # Past the 6 s session timeout: the other worker takes all partitions over.
                await reader.wait_for(len(records) // 2, 60, "outputs while frozen", group.logs)
                await asyncio.sleep(2.0)
            finally:
                zombie.resume()
            await producing
            await reader.wait_for(reference.output_count, 150, "outputs", group.logs)
            await reader.settle(2.0)
        finally:
            statuses = group.stop_all()
            await reader.stop()
        assert all(s == 0 for s in statuses), group.logs()
        assert_identical(reader.records, reference, group.logs())

    run(body())


def _restored_requests(group: WorkerGroup) -> int:
    """How many request states the workers restored from the state topic (from their logs)."""
    total = 0
    for worker in group.workers:
        for match in re.finditer(
            r"with (\d+) restored requests", worker.log_path.read_text(errors="replace")
        ):
            total += int(match.group(1))
    return total


async def _wait_for_log(group: WorkerGroup, text: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sum(w.log_path.read_text(errors="replace").count(text) > 0 for w in group.workers) < count:
        group.check_no_unexpected_exit()
        if time.monotonic() > deadline:
            raise AssertionError(
                f"fewer than {count} workers logged {text!r} within {timeout}s\n{group.logs()}"
            )
        await asyncio.sleep(0.2)


@pytest.mark.broker_restart
@pytest.mark.parametrize("client", CLIENTS)
def test_broker_restart_mid_run(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory, client: str
) -> None:
    if not kafka_broker.restartable:
        pytest.skip(kafka_broker.not_restartable_reason)
    bootstrap = kafka_broker.bootstrap
    records = interleave(generate_sequences(500, seed=37, prefix="restart"))
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=6)
    group = WorkerGroup(bootstrap, topics, QWEN3_CONFIG, client=client)

    async def body() -> None:
        for _ in range(2):
            group.start()
        await _wait_for_log(group, "opened partitions", 2, 60)
        reader = await TopicReader(bootstrap, topics.output).start()
        try:
            # Paced over ~16 s so the restart (a few seconds) lands mid-stream.
            producing = asyncio.create_task(
                produce(bootstrap, topics.input, records, pace_per_s=len(records) / 16)
            )
            await reader.wait_for(len(records) // 4, 60, "outputs before the restart", group.logs)
            before = len(reader.records)
            await asyncio.to_thread(kafka_broker.restart)
            await producing
            assert before < reference.output_count, "the restart did not happen mid-run"
            await reader.wait_for(reference.output_count, 150, "outputs after the restart", group.logs)
            await reader.settle(2.0)
        finally:
            statuses = group.stop_all()
            await reader.stop()
        assert all(s == 0 for s in statuses), group.logs()
        assert_identical(reader.records, reference, group.logs())

    run(body(), timeout=300)


def test_idle_requests_expire_with_an_error_and_a_tombstone(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """A request that stops mid-stream is closed after --request-ttl-s: error output + state tombstone."""
    (sequence,) = generate_sequences(1, seed=41, prefix="idle")
    started = [(e["request_id"].encode(), orjson.dumps(e)) for e in sequence.envelopes[:2]]
    topics = make_worker_topics(kafka_topic_factory, partitions=1)
    group = WorkerGroup(
        kafka_bootstrap, topics, QWEN3_CONFIG, extra=["--request-ttl-s", "2", "--commit-interval-ms", "50"]
    )

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        state = await TopicReader(kafka_bootstrap, topics.state).start()
        worker = group.start()
        try:
            await produce(kafka_bootstrap, topics.input, started)
            await reader.wait_for(3, 60, "two outputs and the timeout error", group.logs)
            # The tombstone commits in the same transaction as the error output.
            await state.wait_for(2, 30, "a snapshot and a tombstone", group.logs)
            await state.settle(1.0)
        finally:
            assert worker.terminate() == 0, group.logs()
            await reader.stop()
            await state.stop()
        outputs = [orjson.loads(r.value) for r in reader.records]
        assert [o["seq"] for o in outputs] == [0, 1, 2]
        assert outputs[2]["error"]["code"] == 408, outputs[2]
        assert "source" not in outputs[2]  # no input record caused it
        # Its context record first; progress records if the two records were committed apart.
        keys = StateKeys(group.group_id)
        records = [r for r in state.records if r.key != keys.replay_from]
        assert {r.key for r in records} <= {keys.context("idle-00000"), keys.progress("idle-00000")}
        assert records[0].key == keys.context("idle-00000") and records[0].value is not None
        latest = {r.key: r.value for r in records}
        assert all(v is None for v in latest.values()), "the expired request's state was not deleted"

    run(body())
