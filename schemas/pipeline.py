"""The requests topic of the pipeline (``ingest`` reads it, ``gateway`` and ``produce`` write it).

Three kinds of record share it, all keyed by ``request_id``, so a request, its cancel and ingest's
markers for it land in one partition, in order:

* ``RequestEnvelope``: an OpenAI request to run.
* ``CancelRecord``: stop that request (its generation is aborted upstream).
* ``IngestMarker``: written by ``ingest`` itself, in the transaction that makes a request's first
  generated tokens visible (``started``) or its last ones (``done``), so a restarted ``ingest``
  knows which requests must not be generated again.

``ingest`` ends a request it cannot answer with an ``IngestErrorRecord`` on the output topic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.bounds import NonNegativeInt64
from schemas.envelope import MAX_REQUEST_ID_LENGTH, Endpoint, ErrorBody, Origin

_REQUEST_ID = Field(
    min_length=1, max_length=MAX_REQUEST_ID_LENGTH, description="Equals the Kafka record key; unique."
)


class RequestEnvelope(BaseModel):
    """One OpenAI request: a ``/v1/chat/completions`` or ``/v1/completions`` body, as a client sends it."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = _REQUEST_ID
    endpoint: Endpoint
    request: dict[str, Any] = Field(
        description=(
            "The OpenAI request body (ChatCompletionRequest / CompletionRequest). ingest sends it to "
            "vLLM's render endpoint unchanged and hands it to the worker as chat_request / "
            "completion_request. A completion with several prompts streams each prompt under "
            "request_id + '-' + prompt index (as vLLM's render names them)."
        )
    )
    deadline_ms: NonNegativeInt64 | None = Field(
        None,
        description=(
            "Unix time in milliseconds after which nobody waits for the answer: ingest ends a request "
            "still waiting for a stream slot then with a 504 error record, and aborts one still generating."
        ),
    )
    start_by_ms: NonNegativeInt64 | None = Field(
        None,
        description=(
            "Unix time in milliseconds after which the request is not started: ingest ends a request "
            "that has not begun generating by then (still in its backlog, or waiting for a stream slot) "
            "with a 504 error record; once generating it runs to its end. The gateway sets it on a "
            "stream, whose first record its client waits for no longer than the request timeout."
        ),
    )
    origin: Origin | None = Field(
        None,
        description=(
            "The API the request came in on when it is not chat or completions (the gateway's Messages, "
            "Responses and Batch routes set it); ingest carries it into the input envelopes and its "
            "error records."
        ),
    )


class CancelRecord(BaseModel):
    """Stop a request: ingest aborts its generation upstream, or never starts it."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = _REQUEST_ID
    cancel: Literal[True]


class IngestMarker(BaseModel):
    """ingest's own progress record for one request (see docs/pipeline.md, its resumability rule)."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = _REQUEST_ID
    ingest: Literal["started", "done"]


class IngestErrorRecord(BaseModel):
    """How ``ingest`` ends a request (or one stream of it) on the output topic.

    ``seq`` is the stream's next position, after every input envelope ingest sent for it, so a reader
    shows the outputs before it first. ``terminal`` says nothing of this stream comes after it: a
    reader ends the stream on it whatever its ``seq`` (an ingest that took over after a crash does not
    know how far the last one got, and writes ``seq`` 0).
    """

    model_config = ConfigDict(extra="forbid")

    request_id: str = _REQUEST_ID
    seq: NonNegativeInt64
    endpoint: Endpoint
    body: None = None
    error: ErrorBody
    terminal: Literal[True] = True
    origin: Origin | None = None
