"""A sequence's encoded ``stream_state``: the same bytes as encoding its wire dict, at the cost of
the record's own ids (every output carries the whole ``output_token_ids`` with parsers on)."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from tests.golden_cases import derenderer_for, sample_config
from tests.stream_builders import chat_stream
from worker.core.decoding import DecodeWindow
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.sequence_state import SequenceState


def test_the_encoding_equals_the_wire_dict_through_appends_and_a_rebuild() -> None:
    rng = random.Random(5)
    state = SequenceState(window=DecodeWindow(["a", "é"], 0, 2), last_tool_call_ids=["chatcmpl-tool-1"])
    for step in range(300):
        ids = [rng.randrange(-5, 200_000) for _ in range(rng.randint(0, 4))]
        state.output_token_ids.extend(ids)
        if ids:
            state.output_chunk_lens.append(len(ids))
        state.role_sent = step % 2 == 0
        if step == 150:  # lists replaced by shorter ones, as no record does: encoded again
            state.output_token_ids = state.output_token_ids[:7]
            state.output_chunk_lens = [7]
        assert state.wire_json() == orjson.dumps(state.to_wire())


def test_a_record_encodes_only_its_own_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    state = SequenceState()
    state.output_token_ids.extend(range(10_000))
    state.output_chunk_lens.extend([1] * 10_000)
    state.wire_json()
    encoded: list[int] = []
    real = orjson.dumps

    def counting(value: Any, *args: Any) -> bytes:
        if isinstance(value, list):
            encoded.append(len(value))
        return real(value, *args)

    monkeypatch.setattr(orjson, "dumps", counting)  # the module sequence_state calls
    state.output_token_ids.append(7)
    state.output_chunk_lens.append(1)
    state.wire_json()
    assert encoded == [1, 1]  # the new id and its chunk length, not the 10,000 before them


def test_the_result_holds_the_state_the_payload_carries_and_an_error_none() -> None:
    """The processor's result keeps the ``stream_state`` encoded: ``stream_state()`` decodes exactly
    what the payload carries, which the next record can bring back; an error record has none."""
    processor = EnvelopeProcessor(derenderer_for(sample_config(parsers=True)))
    first, second = chat_stream("r", [[9707], [11]], prompt_token_ids=[9707] * 3)
    result = processor.process(orjson.dumps(first))
    assert result.payload is not None
    state = result.stream_state()
    assert state is not None and state == orjson.loads(result.payload)["body"]["stream_state"]
    assert state["output_token_ids"] == [9707]
    assert processor.requests["r"].sequences[0].to_wire() == state  # what the processor holds
    refused = processor.process(orjson.dumps({**second, "seq": 5}))  # a gap: an error record
    assert refused.output is not None and "error" in refused.output
    assert refused.stream_state() is None
