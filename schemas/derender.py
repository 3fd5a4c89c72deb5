"""vLLM's derender bodies (0.33 and 0.34) and the per-sequence ``DerenderStreamState``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from schemas.bounds import Int64, NonNegativeInt64, PositiveInt64
from schemas.generate import GenerateTokensResponse, GenerateTokensStreamResponse
from schemas.openai import (
    ChatCompletionRequest,
    ChatCompletionStreamResponse,
    CompletionRequest,
    CompletionStreamResponse,
)

PREV_TOKENS_LIMIT = 1024
LOGPROB_CONTEXT_WINDOW = 4


class DerenderStreamState(BaseModel):
    """Everything needed to resume one sequence, as plain JSON.

    Plain path: ``prev_tokens`` (vLLM 0.33: token strings) or ``prev_token_ids`` (vLLM 0.34:
    token ids), with ``prefix_offset``/``read_offset``, are the bounded incremental-decode
    window; either form is read, and both together only when they hold the same window.
    Parser path: ``output_token_ids`` and
    ``output_chunk_lens`` let a fresh parser replay the sequence with the
    original chunking; ``tools_streamed`` and ``last_tool_call_ids`` keep the
    finish-reason rewrite and tool-call ids stable across a replay.
    """

    prev_tokens: list[str] | None = None
    prev_token_ids: list[NonNegativeInt64] | None = None
    prefix_offset: NonNegativeInt64 = 0
    read_offset: NonNegativeInt64 = 0
    role_sent: bool = False
    logprob_context_token_ids: list[Int64] = Field(default_factory=list, max_length=LOGPROB_CONTEXT_WINDOW)
    logprob_text_offset: NonNegativeInt64 = 0
    output_token_ids: list[Int64] = Field(default_factory=list)
    output_chunk_lens: list[PositiveInt64] = Field(default_factory=list)
    tools_streamed: bool = False
    last_tool_call_ids: list[str] = Field(default_factory=list)

    @field_validator("prev_tokens", "prev_token_ids")
    @classmethod
    def _bound_window(cls, value: list[str] | list[int] | None, info: ValidationInfo) -> object:
        if value is not None and len(value) > PREV_TOKENS_LIMIT:
            raise ValueError(f"{info.field_name} length ({len(value)}) exceeds maximum ({PREV_TOKENS_LIMIT})")
        return value

    @property
    def window_length(self) -> int:
        """The carried window's length (0 without one)."""
        window = self.prev_token_ids if self.prev_token_ids is not None else self.prev_tokens
        return len(window) if window is not None else 0

    @model_validator(mode="after")
    def _chunk_lens_cover_output(self) -> DerenderStreamState:
        total = sum(self.output_chunk_lens)
        if total != len(self.output_token_ids):
            raise ValueError(
                "output_chunk_lens must sum to len(output_token_ids) "
                f"(got sum={total}, len(output_token_ids)={len(self.output_token_ids)})"
            )
        return self

    @model_validator(mode="after")
    def _offsets_inside_window(self) -> DerenderStreamState:
        # Stricter than vLLM, which would silently drop text and emit a negative read_offset.
        if (
            self.prev_tokens is not None
            and self.prev_token_ids is not None
            and len(self.prev_tokens) != len(self.prev_token_ids)
        ):
            raise ValueError(
                "stream_state.prev_tokens and stream_state.prev_token_ids disagree "
                f"(lengths {len(self.prev_tokens)} and {len(self.prev_token_ids)}): send one window"
            )
        key = "prev_token_ids" if self.prev_token_ids is not None else "prev_tokens"
        if not self.prefix_offset <= self.read_offset <= self.window_length:
            raise ValueError(
                f"stream_state offsets must satisfy 0 <= prefix_offset <= read_offset <= len({key}) "
                f"(got prefix_offset={self.prefix_offset}, read_offset={self.read_offset}, "
                f"len({key})={self.window_length})"
            )
        return self


class DerenderChatRequest(BaseModel):
    """Body of ``/v1/chat/completions/derender`` with ``stream=false``."""

    stream: Literal[False] = False
    model: str | None = None
    generate_response: GenerateTokensResponse
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[NonNegativeInt64] | None = None
    chat_request: ChatCompletionRequest | None = None


class DerenderCompletionRequest(BaseModel):
    """Body of ``/v1/completions/derender`` with ``stream=false``: one response per prompt."""

    stream: Literal[False] = False
    model: str | None = None
    generate_responses: list[GenerateTokensResponse]
    prompt_tokens: list[Int64] | None = None
    prompt_token_ids: list[list[NonNegativeInt64] | None] | None = None
    completion_request: CompletionRequest | None = None

    @model_validator(mode="after")
    def _parallel_lists(self) -> DerenderCompletionRequest:
        n = len(self.generate_responses)
        if self.prompt_tokens is not None and len(self.prompt_tokens) != n:
            raise ValueError(
                f"prompt_tokens length ({len(self.prompt_tokens)}) must equal generate_responses length ({n})"
            )
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != n:
            raise ValueError(
                f"prompt_token_ids length ({len(self.prompt_token_ids)}) must equal "
                f"generate_responses length ({n})"
            )
        return self


class DerenderChatStreamRequest(BaseModel):
    """Body of ``/v1/chat/completions/derender`` with ``stream=true``: one generate chunk."""

    stream: Literal[True]
    model: str | None = None
    generate_chunk: GenerateTokensStreamResponse
    stream_state: DerenderStreamState | None = None
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[NonNegativeInt64] | None = None
    chat_request: ChatCompletionRequest | None = None


class DerenderCompletionStreamRequest(BaseModel):
    """Body of ``/v1/completions/derender`` with ``stream=true``: one generate chunk."""

    stream: Literal[True]
    model: str | None = None
    generate_chunk: GenerateTokensStreamResponse
    stream_state: DerenderStreamState | None = None
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[NonNegativeInt64] | None = None
    completion_request: CompletionRequest | None = None


class DerenderChatStreamResponse(BaseModel):
    chunk: ChatCompletionStreamResponse
    stream_state: DerenderStreamState


class DerenderCompletionStreamResponse(BaseModel):
    chunk: CompletionStreamResponse
    stream_state: DerenderStreamState


ChatBody = DerenderChatRequest | DerenderChatStreamRequest
CompletionBody = DerenderCompletionRequest | DerenderCompletionStreamRequest
