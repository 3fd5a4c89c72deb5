"""How an open request's output records reach its client, bounded in memory and time.

The output topic's reader hands each record of an open request to its ``Mailbox`` as raw bytes
(nothing is parsed ahead of the client). A mailbox holds at most ``--max-queued-bytes`` (one record is
always taken, so a record as large as Kafka allows still passes); a client that falls further behind
loses its request: the mailbox is marked overrun, its records dropped, and the request ends with an
error event and a cancel. ``Delivery`` turns the records into the client's events in ``seq`` order,
with each stream's position in a dict and a count of unfinished streams, so a record costs the same
whatever the number of prompts. ``SseWriter`` writes them with a timeout per write.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson
from aiohttp import web

from worker.pipeline.gateway_admission import Admitted, error_info

JsonDict = dict[str, Any]


class Mailbox:
    """The records of one open request, as raw bytes, bounded in bytes; ``end`` stops it with an error."""

    def __init__(
        self, max_bytes: int, on_bytes: Callable[[int], None], on_overrun: Callable[[], None]
    ) -> None:
        self._records: deque[tuple[str, bytes]] = deque()
        self._arrived = asyncio.Event()
        self._max_bytes = max_bytes
        self._on_bytes = on_bytes
        self._on_overrun = on_overrun
        self.queued = 0
        self.ended: JsonDict | None = None  # the error the request ends with, once it is ended

    def put(self, key: str, value: bytes) -> None:
        """From the reader: never blocks, never parses."""
        if self.ended is not None:
            return
        if self._records and self.queued + len(value) > self._max_bytes:
            self.end(overrun_error(self._max_bytes))
            self._on_overrun()
            return
        self._records.append((key, value))
        self.queued += len(value)
        self._on_bytes(len(value))
        self._arrived.set()

    def end(self, error: JsonDict) -> None:
        """No more records: the request ends with ``error`` (an overrun, a shutdown)."""
        if self.ended is None:
            self.ended = error
            self._on_bytes(-self.queued)
            self.queued = 0
            self._records.clear()
            self._arrived.set()

    def get_nowait(self) -> tuple[str, bytes] | JsonDict | None:
        """The next record, or the error the mailbox was ended with; ``None`` when nothing waits."""
        if self.ended is not None:
            return self.ended
        if not self._records:
            return None
        key, value = self._records.popleft()
        self.queued -= len(value)
        self._on_bytes(-len(value))
        return key, value

    async def get(self) -> tuple[str, bytes] | JsonDict:
        """The next record, or the error the mailbox was ended with."""
        while (got := self.get_nowait()) is None:
            self._arrived.clear()
            await self._arrived.wait()
        return got


def overrun_error(max_bytes: int) -> JsonDict:
    return error_info(
        503,
        f"the client fell more than {max_bytes} bytes behind its stream; the request was cancelled",
        "ServiceUnavailableError",
    )


def shutdown_error() -> JsonDict:
    return error_info(
        503, "the gateway is shutting down; the request was cancelled", "ServiceUnavailableError"
    )


def timeout_error(timeout_s: float) -> JsonDict:
    return error_info(504, f"no answer within {timeout_s:g}s", "TimeoutError")


def streams_of(admitted: Admitted) -> int:
    """How many generate streams answer ``admitted``: one per prompt of a streaming request, one
    answer record otherwise."""
    return admitted.prompts if admitted.stream else 1


def stream_ids(request_id: str, admitted: Admitted) -> list[str]:
    """The keys of a request's streams (ingest's keys): its id, or ``<id>-<i>`` for prompt i."""
    count = streams_of(admitted)
    return [request_id] if count == 1 else [f"{request_id}-{i}" for i in range(count)]


@dataclass(slots=True)
class _Stream:
    """One generate stream of a request: what of it was seen, and whether it is complete."""

    position: int  # the prompt's index: its choices are numbered position * n + index
    seen: set[int] = field(default_factory=set)
    contiguous: int = 0  # every seq below this was seen
    held_error: JsonDict | None = None  # ingest's error record, waiting for the outputs before it
    finished: set[int] = field(default_factory=set)
    usage_seen: bool = False
    complete: bool = False

    def see(self, seq: int) -> None:
        self.seen.add(seq)
        while self.contiguous in self.seen:
            self.contiguous += 1


class Delivery:
    """The records of one request, read from its mailbox, as the client's events."""

    def __init__(self, request_id: str, admitted: Admitted, mailbox: Mailbox, timeout_s: float) -> None:
        self.request_id = request_id
        self.admitted = admitted
        self.mailbox = mailbox
        self.timeout_s = timeout_s
        self.stream_ids = stream_ids(request_id, admitted)

    async def _next(self) -> tuple[str, JsonDict]:
        """The next record as JSON, or ``("", {"error": ...})`` for a timeout, an overrun, a shutdown."""
        while True:
            got = self.mailbox.get_nowait()  # records already waiting need no timer
            if got is None:
                try:
                    async with asyncio.timeout(self.timeout_s):
                        got = await self.mailbox.get()
                except TimeoutError:
                    return "", {"error": timeout_error(self.timeout_s)}
            if isinstance(got, dict):
                return "", {"error": got}
            key, raw = got
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return key, value

    async def result(self) -> JsonDict:
        """A one-shot request's answer: its response body, or ``{"error": ...}``."""
        while True:
            _, record = await self._next()
            if record.get("error") is not None:
                return {"error": record["error"]}
            body = record.get("body")
            if isinstance(body, dict) and "chunk" not in body:
                return body

    async def events(self) -> AsyncIterator[JsonDict]:
        """A streaming request's events in order: chunks, then possibly one ``{"error": ...}``; ends
        when the request ended."""
        admitted = self.admitted
        n, count = admitted.n, len(self.stream_ids)
        streams = {sid: _Stream(position) for position, sid in enumerate(self.stream_ids)}
        unfinished = len(streams)
        usage_total: JsonDict | None = None
        while True:
            key, record = await self._next()
            state = streams.get(key)
            error = record.get("error")
            if error is not None and (state is None or "source" in record):
                yield {"error": error}  # a timeout, an error of the whole request, or the worker's own
                return
            seq = record.get("seq")
            if state is None or not isinstance(seq, int):
                continue  # another request's
            if error is not None and record.get("terminal") is True and seq in state.seen:
                yield {"error": error}  # ingest ended the stream at a seq already shown (it restarted)
                return
            if seq in state.seen:
                continue  # a duplicate
            if error is not None:
                state.held_error = record
            else:
                chunk = _chunk_of(record)
                if chunk is None:
                    continue
                state.see(seq)
                if count > 1:  # choices of prompt i are i*n .. i*n+n-1, as vLLM's completions number them
                    offset = state.position * n
                    chunk = {
                        **chunk,
                        "choices": [{**c, "index": offset + c["index"]} for c in chunk["choices"]],
                    }
                for choice in chunk["choices"]:
                    if choice.get("finish_reason") is not None:
                        state.finished.add(choice["index"])
                if not chunk["choices"] and chunk.get("usage"):
                    state.usage_seen = True
                    if count > 1:  # one usage chunk for the whole request, summed at the end
                        usage_total = _add_usage(usage_total, chunk)
                        chunk = {}
                if chunk:
                    yield chunk
            held = state.held_error
            if held is not None and state.contiguous >= held["seq"]:
                yield {"error": held["error"]}
                return
            if (
                not state.complete
                and len(state.finished) >= n
                and (state.usage_seen or not admitted.include_usage)
            ):
                state.complete = True
                unfinished -= 1
                if unfinished == 0:
                    if usage_total is not None:
                        yield usage_total
                    return


