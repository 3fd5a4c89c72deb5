"""Integer-id generate logprobs to OpenAI chat and completion logprobs.

The generate server has no tokenizer, so the strings and bytes are filled in
here. A token that decodes to U+FFFD alone (one byte of a multi-byte
character, byte-fallback) is repaired from up to four preceding sampled ids:
the partial tokens report ``""`` and the one that completes the character
reports all of it, also across records, since the state carries those ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemas.derender import LOGPROB_CONTEXT_WINDOW
from schemas.generate import GenerateLogProbs
from schemas.openai import ChatCompletionRequest, CompletionRequest
from worker.core.decoding import REPLACEMENT_CHAR, TextDecoder

JsonDict = dict[str, Any]


def chat_top_limit(request: ChatCompletionRequest | None) -> int | None:
    """How many candidates per position ``/v1/chat/completions`` keeps; None keeps all.

    Without a request, or one that does not ask for logprobs, every candidate generate
    returned is passed through.
    """
    if request is None or not request.logprobs:
        return None
    if request.logprob_token_ids or request.top_logprobs == -1:
        return None
    return request.top_logprobs or 0


def completion_top_limit(request: CompletionRequest | None) -> int | None:
    """``/v1/completions`` keeps ``logprobs + 1`` candidates; None keeps all."""
    if request is None or request.logprob_token_ids or request.logprobs is None or request.logprobs == -1:
        return None
    return max(request.logprobs + 1, 0)


def context_tail(context: Sequence[int], delta_token_ids: Sequence[int]) -> list[int]:
    """The sampled ids the next record's repair may look back at."""
    return [*context, *delta_token_ids][-LOGPROB_CONTEXT_WINDOW:]


def _repair(decoder: TextDecoder, token_id: int, context: list[int]) -> str:
    """The text ``token_id`` adds after ``context``, or "" while the character is still partial."""
    for width in range(1, min(len(context), LOGPROB_CONTEXT_WINDOW) + 1):
        window = context[-width:]
        full = decoder.decode([*window, token_id])
        if full.endswith(REPLACEMENT_CHAR):
            continue
        # Trailing context tokens that are themselves partial belong to this character.
        clean_end = len(window)
        for j in range(len(window) - 1, -1, -1):
            if decoder.decode([window[j]]).endswith(REPLACEMENT_CHAR):
                clean_end = j
            else:
                break
        prefix = decoder.decode(window[:clean_end]) if clean_end > 0 else ""
        if full.startswith(prefix):
            return full[len(prefix) :]
        common = 0
        for a, b in zip(prefix, full, strict=False):
            if a != b:
                break
            common += 1
        return full[common:]
    return ""


def resolve_chat_logprobs(
    decoder: TextDecoder,
    logprobs: GenerateLogProbs,
    *,
    context: Sequence[int] = (),
    top_limit: int | None,
    as_token_ids: bool = False,
) -> JsonDict:
    """The ``ChatCompletionLogProbs`` dict for one choice's logprobs; ``as_token_ids``
    (``return_tokens_as_token_ids``, vLLM 0.34) names each token ``token_id:N``, without bytes."""
    if logprobs.content is None:
        return {"content": None}
    history = list(context)
    content: list[JsonDict] = []
    for entry in logprobs.content:
        tops = entry.top_logprobs if top_limit is None else entry.top_logprobs[:top_limit]
        ids = [entry.token_id, *(t.token_id for t in tops)]
        decoded = (
            [(token_id_placeholder(i), None) for i in ids] if as_token_ids else decoder.token_strings(ids)
        )
        token, token_bytes = decoded[0]
        if token.endswith(REPLACEMENT_CHAR):
            token = _repair(decoder, entry.token_id, history)
            token_bytes = list(token.encode("utf-8"))
        resolved_tops: list[JsonDict] = []
        for top, (top_str, top_bytes) in zip(tops, decoded[1:], strict=True):
            if top_str.endswith(REPLACEMENT_CHAR):
                top_str = _repair(decoder, top.token_id, history)
                top_bytes = list(top_str.encode("utf-8"))
            resolved_tops.append({"token": top_str, "logprob": top.logprob, "bytes": top_bytes})
        content.append(
            {"token": token, "logprob": entry.logprob, "bytes": token_bytes, "top_logprobs": resolved_tops}
        )
        history.append(entry.token_id)
    return {"content": content}


def token_id_placeholder(token_id: int) -> str:
    """A logprob token's text under ``return_tokens_as_token_ids``."""
    return f"token_id:{token_id}"


def decode_prompt_logprobs(
    decoder: TextDecoder, value: list[dict[str, Any] | None] | None
) -> list[dict[str, Any] | None] | None:
    """Prompt logprobs with every null ``decoded_token`` filled in (vLLM 0.34: a tokens-only
    generate server sends none): each id decoded alone, and one that decodes to U+FFFD repaired
    from the prompt ids before it (each earlier position's first id), as output logprobs are."""
    if value is None:
        return None
    out: list[dict[str, Any] | None] = []
    history: list[int] = []
    for position in value:
        if not position:
            out.append(position)
            continue
        filled: dict[str, Any] = {}
        for key, entry in position.items():
            token_id = _token_id(key)
            if token_id is not None and (not isinstance(entry, dict) or entry.get("decoded_token") is None):
                text = decoder.token_strings([token_id])[0][0]
                if text.endswith(REPLACEMENT_CHAR):
                    text = _repair(decoder, token_id, history)
                base = entry if isinstance(entry, dict) else {"logprob": entry}
                entry = {**base, "decoded_token": text}
            filled[key] = entry
        out.append(filled)
        first = _token_id(next(iter(position)))
        if first is not None:
            history.append(first)
    return out


def _token_id(key: str) -> int | None:
    """A prompt logprob key as an id (vLLM's model holds int keys), None for one that is not."""
    try:
        return int(key)
    except ValueError:
        return None


def to_completion_logprobs(chat: JsonDict, source: GenerateLogProbs, text_offset: int = 0) -> JsonDict:
    """Chat-shaped logprobs to the parallel lists of ``/v1/completions``.

    ``text_offset`` starts at ``text_offset`` so streamed offsets stay absolute.
    A position whose source had no candidates reports ``None`` in ``top_logprobs``.
    """
    content = chat.get("content")
    if content is None:
        return {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    offsets: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    tops: list[dict[str, float] | None] = []
    offset = text_offset
    for entry, src in zip(content, source.content or (), strict=False):
        offsets.append(offset)
        tokens.append(entry["token"])
        token_logprobs.append(entry["logprob"])
        tops.append({t["token"]: t["logprob"] for t in entry["top_logprobs"]} if src.top_logprobs else None)
        offset += len(entry["token"])
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": tops}
