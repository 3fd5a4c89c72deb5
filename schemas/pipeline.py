"""The requests topic of the pipeline (``ingest`` reads it, ``gateway`` and ``produce`` write it).

Three kinds of record share it, all keyed by ``request_id``, so a request, its cancel and ingest's
markers for it land in one partition, in order:

* ``RequestEnvelope``: an OpenAI request to run.
* ``CancelRecord``: stop that request (its generation is aborted upstream).
* ``IngestMarker``: written by ``ingest`` itself, in the transaction that makes a request's first
  generated tokens visible (``started``) or its last ones (``done``), so a restarted ``ingest``
  knows which requests must not be generated again.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.envelope import MAX_REQUEST_ID_LENGTH, Endpoint

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
