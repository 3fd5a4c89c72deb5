"""The golden chat answers as the other APIs' converters get them, for the tests that compare ours with
vLLM's own converters (``tests/golden_apis/``): the chunks of every single-choice chat stream, the
completion of every single-choice chat answer that was not streamed.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from tests.golden_cases import GOLDEN_DIR, load_cases

JsonDict = dict[str, Any]
# A few streams are cut by an upstream error mid-way, each with another status.
ERROR_CODES = (503, 500, 400, 404, 429, 413, 401)


def _minimal(chunk: JsonDict) -> JsonDict:
    """What a Messages converter reads of a chat chunk."""
    out: JsonDict = {
        "id": chunk["id"],
        "object": "chat.completion.chunk",
        "created": 0,
        "model": chunk["model"],
        "choices": [
            {
                "index": c["index"],
                "delta": c["delta"],
                "finish_reason": c.get("finish_reason"),
                "stop_reason": c.get("stop_reason"),
            }
            for c in chunk["choices"]
        ],
    }
    if chunk.get("usage") is not None:
        out["usage"] = chunk["usage"]
    return out


@cache
def chat_streams() -> dict[str, tuple[list[JsonDict], JsonDict | None]]:
    """Per golden single-choice chat stream: its chunks as vLLM's chat server sends them for a Messages
    request (the role alone first, a usage chunk last), and for some an error that cuts it mid-way."""
    streams: dict[str, tuple[list[JsonDict], JsonDict | None]] = {}
    for case in load_cases(GOLDEN_DIR):
        first = case.input[0]
        if first.get("endpoint") != "chat" or any(e.get("error") for e in case.expected):
            continue
        if (first["body"].get("chat_request") or {}).get("n", 1) != 1 or not first["body"].get("stream"):
            continue
        chunks = [_minimal(e["body"]["chunk"]) for e in case.expected]
        if chunks[-1]["choices"]:
            prompt = first["body"].get("prompt_tokens") or len(first["body"].get("prompt_token_ids") or [])
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": len(chunks),
                "total_tokens": prompt + len(chunks),
            }
            chunks.append({**chunks[-1], "choices": [], "usage": usage})
        role_choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        role = {k: v for k, v in chunks[0].items() if k != "usage"}
        chunks = [{**role, "choices": [{**role_choice, "stop_reason": None}]}, *chunks]
        if len(streams) % 8 == 5:  # some report cached prompt tokens, which Anthropic counts apart
            details = {"cached_tokens": 2, "created_cache_tokens": 1}
            chunks[-1] = {**chunks[-1], "usage": {**chunks[-1]["usage"], "prompt_tokens_details": details}}
        name = f"{case.file}/{case.id}"
        streams[name] = (chunks, None)
        if len(streams) % 8 == 1:
            code = ERROR_CODES[len(streams) // 8 % len(ERROR_CODES)]
            cut = chunks[: max(2, len(chunks) // 2)]
            streams[f"{name} cut by {code}"] = (cut, {"code": code, "message": f"upstream failed ({code})"})
    return streams


@cache
def one_shots() -> dict[str, JsonDict]:
    """Per golden single-choice chat completion (not streamed): the completion."""
    out = {}
    for case in load_cases(GOLDEN_DIR):
        first = case.input[0]
        if first.get("endpoint") != "chat" or first["body"].get("stream") or case.expected[0].get("error"):
            continue
        if len(case.expected[0]["body"]["choices"]) == 1:
            out[f"{case.file}/{case.id}"] = case.expected[0]["body"]
    return out