def _chunk_of(record: JsonDict) -> JsonDict | None:
    """The chunk an output record carries, ``None`` when it is not one the gateway can number."""
    body = record.get("body")
    chunk = body.get("chunk") if isinstance(body, dict) else None
    if not isinstance(chunk, dict):
        return None
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not all(
        isinstance(c, dict) and isinstance(c.get("index"), int) for c in choices
    ):
        return None
    return chunk


def _add_usage(total: JsonDict | None, chunk: JsonDict) -> JsonDict:
    usage = chunk["usage"]
    if total is None:
        return {**chunk, "usage": dict(usage)}
    summed = dict(total["usage"])
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        summed[name] = (summed.get(name) or 0) + (usage.get(name) or 0)
    return {**total, "usage": summed}


class SseWriter:
    """Server-sent events to one client; a write the client does not take within ``timeout_s`` raises
    ``TimeoutError`` (the request then ends, and is cancelled)."""

    HEADERS: ClassVar[dict[str, str]] = {
        "Content-Type": "text/event-stream; charset=utf-8",
        "Cache-Control": "no-cache",
    }

    def __init__(self, response: web.StreamResponse, timeout_s: float) -> None:
        self.response = response
        self.timeout_s = timeout_s

    @classmethod
    async def open(cls, http: web.Request, timeout_s: float) -> SseWriter:
        response = web.StreamResponse(headers=cls.HEADERS)
        async with asyncio.timeout(timeout_s):
            await response.prepare(http)
        return cls(response, timeout_s)

    async def data(self, payload: bytes) -> None:
        async with asyncio.timeout(self.timeout_s):
            await self.response.write(b"data: " + payload + b"\n\n")

    async def event(self, event: JsonDict) -> None:
        await self.data(orjson.dumps(event))

    async def named(self, name: str, event: JsonDict) -> None:
        """An event with an ``event:`` line, as the Responses and Messages streams send them."""
        async with asyncio.timeout(self.timeout_s):
            await self.response.write(
                b"event: " + name.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
            )

    async def end(self) -> None:
        """The stream's end without chat's ``[DONE]``."""
        async with asyncio.timeout(self.timeout_s):
            await self.response.write_eof()

    async def close(self) -> None:
        await self.data(b"[DONE]")
        await self.end()
