"""Background responses (``background: true``): run on one replica, taken over by another if it dies.

The response's record (``responses_store``) is rewritten as its events come (at most every
``SNAPSHOT_EVERY_S``, and at the end) and at least every third of ``--takeover-lease-s`` with a fresh lease
(``lease``). It carries the chat request without its messages (``run``; the messages are the record's own),
so a replica that claims an expired lease can resume it: when the request reached the requests topic its
chunks are read back from the output topic from their start (``reattach``), otherwise it is sent now.
The events are made again from the first chunk with item ids derived from the response id, so they equal
the ones already stored and a follower's ``starting_after`` stays valid.

A replica that stops gracefully hands its responses over: their chat requests are durable (no error, no
cancel upstream: the generation goes on), and each record is written a last time with its lease released,
so another replica claims it in its next round and reads the chunks back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator

from aiohttp import web

from schemas.envelope import Origin
from worker.pipeline.apis import responses
from worker.pipeline.apis.chat_source import ChatSource, JsonDict, closing
from worker.pipeline.apis.lease import Holding, Takeover, new_owner
from worker.pipeline.apis.reattach import OutputTail, chunks, written
from worker.pipeline.apis.responses_store import ResponsesStore, running
from worker.runtime.observability.tracing import NO_HEADERS, Headers

log = logging.getLogger(__name__)

SNAPSHOT_EVERY_S = 0.2  # a background response's record is rewritten at most this often while it runs


class BackgroundResponses:
    def __init__(self, source: ChatSource, store: ResponsesStore) -> None:
        self.source = source
        self.store = store
        self.lease_s = source.settings.takeover_lease_s
        self.owner = new_owner()
        self.owned: set[str] = set()  # the responses this replica runs
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(
        self, queued: JsonDict, chat: JsonDict, chat_messages: list[JsonDict], trace: Headers, client: str
    ) -> None:
        """Store the queued response with this replica's lease, and run it."""
        holding = Holding(self.owner, self.lease_s)
        run = {"chat": {k: v for k, v in chat.items() if k != "messages"}, "client": client}
        record = {
            "response": queued,
            "messages": chat_messages,
            "events": [],
            "run": run,
            "lease": holding.field(),
        }
        await self.store.put(queued["id"], record)
        self._spawn(queued["id"], holding, trace, None)

    def _spawn(self, response_id: str, holding: Holding, trace: Headers, since_ms: int | None) -> None:
        self.owned.add(response_id)
        task = asyncio.create_task(self._run(response_id, holding, trace, since_ms))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self.owned.discard(response_id))

    async def _answers(
        self,
        stack: contextlib.AsyncExitStack,
        response_id: str,
        chat: JsonDict,
        client: str,
        trace: Headers,
        since_ms: int | None,
    ) -> AsyncGenerator[JsonDict, None]:
        """The chat's chunks: sent now, or (taken over, and sent before) read back from the output topic."""
        if since_ms is not None:
            sent = await written(
                self.source.connection, self.source.settings.requests_topic, [response_id], since_ms
            )
            if sent:
                log.info("background response %s: taken over, its chunks are read back", response_id)
                tail = await stack.enter_async_context(
                    OutputTail(self.source.connection, self.source.settings, since_ms, sent)
                )
                return chunks(tail, response_id, chat)
        origin = Origin(api="responses", id=response_id)
        return self.source.chat(
            chat, trace, request_id=response_id, client=client, origin=origin, durable=True
        )

    async def _run(self, response_id: str, holding: Holding, trace: Headers, since_ms: int | None) -> None:
        """Run the response to its end, its record rewritten as its events come and its lease renewed."""
        store = self.store
        record = store.records[response_id]
        chat_messages = record.get("messages")
        base = {**record["response"], "status": "in_progress"}
        converter = responses.ResponseStream(base, id_seed=response_id)
        events: list[JsonDict] = []
        if chat_messages is None:  # stored without them (too big): nothing to resume from
            failed = responses.failed(base, [], {"message": "the request could not be resumed"})
            await store.put(response_id, {**record, "response": failed, "lease": holding.field()})
            return

        async def write(release: bool = False) -> bool:
            """The record as it stands, with a fresh lease (or, ``release``, the lease released); False
            once the lease is lost."""
            if holding.lost:
                return False
            current = {
                "response": converter.response,
                "messages": chat_messages,
                "events": events,
                "run": record["run"],
                "lease": holding.released() if release else holding.field(),
            }
            if not await store.put(response_id, current):
                holding.lost = True
            return not holding.lost

        async def renew() -> None:
            while not holding.lost:
                await asyncio.sleep(holding.renew_every())
                started = time.time()
                if await write():
                    await store.caught_up()
                    if holding.holds(store.records.get(response_id)):
                        holding.confirmed(started)
                    else:
                        holding.lost = True
            log.info("background response %s: its lease was taken over; no longer written here", response_id)

        renewer = asyncio.create_task(renew())
        written_at = 0.0
        loop = asyncio.get_running_loop()
        try:
            async with contextlib.AsyncExitStack() as stack:
                chat = {**record["run"]["chat"], "messages": chat_messages}
                client = str(record["run"]["client"])
                answers = await self._answers(stack, response_id, chat, client, trace, since_ms)
                async with contextlib.aclosing(answers):
                    first = await anext(answers, None)
                    if first is None:
                        first = {"error": {"message": "no answer", "code": 500}}
                    async for event in responses.converted(converter, first, answers):
                        events.append(event)
                        if _cancelled(store, response_id):
                            break  # the generation is stopped upstream as the chat closes
                        if holding.lost:
                            continue  # another replica runs it now: read on (closing would cancel it)
                        if (
                            event["type"] in responses.TERMINAL_EVENTS
                            or loop.time() - written_at >= SNAPSHOT_EVERY_S
                        ):
                            await write()
                            written_at = loop.time()
        except asyncio.CancelledError:
            if closing(self.source):
                await _stopped(renewer)
                await write(release=True)  # its last write: another replica resumes it from here
                log.info("background response %s: handed over (its lease released)", response_id)
            raise
        except Exception:
            log.exception("background response %s failed", response_id)
            failed = responses.failed(converter.response, converter.output, {"message": "internal error"})
            converter.response = failed
            await write()
        finally:
            renewer.cancel()

    def takeover(self) -> Takeover:
        """Running responses whose lease expired, resumed here (see ``lease``)."""

        def candidates() -> list[tuple[str, JsonDict]]:
            records = self.store.records.items()
            return [(rid, record) for rid, record in records if rid not in self.owned and running(record)]

        def start(response_id: str, record: JsonDict, holding: Holding) -> None:
            # It was sent (if at all) after it was created.
            since_ms = int(record["response"].get("created_at") or 0) * 1000
            self._spawn(response_id, holding, NO_HEADERS, since_ms)

        return Takeover(
            what="background response",
            owner=self.owner,
            lease_s=self.lease_s,
            candidates=candidates,
            claim=self.store.claim,
            start=start,
            stopping=lambda: closing(self.source),
        )

    def runs_with(self, app: web.Application) -> None:
        """The takeover loop starts after the store (so it sees the table) and stops before it; the
        responses run here are stopped (handed over, the gateway stopping) before the store too."""
        loop_task: list[asyncio.Task[None]] = []

        async def start(_: web.Application) -> None:
            loop_task.append(asyncio.create_task(self.takeover().rounds()))

        async def stop(_: web.Application) -> None:
            running = [*loop_task, *self._tasks]
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

        app.on_startup.append(start)
        app.on_cleanup.insert(0, stop)


async def _stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _cancelled(store: ResponsesStore, response_id: str) -> bool:
    record = store.records.get(response_id)
    return record is not None and record["response"].get("status") == "cancelled"
