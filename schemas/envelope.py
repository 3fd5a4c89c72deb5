"""Envelope version 1: one Kafka record value, or one line of a JSON Lines file.

An input envelope wraps one vLLM derender request body; the output envelope
for it carries exactly what vLLM returns for that body, or vLLM's error body.
A record that is not a valid input envelope goes to the dead-letter output as
a ``DeadLetterRecord``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.bounds import NonNegativeInt64

ENVELOPE_VERSION = 1
MAX_REQUEST_ID_LENGTH = 512

Endpoint = Literal["chat", "completion"]
Api = Literal["messages", "responses", "batch"]


class Origin(BaseModel):
    """Which of the gateway's other APIs a chat request came in on, and that API's own id for it.

    The topics carry chat envelopes whatever the API; this names the Anthropic message, the OpenAI
    response, or the batch and line that a reader (``consume --assemble``, ``audit``) should show.
    """

    model_config = ConfigDict(extra="forbid")

    api: Api = Field(description="messages (Anthropic Messages), responses (OpenAI Responses) or batch.")
    id: str = Field(
        min_length=1,
        max_length=MAX_REQUEST_ID_LENGTH,
        description=(
            "The gateway's message id (msg_...; the Message's id ends with it), the response id (resp_...) "
            "or the batch id (batch_...)."
        ),
    )
    line: NonNegativeInt64 | None = Field(
        default=None, description="A batch request's line in the batch's input file (from 0)."
    )


_ORIGIN_DESCRIPTION = (
    "Set by ingest on each stream's first record (and on a one-shot record) of a request that came in "
    "on another API; the worker copies it to that record's output envelope. Absent for chat and "
    "completions requests and in records written before it existed."
)


class InputEnvelope(BaseModel):
    """One generate chunk (stream) or one complete generate response (one-shot) of one request."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(
        min_length=1, max_length=MAX_REQUEST_ID_LENGTH, description="Equals the Kafka record key."
    )
    seq: NonNegativeInt64 = Field(description="Position of this record in its request's stream: 0, 1, 2, ...")
    endpoint: Endpoint
    body: dict[str, Any] = Field(
        description=(
            "A vLLM derender request body exactly as vLLM's HTTP endpoint accepts it: "
            "DerenderChatStreamRequest / DerenderCompletionStreamRequest (stream=true) or "
            "DerenderChatRequest / DerenderCompletionRequest. In a stream record, model, prompt_tokens, "
            "prompt_token_ids and chat_request / completion_request may be left out after the first "
            "record; stream_state may be null to use the state the worker holds."
        )
    )
    origin: Origin | None = Field(default=None, description=_ORIGIN_DESCRIPTION)


class CloseRecord(BaseModel):
    """The request's producer ended it (``ingest`` after an error, a cut stream, a refused record):
    the worker drops its state now, writes nothing, and treats later records of it as duplicates.
    Without it the state waits for ``--request-ttl-s``."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(
        min_length=1, max_length=MAX_REQUEST_ID_LENGTH, description="Equals the Kafka record key."
    )
    close: Literal[True]


class SourcePosition(BaseModel):
    topic: str
    partition: int
    offset: int


class ErrorBody(BaseModel):
    """vLLM's error object; ``code`` is the HTTP status vLLM answers with."""

    message: str
    type: str
    param: str | None = None
    code: int


class OutputEnvelope(BaseModel):
    """The answer to one input envelope: ``body`` or ``error``, never both."""

    request_id: str
    seq: NonNegativeInt64
    endpoint: Endpoint
    body: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Stream records: {chunk, stream_state}. One-shot records: the chat.completion or "
            "text_completion object."
        ),
    )
    error: ErrorBody | None = None
    source: SourcePosition | None = Field(default=None, description="Present only when read from Kafka.")
    origin: Origin | None = Field(
        default=None, description="The input record's own ``origin``, when it has one."
    )


class DeadLetterRecord(BaseModel):
    """A record that was not a valid input envelope, with why."""

    reason: str
    original: str = Field(
        description=(
            "The record value (only its first bytes when truncated): UTF-8 text, or base64 when it is "
            "not valid UTF-8 or when base64 is the shorter JSON string (e.g. many NUL bytes)."
        )
    )
    original_encoding: Literal["utf-8", "base64"] = "utf-8"
    original_size: NonNegativeInt64 | None = Field(
        default=None, description="Size of the whole record value in bytes."
    )
    original_sha256: str | None = Field(
        default=None, description="SHA-256 of the whole record value, lowercase hex."
    )
    truncated: bool = Field(
        default=False,
        description=(
            "The dead letter did not fit under the worker's output limit: original holds only the "
            "value's first bytes (or the key or headers were cut). It cannot be re-driven as is."
        ),
    )
    key: str | None = None
    headers: list[tuple[str, str] | tuple[str, str, Literal["base64"]]] = Field(
        default_factory=list,
        description=(
            "The record's Kafka headers in order: [name, value] when the value is UTF-8, else "
            '[name, base64 of the value, "base64"].'
        ),
    )
    source: SourcePosition | None = None
