"""A sequence's encoded ``stream_state``: the same bytes as encoding its wire dict, at the cost of
the record's own ids (every output carries the whole ``output_token_ids`` with parsers on)."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from worker.core.decoding import DecodeWindow
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
