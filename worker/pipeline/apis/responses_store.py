"""Stored responses: a compacted topic keyed by response id, read whole by every gateway replica.

A record is the latest state of one response: ``{"response": Response, "messages": [chat messages of its
input], "events": [its stream events] | null}``. ``previous_response_id`` rebuilds the conversation from
``messages`` and ``response.output``; a background response's record is rewritten as its events arrive,
so any replica can answer ``GET /v1/responses/{id}`` and follow its stream. While it runs the record also
carries its chat request (``run``) and the lease of the replica running it (``lease``): another replica
takes it over once the lease expired. Each replica keeps the newest records in memory, up to
``--responses-store-max-mb`` (a record still running is never dropped: a takeover needs it); the topic's
retention bounds what the broker keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict

import orjson

from worker.pipeline.apis.chat_source import JsonDict
from worker.pipeline.apis.compacted_table import CompactedTable
from worker.pipeline.apis.lease import accepts, same_lease
from worker.pipeline.connection import MAX_REQUEST_BYTES, Connection

log = logging.getLogger(__name__)

FINAL_STATUSES = ("completed", "incomplete", "failed", "cancelled")


def running(record: JsonDict) -> bool:
    return record["response"].get("status") not in FINAL_STATUSES


class ResponsesStore(CompactedTable):
    def __init__(self, connection: Connection, topic: str, max_bytes: int) -> None:
        super().__init__(connection, topic)
        self.max_bytes = max_bytes
        self.records: OrderedDict[str, JsonDict] = OrderedDict()
        self._sizes: dict[str, int] = {}  # each record's size as it came (a measure of what it holds)
        self.held_bytes = 0
        self._changed = asyncio.Event()

    def take(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        name = key.decode(errors="replace")
        record = None
        with contextlib.suppress(orjson.JSONDecodeError):
            record = orjson.loads(value) if value is not None else None
        if isinstance(record, dict) and isinstance(record.get("response"), dict):
            self._keep(name, record, len(value or b""))
        else:
            self._drop(name)  # a tombstone (or a record not ours)

    def fetched(self, any_records: bool) -> None:
        if any_records:
            self._notify()

    def _keep(self, key: str, value: JsonDict, size: int) -> bool:
        """Whether ``value`` now stands for ``key`` (the lease rule, ``lease.accepts``, may refuse it)."""
        old = self.records.get(key)
        if old is not None and old["response"].get("status") == "cancelled":
            # A cancel wins over the generation's own later writes (they race on the topic).
            value = {**value, "response": {**value["response"], "status": "cancelled"}}
        elif value["response"].get("status") == "cancelled":
            pass  # a cancel, from any replica: it ends the response whoever holds its lease
        elif not accepts(old, value):
            return False
        self._drop(key)
        self.records[key] = value
        self._sizes[key] = size
        self.held_bytes += size
        excess = self.held_bytes - self.max_bytes
        victims: list[str] = []
        for name, record in self.records.items():  # oldest first, until enough is freed
            if excess <= 0:
                break
            if name != key and not running(record):  # the newest stays, as do running ones
                victims.append(name)
                excess -= self._sizes[name]
        for name in victims:
            self._drop(name)
        return True

    def _drop(self, key: str) -> None:
        if self.records.pop(key, None) is not None:
            self.held_bytes -= self._sizes.pop(key)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, within_s: float) -> None:
        """Until a record arrives (or ``within_s`` passed)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                await self._changed.wait()

    async def put(self, response_id: str, record: JsonDict) -> bool:
        """Write the response's latest state (too big for a record: without its events, then messages);
        False when this replica already knows the lease rule refuses it."""
        value = orjson.dumps(record)
        for dropped in ("events", "messages"):
            if len(value) <= MAX_REQUEST_BYTES - 1024:
                break
            log.warning("stored response %s is too big: its %s are not kept", response_id, dropped)
            record = {**record, dropped: None}
            value = orjson.dumps(record)
        kept = self._keep(response_id, record, len(value))
        self._notify()
        await self.send(response_id, value)
        return kept

    async def claim(self, response_id: str, record: JsonDict) -> bool:
        """Write a claim of the response's lease and read the topic up to it: True when it won."""
        await self.send(response_id, orjson.dumps(record))
        await self.caught_up()
        return same_lease(self.records.get(response_id), record)

    async def get(self, response_id: str) -> JsonDict | None:
        """The response's latest record, after reading up to what the topic held when asked."""
        found = self.records.get(response_id)
        if found is not None:
            return found
        await self.caught_up()
        return self.records.get(response_id)
