"""Bounded memory: caps on the open requests and their state bytes, per worker (all partitions).

What is counted: every open streamed request (``EnvelopeProcessor.requests``) and its *state
bytes*, the size of its live records in the state topic: its context record plus its latest
progress record, if any (``state_store``; free at commit time since the records are encoded
anyway; after a restore, the size of the merged records read back until the context record is
rewritten), or the size of the record that opened it until its first commit. That is what a
restore reads back; the live Python objects (and a live parser) take a few times as much, which
the default caps leave room for.

When a cap is reached, a record that would open a **new** request is not processed: it gets an
error output (code 503, ``ServiceUnavailableError``, naming the cap and its value), so the client
learns of it and nothing is lost silently. Records of requests already open are processed as
usual, so they finish and free room. ``derender.requests.rejected{cap=...}`` counts the refusals.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from schemas.envelope import InputEnvelope
from worker.core.envelope_processor import EnvelopeProcessor

log = logging.getLogger(__name__)

OPEN_REQUESTS = "open_requests"  # label values of m.REQUESTS_REJECTED
STATE_BYTES = "state_bytes"


@dataclass(frozen=True, slots=True)
class Refusal:
    cap: str  # OPEN_REQUESTS or STATE_BYTES
    message: str


class MemoryBudget:
    """The worker-wide tally the partition tasks add to and release from; 0 turns a cap off."""

    def __init__(self, max_open_requests: int = 0, max_state_bytes: int = 0) -> None:
        self.max_open_requests = max_open_requests
        self.max_state_bytes = max_state_bytes
        self.open_requests = 0
        self.state_bytes = 0
        self._full = False  # for logging the transitions only

    def add(self, size: int) -> None:
        self.open_requests += 1
        self.state_bytes += size

    def resize(self, old: int, new: int) -> None:
        self.state_bytes += new - old

    def remove(self, size: int) -> None:
        self.open_requests -= 1
        self.state_bytes -= size

    def refusal(self, new_bytes: int) -> Refusal | None:
        """Why a new request of about ``new_bytes`` must be refused now, or ``None``."""
        refusal = None
        if self.max_open_requests and self.open_requests >= self.max_open_requests:
            refusal = Refusal(
                OPEN_REQUESTS,
                f"the worker is at its cap of {self.max_open_requests} open requests "
                f"(--max-open-requests); retry once some have finished",
            )
        elif self.max_state_bytes and self.state_bytes + new_bytes > self.max_state_bytes:
            refusal = Refusal(
                STATE_BYTES,
                f"the worker is at its cap of {self.max_state_bytes} state bytes for open requests "
                f"(--max-state-bytes; {self.state_bytes} in use); retry once some have finished",
            )
        if (refusal is not None) != self._full:
            self._full = refusal is not None
            if refusal is not None:
                log.warning("memory cap reached, refusing new requests: %s", refusal.message)
            else:
                log.info("below the memory caps again: accepting new requests")
        return refusal


def new_stream_request(value: bytes, key: bytes | None, processor: EnvelopeProcessor) -> InputEnvelope | None:
    """The envelope if ``value`` is a valid streamed record of a request not open yet, else ``None``.

    Only called while a cap is reached, so the second parse costs nothing in normal operation.
    Anything the processor would reject (bad JSON, key mismatch, not an envelope) returns ``None``
    so the processor rejects it as usual (a dead letter holds no state).
    """
    if key is not None and processor.is_open(key.decode("utf-8", errors="replace")):
        return None  # records are keyed by request_id: the common case needs no parse
    if len(value) > processor.max_record_bytes:
        return None
    try:
        data = orjson.loads(value)
        if not isinstance(data, dict):
            return None
        envelope = InputEnvelope.model_validate(data)
    except (orjson.JSONDecodeError, ValidationError):
        return None
    if key is not None and key != envelope.request_id.encode("utf-8"):
        return None
    if envelope.body.get("stream") is not True or processor.is_open(envelope.request_id):
        return None  # a one-shot request holds no state after its record
    return envelope


def refusal_output(envelope: InputEnvelope, refusal: Refusal) -> dict[str, Any]:
    """The error output of a refused record, shaped like the core's other error outputs."""
    return {
        "request_id": envelope.request_id,
        "seq": envelope.seq,
        "endpoint": envelope.endpoint,
        "error": {
            "message": refusal.message,
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        },
    }
