"""Bounded memory: caps on the open requests and their live memory, per worker (all partitions).

What is counted (``--max-state-bytes``): the *live* bytes of every open streamed request
(``EnvelopeProcessor.requests``), estimated from what it holds in memory (``request_live_bytes``:
its prompt ids as Python ints, its request, each choice's decode window and output ids), plus
each processor's memory of closed requests (``closed_live_bytes``). Serialized sizes undercount
these several times (a prompt id is ~7 bytes of JSON but ~40 bytes of Python int and list slot).
The estimate is updated after every record of the request, in O(its choices), and checked
against measured allocations in ``tests/test_runtime_memory.py`` (within a factor of two).

Live parser sessions (~30 KB each, ``LIVE_PARSER_BYTES``) are capped by count instead, in the
worker-wide pool (``--max-live-parsers``, ``worker.core.live_parsers``): past the cap the least
recently used one is evicted and rebuilt by replay on use, which costs time, never correctness.
So the request memory of a worker is at most about ``--max-state-bytes`` plus
``--max-live-parsers`` x ``LIVE_PARSER_BYTES``, plus one record in flight; ``./run bench flood``
shows the defaults shipped in ``deploy/`` fitting their pod limit.

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

from schemas.envelope import InputEnvelope
from worker.core.envelope_processor import EnvelopeProcessor, RequestContext

log = logging.getLogger(__name__)

OPEN_REQUESTS = "open_requests"  # label values of m.REQUESTS_REJECTED
STATE_BYTES = "state_bytes"

# Live bytes per item, measured with tracemalloc on CPython 3.11 (tests/test_runtime_memory.py).
REQUEST_BASE_BYTES = 6_000  # the context, its dicts, the request model's fixed part
INT_BYTES = 40  # a list slot and its int object (ids are past the small-int cache)
WINDOW_TOKEN_BYTES = 120  # a decode-window token string and its slot
LIVE_PARSER_BYTES = 32 * 1024  # a parser session with its own window
CLOSED_ENTRY_BYTES = 200  # one remembered closed request (for duplicate detection)
# A record that would open a request: its live form takes up to this many times its JSON size.
OPENING_FACTOR = 6


def request_live_bytes(ctx: RequestContext, request_bytes: int) -> int:
    """Estimated live bytes of an open request; ``request_bytes``: its request's JSON size."""
    size = REQUEST_BASE_BYTES + request_bytes
    prompt = ctx.inherited.get("prompt_token_ids")
    if isinstance(prompt, list):
        size += INT_BYTES * len(prompt)
    for state in ctx.sequences.values():
        size += WINDOW_TOKEN_BYTES * len(state.window.tokens)
        size += INT_BYTES * (
            len(state.output_token_ids) + len(state.output_chunk_lens) + len(state.logprob_context_token_ids)
        )
    return size


def closed_live_bytes(processor: EnvelopeProcessor) -> int:
    """A processor's memory of closed requests (bounded by the core; counted here)."""
    return CLOSED_ENTRY_BYTES * len(getattr(processor, "_closed", ()))


class LiveEstimator:
    """``request_live_bytes`` per request, with each request object's JSON size computed once."""

    def __init__(self) -> None:
        self._requests: dict[str, tuple[Any, int]] = {}

    def estimate(self, rid: str, ctx: RequestContext) -> int:
        raw = ctx.request_raw
        known = self._requests.get(rid)
        if known is None or known[0] is not raw:
            known = self._requests[rid] = (raw, _json_size(raw))
        return request_live_bytes(ctx, known[1])

    def forget(self, rid: str) -> None:
        self._requests.pop(rid, None)


def _json_size(value: Any) -> int:
    if value is None:
        return 0
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):  # too deep or too big an int: count it large
        return 1024 * 1024


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
        self.state_bytes = 0  # estimated live bytes of open requests and of closed-request memory
        self._full = False  # for logging the transitions only

    def resize_closed(self, old: int, new: int) -> None:
        """A processor's closed-request memory changed (not an open request)."""
        self.state_bytes += new - old

    def add(self, size: int) -> None:
        self.open_requests += 1
        self.state_bytes += size

    def resize(self, old: int, new: int) -> None:
        self.state_bytes += new - old

    def remove(self, size: int) -> None:
        self.open_requests -= 1
        self.state_bytes -= size

    def refusal(self, record_bytes: int) -> Refusal | None:
        """Why a new request opened by a record of ``record_bytes`` must be refused now, or ``None``."""
        new_bytes = REQUEST_BASE_BYTES + OPENING_FACTOR * record_bytes
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
                f"the worker is at its cap of {self.max_state_bytes} bytes of live request state "
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
    """The envelope if ``value`` would open a new streamed request (``EnvelopeProcessor.would_open``).

    Only called while a cap is reached, so its parse costs nothing in normal operation.
    """
    return processor.would_open(value, key)


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
