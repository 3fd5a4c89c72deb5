"""What a partition writes to the state topic as it handles records: batched per commit, the
context once then progress, deferred checkpoints; and that a restore from it equals the live partition."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiokafka import TopicPartition

from tests.golden_cases import derenderer_for, normalize
from tests.kafka_helpers import QWEN3_CONFIG, generate_sequences
from tests.partition_fakes import TEST_KEYS, FakeRecord, RecordingSink, owned_partition
from tests.stream_builders import written
from worker.core.envelope_processor import EnvelopeProcessor
from worker.runtime.kafka_client.base import OutgoingRecord
from worker.runtime.state.changelog import (
    StateChangelog,
    decode,
    encode_context,
    install,
    replay_after,
    restore,
)

KEYS = TEST_KEYS  # the namespace of ``owned_partition``'s state keys


def test_state_is_batched_per_commit_and_restorable() -> None:
    """One snapshot per touched request per commit; tombstones only for persisted requests."""
    derenderer = derenderer_for(QWEN3_CONFIG)
    a, b = generate_sequences(2, seed=1, prefix="unit")
    sink = RecordingSink()
    task = owned_partition(derenderer, sink)
    tp = task.tp

    async def body() -> None:
        offset = 0
        # Commit 1: the first two records of `a`, all of `b` (opens and closes in one interval).
        for envelope in [*a.envelopes[:2], *b.envelopes]:
            await task.handle(FakeRecord(offset, envelope))
            offset += 1
        await task.commit()
        state, offsets = sink.commits[-1]
        assert offsets == {tp: offset}
        assert [(r.key, r.value is None, r.partition) for r in state] == [
            (KEYS.context("unit-00000"), False, 2)
        ]
        # A restore of that snapshot continues `a` exactly like the original processor.
        restored = EnvelopeProcessor(derenderer)
        assert state[0].value is not None
        install(restored, {"unit-00000": decode(derenderer, state[0].value)}, now=0.0)
        expected: list[dict[str, Any]] = []
        for e in a.envelopes[2:]:
            expected.append(written(restored.process(orjson.dumps(e), e["request_id"].encode())))
        # Commit 2: the rest of `a` closes it: a tombstone, since a snapshot was written before.
        for envelope in a.envelopes[2:]:
            await task.handle(FakeRecord(offset, envelope))
            offset += 1
        await task.commit()
        state, _ = sink.commits[-1]
        assert [(r.key, r.value) for r in state] == [(KEYS.context("unit-00000"), None)]
        outputs = [orjson.loads(r.value) for r in sink.sent if r.value is not None]
        got = [
            {k: v for k, v in o.items() if k != "source"} for o in outputs if o["request_id"] == "unit-00000"
        ]
        assert normalize(got[2:]) == normalize(expected)
        # A record below the task's position (a stale fetch) is skipped, not reprocessed.
        before = len(sink.sent)
        await task.handle(FakeRecord(0, a.envelopes[0]))
        assert len(sink.sent) == before

    asyncio.run(body())


def _latest(commits: list[tuple[list[OutgoingRecord], dict[TopicPartition, int]]]) -> dict[bytes, bytes]:
    """What a compacted state partition holds after these commits: the last value per key."""
    latest: dict[bytes, bytes] = {}
    for state, _ in commits:
        for r in state:
            assert r.key is not None, "a state record is keyed by its request"
            if r.value is None:
                latest.pop(r.key, None)
            else:
                latest[r.key] = r.value
    return latest


def _restore(commits: list[tuple[list[OutgoingRecord], dict[TopicPartition, int]]]) -> EnvelopeProcessor:
    """A processor restored from what a state partition holds after these commits (no replay)."""
    restored = restore(KEYS, _latest(commits), derenderer_for(QWEN3_CONFIG))
    assert restored.replay_from is None  # every change checkpointed: nothing to re-read
    processor = EnvelopeProcessor(derenderer_for(QWEN3_CONFIG))
    install(processor, restored.checkpoints, now=0.0)
    return processor


def test_context_is_written_once_then_progress_only() -> None:
    """A request committed after every record: its context record once, then progress records only;
    a restore from both kinds at any point gives the same processor state; tombstones for both keys."""
    derenderer = derenderer_for(QWEN3_CONFIG)
    (a,) = [s for s in generate_sequences(40, seed=3, prefix="once") if len(s.envelopes) >= 5][:1]
    rid = a.request_id
    sink = RecordingSink()
    task = owned_partition(derenderer, sink)

    async def body() -> None:
        for offset, envelope in enumerate(a.envelopes[:-1]):
            await task.handle(FakeRecord(offset, envelope))
            await task.commit()
            # A restore from what the topic holds now equals the live request, and continues it alike.
            restored = _restore(sink.commits)
            live = task.processor.requests[rid]
            assert list(restored.requests) == [rid]
            assert encode_context(restored.requests[rid]) == encode_context(live)
            # The budget counts its live bytes, more than the state topic holds for it.
            assert task.sizes[rid] == live.live_bytes()
            assert task.sizes[rid] > sum(len(v) for v in _latest(sink.commits).values())
        await task.handle(FakeRecord(len(a.envelopes) - 1, a.envelopes[-1]))
        await task.commit()

    asyncio.run(body())
    written = [[(r.key, r.value) for r in state] for state, _ in sink.commits]
    first, *middle, last = written
    assert [k for k, _ in first] == [KEYS.context(rid)]
    assert orjson.loads(first[0][1] or b"")["kind"] == "context"
    assert middle and all([k for k, _ in c] == [KEYS.progress(rid)] for c in middle)
    progress = [orjson.loads(v or b"") for c in middle for _, v in c]
    assert all(p["kind"] == "progress" and "inherited" not in p and "request" not in p for p in progress)
    assert sorted(last, key=lambda kv: kv[0] or b"") == [
        (KEYS.context(rid), None),
        (KEYS.progress(rid), None),
    ]
    assert _latest(sink.commits) == {} and task.sizes == {}


def test_a_changed_context_rewrites_the_context_record() -> None:
    """A later record with new inherited fields: a new context record, the progress key tombstoned."""
    derenderer = derenderer_for(QWEN3_CONFIG)
    (a,) = [s for s in generate_sequences(40, seed=3, prefix="chg") if len(s.envelopes) >= 4][:1]
    rid = a.request_id
    envelopes = [dict(e, body=dict(e["body"])) for e in a.envelopes]
    first = envelopes[0]["body"]
    envelopes[2]["body"]["prompt_token_ids"] = [*first["prompt_token_ids"], 13]
    envelopes[2]["body"]["prompt_tokens"] = len(first["prompt_token_ids"]) + 1
    sink = RecordingSink()
    task = owned_partition(derenderer, sink)

    async def body() -> None:
        for offset, envelope in enumerate(envelopes[:3]):
            await task.handle(FakeRecord(offset, envelope))
            await task.commit()

    asyncio.run(body())
    third = sorted((r.key, r.value is None) for r in sink.commits[2][0])
    assert third == [(KEYS.context(rid), False), (KEYS.progress(rid), True)]
    restored = _restore(sink.commits)
    assert encode_context(restored.requests[rid]) == encode_context(task.processor.requests[rid])
    assert restored.requests[rid].inherited["prompt_token_ids"][-1] == 13


def test_deferred_checkpoints_restore_by_re_reading_the_input() -> None:
    """With a checkpoint interval, progress records are written at most that often and a
    replay-from offset says where the input must be re-read; a restore from what the topic holds
    after any commit, plus the re-read records, equals the live processor, and continues alike."""
    derenderer = derenderer_for(QWEN3_CONFIG)
    sequences = generate_sequences(6, seed=5, prefix="ckpt")
    envelopes = [
        s.envelopes[i]
        for i in range(max(len(s.envelopes) for s in sequences))
        for s in sequences
        if i < len(s.envelopes)
    ]
    now = [0.0]
    changelog = StateChangelog("state", 2, KEYS, checkpoint_interval_s=1.0, clock=lambda: now[0])
    sink = RecordingSink()
    task = owned_partition(derenderer, sink, changelog=changelog)
    records = [FakeRecord(offset, envelope) for offset, envelope in enumerate(envelopes)]
    replays = 0

    async def body() -> None:
        nonlocal replays
        for start in range(0, len(records), 3):
            for record in records[start : start + 3]:
                await task.handle(record)
            now[0] += 0.25
            await task.commit()
            restored = restore(KEYS, _latest(sink.commits), derenderer)
            processor = EnvelopeProcessor(derenderer)
            install(processor, restored.checkpoints, now=0.0)
            if restored.replay_from is not None:
                replays += 1
                replay_after(processor, restored.checkpoints, records[restored.replay_from : task.position])
            live = {rid: encode_context(ctx) for rid, ctx in task.processor.requests.items()}
            assert {rid: encode_context(ctx) for rid, ctx in processor.requests.items()} == live

    asyncio.run(body())
    progress = [
        r for state, _ in sink.commits for r in state if r.key is not None and r.key.endswith(b"\xffprogress")
    ]
    updates = sum(1 for r in records[1:] if orjson.loads(r.value)["seq"] > 0)
    assert replays > 0 and 0 < len(progress) < updates / 2  # fewer than one per record, by the interval
    assert _latest(sink.commits) == {KEYS.replay_from: b'{"v":3,"kind":"replay-from","offset":null}'}
