"""The state records' codec and keys, and restoring request state from them (no partition involved)."""

from __future__ import annotations

import orjson
import pytest

from tests.golden_cases import GoldenCase, derenderer_for, load_cases, normalize
from tests.kafka_helpers import QWEN3_CONFIG, generate_sequences
from tests.partition_fakes import TEST_KEYS
from tests.stream_builders import written
from worker.core.envelope_processor import EnvelopeProcessor
from worker.runtime.state.changelog import (
    StateKeys,
    decode,
    encode_context,
    encode_progress,
    install,
    restore,
)

KEYS = TEST_KEYS


def test_restore_of_both_kinds() -> None:
    """A context record alone, a context record with a newer progress record, and a progress
    record without its context record (dropped); other groups' keys are not read."""
    derenderer = derenderer_for(QWEN3_CONFIG)
    (a,) = generate_sequences(1, seed=4, prefix="kinds")
    processor = EnvelopeProcessor(derenderer)
    processor.process(orjson.dumps(a.envelopes[0]))
    early = encode_context(processor.requests[a.request_id], 0)
    processor.process(orjson.dumps(a.envelopes[1]))
    ctx = processor.requests[a.request_id]
    latest = {
        KEYS.context("context"): encode_context(ctx, 1),
        KEYS.context("pair"): early,
        KEYS.progress("pair"): encode_progress(ctx, 1),
        KEYS.progress("orphan"): encode_progress(ctx, 1),
        StateKeys("other").context("other"): early,
    }
    restored = restore(KEYS, latest, derenderer)
    assert set(restored.checkpoints) == {"context", "pair"} and restored.replay_from is None
    for checkpoint in restored.checkpoints.values():
        assert encode_context(checkpoint.ctx) == encode_context(ctx) and checkpoint.offset == 1


def test_format_1_records_are_read() -> None:
    """Records written before checkpoints carried an offset (format 1) restore as current ones."""
    derenderer = derenderer_for(QWEN3_CONFIG)
    (a,) = generate_sequences(1, seed=4, prefix="v1")
    processor = EnvelopeProcessor(derenderer)
    for envelope in a.envelopes[:2]:
        processor.process(orjson.dumps(envelope))
    ctx = processor.requests[a.request_id]
    v1 = orjson.loads(encode_context(ctx))
    v1["v"] = v1["progress"]["v"] = 1
    del v1["progress"]["offset"]
    checkpoint = decode(derenderer, orjson.dumps(v1))
    assert checkpoint.offset is None and encode_context(checkpoint.ctx) == encode_context(ctx)
    with pytest.raises(ValueError, match="unknown state record format"):
        decode(derenderer, orjson.dumps({**v1, "v": 99}))


@pytest.mark.parametrize("case", load_cases(), ids=lambda c: f"{c.file}:{c.id}")
def test_restoring_from_a_snapshot_before_every_record_changes_nothing(case: GoldenCase) -> None:
    """What a partition handoff does (state topic round trip), after every record of every case.

    Parser cases included: their live parser sessions are not in the snapshot and must be rebuilt.
    """
    derenderer = derenderer_for(case.config)
    straight = EnvelopeProcessor(derenderer)
    results = [straight.process(orjson.dumps(e)) for e in case.input]
    expected = [written(r) if r.output is not None else None for r in results]
    snapshots: dict[str, bytes] = {}
    got = []
    for envelope in case.input:
        processor = EnvelopeProcessor(derenderer)
        install(processor, {rid: decode(derenderer, value) for rid, value in snapshots.items()}, now=0.0)
        result = processor.process(orjson.dumps(envelope))
        got.append(written(result) if result.output is not None else None)
        snapshots = {rid: encode_context(ctx) for rid, ctx in processor.requests.items()}
    assert normalize([o for o in got if o]) == normalize([o for o in expected if o])


def test_state_keys_are_namespaced_by_group() -> None:
    """Two groups on one state topic never read (or delete) each other's records."""
    blue, green = StateKeys("blue"), StateKeys("blue-2")
    for rid in ("chatcmpl-1", "", "a\x00b", "名前\xfe?"):  # any request id, NUL included
        assert blue.parse(blue.context(rid)) == (rid, False)
        assert blue.parse(blue.progress(rid)) == (rid, True)
        assert green.parse(blue.context(rid)) is None and blue.parse(green.progress(rid)) is None
    # A group whose id extends another's: the 0xfe after the group id keeps them apart.
    assert StateKeys("blue").parse(b"blue-2\xfex") is None
    assert StateKeys("").parse(b"chatcmpl-1") is None  # an un-namespaced key belongs to no group
    assert blue.parse(blue.replay_from) is None  # the partition's own key is no request's
