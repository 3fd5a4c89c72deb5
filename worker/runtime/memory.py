"""Bounded memory: caps on the open requests and their live memory, per worker (all partitions).

What is counted (``--max-state-bytes``): the *live* bytes of every open streamed request, the
core's estimate of what it holds in memory (``RequestContext.live_bytes``: its prompt ids as Python
ints, its request with its structure, each choice's decode window and output ids), plus each
processor's memory of closed requests (``EnvelopeProcessor.closed_live_bytes``). Serialized
sizes undercount these several times (a prompt id is ~7 bytes of JSON but ~36 bytes of Python
int and list slot). An owned partition updates its requests' share after every record (``OwnedPartition``).

Live parser sessions (~32 KB each, ``LIVE_PARSER_BYTES``) are capped by count instead, in the
worker-wide pool (``--max-live-parsers``, ``worker.core.live_parsers``): past the cap the least
recently used one is evicted and rebuilt by replay on use, which costs time, never correctness.
So the request memory of a worker is at most about ``--max-state-bytes`` plus
``--max-live-parsers`` x ``LIVE_PARSER_BYTES``, plus one record in flight; ``./run bench flood``
shows the defaults shipped in ``deploy/`` fitting their pod limit.

When a cap is reached, a record that would open a **new** request is not processed: the core asks
``MemoryBudget.refusal`` (its ``Admission``) in its one parse of the record and answers with an
error output (code 503, ``ServiceUnavailableError``, naming the cap and its value), so the client
learns of it and nothing is lost silently. Records of requests already open are processed as
usual, so they finish and free room. ``derender.requests.rejected{cap=...}`` counts the refusals.
"""

from __future__ import annotations

import logging

from worker.core.envelope_processor import Refusal

log = logging.getLogger(__name__)

OPEN_REQUESTS = "open_requests"  # label values of m.REQUESTS_REJECTED
STATE_BYTES = "state_bytes"

# A record that would open a request: a context's fixed part, and its live form takes up to this
# many times its JSON size (measured with tracemalloc, tests/runtime/test_memory.py).
REQUEST_BASE_BYTES = 6_000
OPENING_FACTOR = 6


class MemoryBudget:
    """The worker-wide tally the owned partitions add to and release from; 0 turns a cap off."""

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
