"""The live parser sessions kept between records, capped; shared by every processor of a worker.

A live parser session makes a record cost O(delta) instead of a replay of the whole output
(``SequenceState.live``), but takes tens of KB. ``--max-live-parsers`` caps how many are kept,
per pool; the Kafka worker gives all its partition processors one pool, so the cap is
worker-wide. An evicted session is rebuilt by replay on the sequence's next record (the output
stays identical; only that record costs more).

Eviction is least-recently-used, with one fairness rule: a request already holding its fair
share of the pool (``capacity // requests holding a session``, at least 1) evicts its own
least recently used session rather than another request's. So one request with many choices
cannot evict every other request's parser.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

Key = tuple[Hashable, str, int]  # (owner processor, request_id, choice index)
# Measured live size of one parser session (tracemalloc, Qwen3 with the qwen3 reasoning and hermes
# tool parsers, after a few hundred tokens).
LIVE_PARSER_BYTES = 32 * 1024


class LiveParserPool:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.evictions = 0
        self._lru: OrderedDict[Key, Any] = OrderedDict()  # key -> SequenceState, least recent first
        self._by_request: dict[tuple[Hashable, str], OrderedDict[Key, None]] = {}

    def __len__(self) -> int:
        return len(self._lru)

    def live_bytes(self) -> int:
        """The estimated memory of the sessions held (``LIVE_PARSER_BYTES`` each)."""
        return LIVE_PARSER_BYTES * len(self._lru)

    def count(self, owner: Hashable) -> int:
        """Sessions held by ``owner``'s requests (a processor's share, for metrics and tests)."""
        return sum(len(keys) for (o, _), keys in self._by_request.items() if o == owner)

    def touch(self, owner: Hashable, request_id: str, index: int, state: Any) -> None:
        """``state`` (a ``SequenceState``) was used; keep its session, if any, within the cap."""
        key = (owner, request_id, index)
        if state.live is None:
            self.discard(key)
            return
        request = (owner, request_id)
        mine = self._by_request.setdefault(request, OrderedDict())
        if key in self._lru:
            # A carried stream_state makes a new SequenceState per record: evict the one in use.
            self._lru[key] = state
            self._lru.move_to_end(key)
            mine.move_to_end(key)
            return
        self._lru[key] = state
        mine[key] = None
        while len(self._lru) > self.capacity:
            share = max(1, self.capacity // len(self._by_request))
            # Over its share, a request pays with its own least recently used session.
            self._evict(next(iter(mine)) if len(mine) > share else next(iter(self._lru)))

    def _evict(self, key: Key) -> None:
        state = self._lru[key]
        state.live = None
        self.discard(key)
        self.evictions += 1

    def discard(self, key: Key) -> None:
        if self._lru.pop(key, None) is None:
            return
        request = (key[0], key[1])
        mine = self._by_request.get(request)
        if mine is not None:
            mine.pop(key, None)
            if not mine:
                del self._by_request[request]

    def drop_request(self, owner: Hashable, request_id: str) -> None:
        """The request ended: its sessions leave the pool (and are freed with the request)."""
        for key in list(self._by_request.get((owner, request_id), ())):
            self.discard(key)

    def drop_owner(self, owner: Hashable) -> None:
        """A processor is dropped (its partition revoked or reset): free its sessions."""
        for request in [r for r in self._by_request if r[0] == owner]:
            for key in list(self._by_request[request]):
                self._lru[key].live = None
                self.discard(key)
