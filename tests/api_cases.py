"""The golden tool-call generation as the other APIs' tests use it: chat chunks with a usage chunk."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.fake_vllm import Recording
from tests.pipeline_helpers import ONE_SHOT_CASE, STREAM_CASE, case, recording, reference_outputs, request_of

QUESTION = "What's the weather in Paris?"
# The golden case's tools: as chat tools, and as each API spells them.
CHAT_TOOLS: list[dict[str, Any]] = recording(STREAM_CASE).request["tools"]
ANTHROPIC_TOOLS: Any = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in CHAT_TOOLS
]
RESPONSES_TOOLS: Any = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]


def with_usage(base: Recording) -> Recording:
    """``base`` with the usage chunk vLLM sends last when asked for usage (the recording has none)."""
    prompt = base.prompt_token_ids[0]
    completion = sum(len(c.get("token_ids") or []) for chunk in base.chunks[0] for c in chunk["choices"])
    usage = {
        "prompt_tokens": len(prompt),
        "completion_tokens": completion,
        "total_tokens": len(prompt) + completion,
    }
    return dataclasses.replace(base, chunks=[[*base.chunks[0], {"choices": [], "usage": usage}]])


def stream_recording() -> Recording:
    return with_usage(recording(STREAM_CASE))


def golden_chunks() -> list[dict[str, Any]]:
    """The chat chunks the worker writes for the golden stream, usage chunk last."""
    rec = stream_recording()
    outputs = reference_outputs(rec, request_of(rec, stream_options={"include_usage": True}))
    return [o["body"]["chunk"] for o in outputs]


def golden_completion() -> dict[str, Any]:
    """The chat completion the worker writes for the golden one-shot request."""
    body: dict[str, Any] = case(ONE_SHOT_CASE).expected[0]["body"]
    return body
