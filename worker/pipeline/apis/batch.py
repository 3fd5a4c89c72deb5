"""The Batch API on the chat path: ``/v1/files`` and ``/v1/batches``, kept in one compacted topic.

Records, keyed so compaction keeps the latest of each: ``file:<id>`` (a file's metadata and chunk count),
``file:<id>:<n>`` (its n-th chunk of at most ``CHUNK_BYTES``), ``batch:<id>`` (a batch's state, with the
lease and progress of the replica running it). Every replica keeps the file and batch *metadata* in
memory, and where each chunk is (``BatchStore.chunk_index``), so a download or a batch reads only its own
chunks. A replica runs at most ``--batch-max-running`` batches (``batch_run``); the others wait,
``validating``; a batch whose replica died is taken over by another once its lease expires (``lease``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from worker.pipeline.apis.batch_run import BatchRun, new_run
from worker.pipeline.apis.batch_store import FINAL, BatchStore
from worker.pipeline.apis.chat_source import ChatSource, JsonDict, closing
from worker.pipeline.apis.lease import Holding, Takeover, new_owner
from worker.pipeline.gateway_edge import ANONYMOUS, API_KEY_NAME

log = logging.getLogger(__name__)

MAX_LINES = 50_000
# A longer window is refused: its expires_at must fit the batch record (orjson's 64-bit integers).
MAX_WINDOW_S = 30 * 24 * 3600
_WINDOW = re.compile(r"^(\d+)(h|m|s)$")


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": status}}
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _json(body: Any) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def window_seconds(window: Any) -> int | None:
    """``completion_window`` (``24h``, ``90m``, ``600s``) in seconds; None when it is not one or is
    over ``MAX_WINDOW_S``."""
    match = _WINDOW.match(window) if isinstance(window, str) else None
    if match is None:
        return None
    seconds = int(match[1]) * {"h": 3600, "m": 60, "s": 1}[match[2]]
    return seconds if seconds <= MAX_WINDOW_S else None


def public_file(meta: JsonDict) -> JsonDict:
    return {k: v for k, v in meta.items() if k != "chunks"}


def public_batch(batch: JsonDict) -> JsonDict:
    """A batch as OpenAI shows it: without the runner's lease and progress."""
    return {k: v for k, v in batch.items() if k not in ("lease", "run")}


