"""Streamed chunks vLLM 0.33.0 leaves unbounded get a 400, so a record's work stays O(its tokens).

Completion deltas are bounded by ``max_model_len`` like chat's, logprob positions by the
record's own tokens, candidates by ``--max-logprobs``; the stream goes on afterwards.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.golden_cases import derenderer_for, sample_config
from worker.core.envelope_processor import EnvelopeProcessor

PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
CONFIG = sample_config(max_model_len=64, max_logprobs=5)
JsonDict = dict[str, Any]


def _record(endpoint: str, choice: JsonDict, seq: int = 0, rid: str = "r") -> bytes:
    body: JsonDict = {"stream": True, "generate_chunk": {"request_id": rid, "choices": [choice]}}
    if seq == 0:
        body |= {"model": "test-model", "prompt_token_ids": PROMPT, "prompt_tokens": len(PROMPT)}
        if endpoint == "chat":
            body["chat_request"] = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
        else:
            body["completion_request"] = {"model": "test-model", "prompt": "hi"}
    return orjson.dumps({"request_id": rid, "seq": seq, "endpoint": endpoint, "body": body})


def _entry(token_id: int, candidates: int) -> JsonDict:
    tops = [{"token_id": token_id + i, "logprob": -1.0 - i} for i in range(candidates)]
    return {"token_id": token_id, "logprob": -0.5, "top_logprobs": tops}


def _error(processor: EnvelopeProcessor, value: bytes) -> JsonDict | None:
    result = processor.process(value)
    assert result.output is not None
    error: JsonDict | None = result.output.get("error")
    return error


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_a_delta_past_max_model_len_is_a_400(endpoint: str) -> None:
    processor = EnvelopeProcessor(derenderer_for(CONFIG), max_record_bytes=1 << 20)
    room = 64 - len(PROMPT)
    error = _error(processor, _record(endpoint, {"index": 0, "token_ids": [9707] * (room + 1)}))
    assert error is not None and error["code"] == 400
    assert "max_model_len (64)" in error["message"]
    # Exactly at the bound is fine, and the request goes on.
    fresh = EnvelopeProcessor(derenderer_for(CONFIG), max_record_bytes=1 << 20)
    assert _error(fresh, _record(endpoint, {"index": 0, "token_ids": [9707] * room})) is None
    assert (
        _error(fresh, _record(endpoint, {"index": 0, "token_ids": [0], "finish_reason": "stop"}, seq=1))
        is None
    )


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_more_logprob_positions_than_tokens_is_a_400(endpoint: str) -> None:
    processor = EnvelopeProcessor(derenderer_for(CONFIG), max_record_bytes=1 << 20)
    assert _error(processor, _record(endpoint, {"index": 0, "token_ids": [9707]})) is None
    logprobs = {"content": [_entry(9707, 1) for _ in range(3)]}
    error = _error(
        processor, _record(endpoint, {"index": 0, "token_ids": [0, 0], "logprobs": logprobs}, seq=1)
    )
    assert error is not None and error["code"] == 400
    assert "exceeds its token_ids length (2)" in error["message"]
    # One position per token is what generate sends: accepted, and the stream goes on.
    ok = {"content": [_entry(0, 1), _entry(0, 1)]}
    assert (
        _error(processor, _record(endpoint, {"index": 0, "token_ids": [0, 0], "logprobs": ok}, seq=2)) is None
    )


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_more_candidates_than_max_logprobs_is_a_400(endpoint: str) -> None:
    processor = EnvelopeProcessor(derenderer_for(CONFIG), max_record_bytes=1 << 20)
    too_many = {"content": [_entry(9707, 6)]}
    error = _error(processor, _record(endpoint, {"index": 0, "token_ids": [9707], "logprobs": too_many}))
    assert error is not None and error["code"] == 400
    assert "exceeds max_logprobs (5)" in error["message"]
    fresh = EnvelopeProcessor(derenderer_for(CONFIG), max_record_bytes=1 << 20)
    at_bound = {"content": [_entry(9707, 5)]}
    assert _error(fresh, _record(endpoint, {"index": 0, "token_ids": [9707], "logprobs": at_bound})) is None
