"""Building input envelopes for tests: split token ids into stream records."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import orjson

from worker.core.envelope_processor import ProcessResult

JsonDict = dict[str, Any]


def split(token_ids: Sequence[int], cuts: Sequence[int]) -> list[list[int]]:
    """``token_ids`` cut at the given positions (sorted, deduplicated, inside the list)."""
    points = sorted({c for c in cuts if 0 < c < len(token_ids)})
    bounds = [0, *points, len(token_ids)]
    return [list(token_ids[a:b]) for a, b in itertools.pairwise(bounds)]


def chat_stream(
    request_id: str,
    chunks: Sequence[Sequence[int]],
    *,
    prompt_token_ids: Sequence[int],
    finish_reason: str = "stop",
    chat_request: JsonDict | None = None,
    model: str = "test-model",
) -> list[JsonDict]:
    """One record per chunk; only the first carries the request context."""
    records = []
    for seq, chunk in enumerate(chunks):
        choice: JsonDict = {"index": 0, "token_ids": list(chunk)}
        if seq == len(chunks) - 1:
            choice["finish_reason"] = finish_reason
        body: JsonDict = {"stream": True, "generate_chunk": {"request_id": request_id, "choices": [choice]}}
        if seq == 0:
            body["model"] = model
            body["prompt_token_ids"] = list(prompt_token_ids)
            body["prompt_tokens"] = len(prompt_token_ids)
            body["chat_request"] = chat_request or {
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
            }
        records.append({"request_id": request_id, "seq": seq, "endpoint": "chat", "body": body})
    return records


def chat_one_shot(
    request_id: str,
    token_ids: Sequence[int],
    *,
    prompt_token_ids: Sequence[int],
    finish_reason: str = "stop",
    chat_request: JsonDict | None = None,
    model: str = "test-model",
) -> JsonDict:
    return {
        "request_id": request_id,
        "seq": 0,
        "endpoint": "chat",
        "body": {
            "model": model,
            "generate_response": {
                "request_id": request_id,
                "choices": [{"index": 0, "token_ids": list(token_ids), "finish_reason": finish_reason}],
            },
            "prompt_token_ids": list(prompt_token_ids),
            "prompt_tokens": len(prompt_token_ids),
            "chat_request": chat_request or {"model": model, "messages": [{"role": "user", "content": "hi"}]},
        },
    }


def written(result: ProcessResult) -> JsonDict:
    """An output as the worker writes it (its payload, decoded): a ``ProcessResult``'s ``output``
    holds the ``stream_state`` encoded (see ``ProcessResult.stream_state``)."""
    assert result.payload is not None
    decoded: JsonDict = orjson.loads(result.payload)
    return decoded