class BatchApi:
    def __init__(self, source: ChatSource, store: BatchStore) -> None:
        self.source = source
        self.store = store
        self.settings = source.settings
        self.owner = new_owner()
        self.slots = asyncio.Semaphore(self.settings.batch_max_running)
        self.runs: dict[str, BatchRun] = {}  # the batches this replica holds the lease of
        self._tasks: set[asyncio.Task[None]] = set()

    def held_lines(self) -> int:
        """Input lines and answers the running batches hold in memory."""
        return sum(run.held for run in self.runs.values())

    async def create_file(self, http: web.Request) -> web.StreamResponse:
        # Within the gateway's body limits: aiohttp bounds the size, this the time a slow upload holds.
        timeout = self.source.settings.body_timeout_s
        try:
            async with asyncio.timeout(timeout):
                form = await http.post()
        except TimeoutError:
            return _error(408, f"the upload took over {timeout:g}s")
        upload = form.get("file")
        purpose = str(form.get("purpose") or "batch")
        if not isinstance(upload, web.FileField):
            return _error(400, "a multipart 'file' field is required", "file")
        content = upload.file.read()
        meta = await self.store.write_file(purpose, upload.filename, content)
        return _json(public_file(meta))

    async def retrieve_file(self, http: web.Request) -> web.StreamResponse:
        meta = await self.store.get_meta(f"file:{http.match_info['file_id']}")
        return _json(public_file(meta)) if meta else _error(404, "No such file", "file_id")

    async def file_content(self, http: web.Request) -> web.StreamResponse:
        """The file streamed chunk by chunk (each written within --write-timeout-s)."""
        file_id = http.match_info["file_id"]
        if not await self.store.complete(file_id):
            return _error(404, "No such file", "file_id")
        meta = self.store.meta[f"file:{file_id}"]
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = meta["bytes"]
        timeout_s = self.settings.write_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await response.prepare(http)
            async for chunk in self.store.chunks(file_id):
                async with asyncio.timeout(timeout_s):
                    await response.write(chunk)
            async with asyncio.timeout(timeout_s):
                await response.write_eof()
        except TimeoutError:
            log.info("file %s: a write waited over %gs; ended", file_id, timeout_s)
            if http.transport is not None:
                http.transport.close()
        return response

    async def create_batch(self, http: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await self.source.read_body(http))
        except orjson.JSONDecodeError as exc:
            return _error(400, f"JSON decode error: {exc}")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        if body.get("endpoint") != "/v1/chat/completions":
            return _error(400, "only the /v1/chat/completions endpoint is supported", "endpoint")
        window = window_seconds(body.get("completion_window"))
        if window is None:
            message = f"completion_window must be like '24h', at most {MAX_WINDOW_S // 3600}h"
            return _error(400, message, "completion_window")
        input_id = str(body.get("input_file_id"))
        if not await self.store.complete(input_id):
            return _error(404, f"No such file: {input_id}", "input_file_id")
        total = 0
        async for _ in self.store.lines(input_id):  # counted, not held
            total += 1
            if total > MAX_LINES:
                return _error(400, f"at most {MAX_LINES} lines", "input_file_id")
        now = int(time.time())
        # A free slot runs it at once; otherwise it waits, as OpenAI shows a batch not yet started.
        started = not self.slots.locked()
        if started:
            await self.slots.acquire()
        holding = Holding(self.owner, self.settings.takeover_lease_s)
        batch = {
            "id": f"batch_{uuid.uuid4().hex}",
            "object": "batch",
            "endpoint": body["endpoint"],
            "errors": None,
            "input_file_id": input_id,
            "completion_window": body["completion_window"],
            "status": "in_progress" if started else "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": now if started else None,
            "expires_at": now + window,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": total, "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
            "lease": holding.field(),
            # Its lines are admitted against the client's own share, as its other requests are.
            "run": new_run(http.get(API_KEY_NAME, ANONYMOUS)),
        }
        key = f"batch:{batch['id']}"
        try:
            await self.store.put_meta(key, batch)
        except BaseException:
            if started:
                self.slots.release()
            raise
        self._start(key, holding, started)
        return _json(public_batch(batch))

    def _start(self, key: str, holding: Holding, has_slot: bool) -> None:
        run = BatchRun(self.source, self.store, key, holding)
        self.runs[key] = run
        task = asyncio.create_task(self._hold(run, has_slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _hold(self, run: BatchRun, has_slot: bool) -> None:
        """Wait for a slot (the lease renewed meanwhile), then run the batch."""
        try:
            while not has_slot:
                try:
                    async with asyncio.timeout(run.holding.renew_every()):
                        await self.slots.acquire()
                    has_slot = True
                except TimeoutError:
                    if not await run.renew():
                        return
            await run.run()
        except asyncio.CancelledError:
            if closing(self.source):
                await run.release()
            raise
        except Exception:
            log.exception("batch %s: its runner failed; another replica takes it over", run.key)
        finally:
            if has_slot:
                self.slots.release()
            self.runs.pop(run.key, None)

    def takeover(self) -> Takeover:
        """Unfinished batches whose lease expired, run here (see ``lease``)."""

        def candidates() -> list[tuple[str, JsonDict]]:
            return [
                (key, batch)
                for key, batch in self.store.meta.items()
                if key.startswith("batch:") and key not in self.runs and batch.get("status") not in FINAL
            ]

        return Takeover(
            what="batch",
            owner=self.owner,
            lease_s=self.settings.takeover_lease_s,
            candidates=candidates,
            claim=self.store.claim,
            start=lambda key, _batch, holding: self._start(key, holding, False),
            stopping=lambda: closing(self.source),
        )

    async def retrieve_batch(self, http: web.Request) -> web.StreamResponse:
        batch = await self.store.get_meta(f"batch:{http.match_info['batch_id']}")
        return _json(public_batch(batch)) if batch else _error(404, "No such batch", "batch_id")

    async def cancel_batch(self, http: web.Request) -> web.StreamResponse:
        key = f"batch:{http.match_info['batch_id']}"
        batch = await self.store.get_meta(key)
        if batch is None:
            return _error(404, "No such batch", "batch_id")
        if batch["status"] in FINAL:
            return _error(400, f"Cannot cancel a batch that is {batch['status']}", "batch_id")
        batch = {**batch, "status": "cancelling", "cancelling_at": int(time.time())}
        await self.store.put_meta(key, batch)
        return _json(public_batch(batch))

    def runs_with(self, app: web.Application) -> None:
        """The takeover loop starts after the store (so it sees the table) and stops before it."""
        task: asyncio.Task[None] | None = None

        async def start(_: web.Application) -> None:
            nonlocal task
            task = asyncio.create_task(self.takeover().rounds())

        async def stop(_: web.Application) -> None:
            tasks = [*(t for t in [task] if t is not None), *self._tasks]
            for running in tasks:
                running.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # the runs hand over as they stop

        app.on_startup.append(start)
        app.on_cleanup.insert(0, stop)


def add_batch_routes(app: web.Application, source: ChatSource, topic: str) -> BatchApi:
    store = BatchStore(source.connection, topic)
    store.runs_with(app)
    api = BatchApi(source, store)
    api.runs_with(app)
    app.router.add_post("/v1/files", api.create_file)
    app.router.add_get("/v1/files/{file_id}", api.retrieve_file)
    app.router.add_get("/v1/files/{file_id}/content", api.file_content)
    app.router.add_post("/v1/batches", api.create_batch)
    app.router.add_get("/v1/batches/{batch_id}", api.retrieve_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", api.cancel_batch)
    return api
