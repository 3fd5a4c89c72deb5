"""vLLM 0.33.0's generate side: what ``/inference/v1/generate`` sends, in ``output_mode="tokens"``.

Logprobs are accepted in two wire forms and normalized to one: 0.33.0's integer
form (``token_id``) and the seed protocol's form, a ``ChatCompletionLogProbs``
whose ``token`` strings are ``token_id:N`` placeholders.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.bounds import Int64, NonNegativeInt64

_PLACEHOLDER_PREFIX = "token_id:"


def _token_id_from_placeholder(data: Any) -> Any:
    """Accept ``{"token": "token_id:N", ...}`` as ``{"token_id": N, ...}``."""
    if isinstance(data, dict) and "token_id" not in data:
        token = data.get("token")
        if isinstance(token, str) and token.startswith(_PLACEHOLDER_PREFIX):
            digits = token[len(_PLACEHOLDER_PREFIX) :]
            # More than 20 characters cannot be an int64; the field's bound rejects the rest.
            if not digits.lstrip("-").isdigit() or len(digits) > 20:
                raise ValueError(f"malformed logprob placeholder {token[:64]!r}: expected token_id:<int64>")
            converted = {k: v for k, v in data.items() if k not in ("token", "bytes")}
            converted["token_id"] = int(digits)
            return converted
    return data


class GenerateLogProb(BaseModel):
    """One candidate at one position."""

    token_id: Int64
    logprob: float
    rank: Int64 | None = None

    @model_validator(mode="before")
    @classmethod
    def _accept_placeholder(cls, data: Any) -> Any:
        return _token_id_from_placeholder(data)


class GenerateLogProbsContent(GenerateLogProb):
    """The sampled token at one position, then its candidates in engine order."""

    top_logprobs: list[GenerateLogProb] = Field(default_factory=list)


class GenerateLogProbs(BaseModel):
    content: list[GenerateLogProbsContent] | None = None


class UsageInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    prompt_tokens: Int64 = 0
    total_tokens: Int64 = 0
    completion_tokens: Int64 | None = 0
    prompt_tokens_details: dict[str, Any] | None = None
    completion_tokens_details: dict[str, Any] | None = None


class _ChoiceCommon(BaseModel):
    index: Int64
    stop_reason: Int64 | str | None = None
    """The stop string or token id that ended generation; None on EOS, length and abort."""
    token_ids: list[Int64] | None = None
    routed_experts: str | None = None
    sampling_mask: list[list[Int64]] | None = None
    weight_versions: list[dict[str, Any]] | None = None
    logprobs: GenerateLogProbs | None = None


class GenerateTokensChoice(_ChoiceCommon):
    """A complete output sequence. ``finish_reason`` defaults to ``"stop"`` as in the OpenAI spec."""

    finish_reason: str | None = "stop"

    @field_validator("token_ids")
    @classmethod
    def _no_negative_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(t < 0 for t in value):
            raise ValueError("token_ids must not contain negative values")
        return value


class GenerateTokensStreamChoice(_ChoiceCommon):
    """One streamed delta of one output sequence. Negative ids are accepted (vLLM decodes them as "")."""

    finish_reason: str | None = None


class _ResponseCommon(BaseModel):
    request_id: str = ""
    usage: UsageInfo | None = None
    prompt_token_ids: list[NonNegativeInt64] | None = None
    mm_placeholders: dict[str, list[dict[str, Any]]] | None = None
    metrics: dict[str, Any] | None = None


class GenerateTokensStreamResponse(_ResponseCommon):
    """One SSE chunk of ``/inference/v1/generate`` with ``stream=true``."""

    output_mode: Literal["tokens"] = "tokens"
    choices: list[GenerateTokensStreamChoice]


class GenerateTokensResponse(_ResponseCommon):
    """A complete ``/inference/v1/generate`` response."""

    output_mode: Literal["tokens"] = "tokens"
    model: str | None = None
    created: Int64 | None = None
    prompt_logprobs: list[dict[str, Any] | None] | None = None
    prompt_token_id_logprobs: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    choices: list[GenerateTokensChoice]


TokenIds = Annotated[list[NonNegativeInt64], Field(description="token ids")]
