"""The OpenAI objects derender returns, as vLLM 0.33.0 serializes them: same keys, same order, same nulls.

Built as plain dicts (the per-token hot path); ``schemas.openai`` holds the matching models
and the tests check the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemas.bounds import INT64_MAX, INT64_MIN
from schemas.derender import DerenderChatStreamRequest, DerenderCompletionStreamRequest
from schemas.generate import UsageInfo
from schemas.openai import ChatCompletionRequest, NamedToolChoice
from worker.core.parsing import DeltaOut
from worker.errors import RequestError

JsonDict = dict[str, Any]


def ids_if(wanted: bool, ids: Sequence[int] | None) -> list[int] | None:
    """A copy of ``ids`` when the request asked for token ids, else null."""
    return list(ids) if wanted and ids is not None else None


def usage(prompt_tokens: int, completion_tokens: int, *, omit_null_details: bool) -> JsonDict:
    """``omit_null_details``: vLLM 0.34 leaves ``prompt_tokens_details`` out while it is null."""
    total = prompt_tokens + completion_tokens
    if not INT64_MIN <= total <= INT64_MAX:  # each count fits; their sum must be writable too
        raise RequestError(f"token counts add up to {total}, past the 64-bit range", param="usage")
    built: JsonDict = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": total,
        "completion_tokens": completion_tokens,
    }
    if not omit_null_details:
        built["prompt_tokens_details"] = None
    built["completion_tokens_details"] = None
    return built


def chunk_usage(
    reported: UsageInfo | None, prompt_tokens: int | None, *, omit_null_details: bool
) -> JsonDict | None:
    """A chunk's usage: the generate chunk's, with a request-level prompt count overriding its own."""
    if reported is None:
        return None
    prompt = prompt_tokens if prompt_tokens is not None else (reported.prompt_tokens or 0)
    return usage(prompt, reported.completion_tokens or 0, omit_null_details=omit_null_details)


def one_shot_prompt_tokens(given: int | None, reported: UsageInfo | None, *, from_usage: bool) -> int:
    """A one-shot response's prompt count: the request's (0 included), else (vLLM 0.34,
    ``from_usage``) the generate response's ``usage.prompt_tokens``, else 0."""
    if given is not None:
        return given
    if from_usage and reported is not None:
        return reported.prompt_tokens or 0
    return 0


def resolve_finish_reason(
    finish_reason: str | None, request: ChatCompletionRequest | None, tool_calls: bool
) -> str:
    reason = finish_reason or "stop"
    named = request is not None and isinstance(request.tool_choice, NamedToolChoice)
    if tool_calls and reason == "stop" and not named:
        return "tool_calls"
    return reason


def message(
    content: str | None,
    reasoning: str | None = None,
    tool_calls: list[JsonDict] | None = None,
    *,
    omit_null_details: bool,
) -> JsonDict:
    """A one-shot chat choice's ``message``; ``omit_null_details``: vLLM 0.34 leaves the null
    ``annotations`` out."""
    built: JsonDict = {"role": "assistant", "content": content, "refusal": None}
    if not omit_null_details:
        built["annotations"] = None
    built["audio"] = None
    built["function_call"] = None
    if tool_calls:
        built["tool_calls"] = tool_calls
    built["reasoning"] = reasoning
    return built


def prompt_logprobs(value: list[dict[str, Any] | None] | None) -> list[dict[str, Any] | None] | None:
    """vLLM re-validates each entry as a ``Logprob``, so missing fields come back as null."""
    if value is None:
        return None
    out: list[dict[str, Any] | None] = []
    for position in value:
        if position is None:
            out.append(None)
            continue
        out.append(
            {
                str(token): {
                    "logprob": entry.get("logprob") if isinstance(entry, dict) else entry,
                    "rank": entry.get("rank") if isinstance(entry, dict) else None,
                    "decoded_token": entry.get("decoded_token") if isinstance(entry, dict) else None,
                }
                for token, entry in position.items()
            }
        )
    return out


def plain_delta(text: str) -> JsonDict:
    """A chat chunk's ``delta`` without a parser (``role`` is set by the caller on the first one)."""
    return {"role": None, "content": text or None, "reasoning": None}


def parsed_delta(parsed: DeltaOut | None) -> JsonDict:
    """A parser's delta as vLLM serializes ``DeltaMessage`` (no ``tool_calls`` key when empty)."""
    if parsed is None:
        return {"role": None, "content": None, "reasoning": None}
    delta: JsonDict = {"role": None, "content": parsed.content, "reasoning": parsed.reasoning}
    if parsed.tool_calls:
        delta["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type,
                "index": call.index,
                "function": (
                    None
                    if call.function is None
                    else {"name": call.function.name, "arguments": call.function.arguments}
                ),
            }
            for call in parsed.tool_calls
        ]
    return delta


def chat_stream_choice(
    index: int,
    delta: JsonDict,
    logprobs: JsonDict | None,
    finish_reason: str | None,
    stop_reason: int | str | None,
    token_ids: list[int] | None,
) -> JsonDict:
    return {
        "index": index,
        "delta": delta,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": token_ids,
        "weight_versions": None,
    }


def _stream_chunk(
    body: DerenderChatStreamRequest | DerenderCompletionStreamRequest,
    obj: str,
    model: str,
    created: int,
    choices: list[JsonDict],
    omit_null_details: bool,
    extra: JsonDict,
) -> JsonDict:
    """One streamed chunk; ``extra`` holds the fields only one endpoint has, in vLLM's order."""
    gen = body.generate_chunk
    return {
        "id": gen.request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": choices,
        "usage": chunk_usage(gen.usage, body.prompt_tokens, omit_null_details=omit_null_details),
        "system_fingerprint": None,
        **extra,
        "metrics": gen.metrics,
        "kv_transfer_params": None,
    }


def chat_chunk(
    body: DerenderChatStreamRequest,
    model: str,
    created: int,
    choices: list[JsonDict],
    *,
    omit_null_details: bool,
) -> JsonDict:
    request = body.chat_request
    prompt_ids = ids_if(
        request is not None and bool(request.return_token_ids), body.generate_chunk.prompt_token_ids
    )
    extra: JsonDict = {"prompt_token_ids": prompt_ids, "prompt_text": None}
    return _stream_chunk(body, "chat.completion.chunk", model, created, choices, omit_null_details, extra)


def completion_chunk(
    body: DerenderCompletionStreamRequest,
    model: str,
    created: int,
    choices: list[JsonDict],
    *,
    omit_null_details: bool,
) -> JsonDict:
    return _stream_chunk(body, "text_completion", model, created, choices, omit_null_details, {})
