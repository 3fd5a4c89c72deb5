"""The Batch API on the chat path: ``/v1/files`` and ``/v1/batches``, kept in one compacted topic.

Records, keyed so compaction keeps the latest of each: ``file:<id>`` (a file's metadata and chunk count),
``file:<id>:<n>`` (its n-th chunk of at most ``CHUNK_BYTES``), ``batch:<id>`` (a batch's state). Each line
of a batch's input file is one chat request on the requests topic, ``request_id`` ``<batch id>-<line>``;
the replica that took the batch runs it (at most ``CONCURRENCY`` lines at once), writes progress into the
batch record, and at the end the output and error files with one line per input line, in input order.
Every replica keeps the file and batch *metadata* in memory (small); file contents are read from the topic
when needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from worker.pipeline.apis.chat_source import ChatSource, JsonDict
from worker.pipeline.apis.compacted_table import CompactedTable
from worker.pipeline.connection import Connection
from worker.pipeline.gateway_edge import ANONYMOUS, API_KEY_NAME
from worker.runtime.tracing import NO_HEADERS

log = logging.getLogger(__name__)

CHUNK_BYTES = 512 * 1024
CONCURRENCY = 32
MAX_LINES = 50_000
# A longer window is refused: its expires_at must fit the batch record (orjson's 64-bit integers).
MAX_WINDOW_S = 30 * 24 * 3600
FINAL = ("completed", "failed", "expired", "cancelled")
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


def output_line(custom_id: Any, line: int, answer: JsonDict) -> tuple[bytes, bool]:
    """One line of the output (``True``) or error (``False``) file, as OpenAI's batch output has it."""
    error = answer.get("error")
    if error is None:
        request_id = str(answer.get("id", ""))
        response = {"status_code": 200, "request_id": request_id, "body": answer}
        value = {"id": f"batch_req_{line}", "custom_id": custom_id, "response": response, "error": None}
        return orjson.dumps(value), True
    status = error.get("code") if isinstance(error.get("code"), int) else 500
    response = {"status_code": status, "request_id": "", "body": {"error": error}}
    value = {"id": f"batch_req_{line}", "custom_id": custom_id, "response": response, "error": None}
    return orjson.dumps(value), False


class BatchStore(CompactedTable):
    def __init__(self, connection: Connection, topic: str) -> None:
        super().__init__(connection, topic)
        self.meta: dict[str, JsonDict] = {}  # "file:<id>" / "batch:<id>" -> latest value

    def take(self, key: bytes | None, value: bytes | None) -> None:
        name = key.decode(errors="replace") if key else ""
        if name.count(":") != 1 or value is None:
            return  # a chunk (read only when wanted) or a tombstone
        with contextlib.suppress(orjson.JSONDecodeError):
            meta = orjson.loads(value)
            if isinstance(meta, dict):
                self._keep(name, meta)

    def _keep(self, key: str, value: JsonDict) -> None:
        old = self.meta.get(key)
        if old is not None and old.get("status") == "cancelling" and value.get("status") == "in_progress":
            # A cancel wins over the runner's progress writes that raced it on the topic.
            value = {**value, "status": "cancelling", "cancelling_at": old.get("cancelling_at")}
        self.meta[key] = value

    async def put_meta(self, key: str, value: JsonDict) -> None:
        self._keep(key, value)
        await self.send(key, orjson.dumps(self.meta[key]))

    async def get_meta(self, key: str) -> JsonDict | None:
        """The latest metadata under ``key``, after reading up to what the topic held when asked (another
        replica may have written it a moment ago)."""
        if key not in self.meta:
            await self.caught_up()
        return self.meta.get(key)

    async def write_file(self, purpose: str, filename: str, content: bytes) -> JsonDict:
        file_id = f"file-{uuid.uuid4().hex}"
        chunks = [content[i : i + CHUNK_BYTES] for i in range(0, len(content), CHUNK_BYTES)] or [b""]
        for n, chunk in enumerate(chunks):
            await self.send(f"file:{file_id}:{n}", chunk)
        meta = {
            "id": file_id,
            "bytes": len(content),
            "created_at": int(time.time()),
            "filename": filename,
            "object": "file",
            "purpose": purpose,
            "status": "processed",
            "chunks": len(chunks),
        }
        await self.put_meta(f"file:{file_id}", meta)
        return meta

    async def read_file(self, file_id: str) -> bytes | None:
        """A file's content, read from the topic (its chunks are not kept in memory)."""
        meta = await self.get_meta(f"file:{file_id}")
        if meta is None:
            return None
        wanted = {f"file:{file_id}:{n}".encode(): n for n in range(meta["chunks"])}
        found: dict[int, bytes] = {}
        consumer = self.connection.consumer()
        await consumer.start()
        try:
            consumer.assign(self.partitions)
            await consumer.seek_to_beginning(*self.partitions)
            ends = await consumer.end_offsets(self.partitions)
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    for record in records:
                        n = wanted.get(record.key or b"")
                        if n is not None and record.value is not None:
                            found[n] = record.value
        finally:
            await consumer.stop()
        if len(found) != len(wanted):
            return None
        return b"".join(found[n] for n in range(len(wanted)))


def public_file(meta: JsonDict) -> JsonDict:
    return {k: v for k, v in meta.items() if k != "chunks"}


class BatchApi:
    def __init__(self, source: ChatSource, store: BatchStore) -> None:
        self.source = source
        self.store = store
        self._running: dict[str, asyncio.Task[None]] = {}

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
        content = await self.store.read_file(http.match_info["file_id"])
        if content is None:
            return _error(404, "No such file", "file_id")
        return web.Response(body=content, content_type="application/octet-stream")

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
        content = await self.store.read_file(input_id)
        if content is None:
            return _error(404, f"No such file: {input_id}", "input_file_id")
        lines = [line for line in content.splitlines() if line.strip()]
        if len(lines) > MAX_LINES:
            return _error(400, f"at most {MAX_LINES} lines", "input_file_id")
        now = int(time.time())
        batch = {
            "id": f"batch_{uuid.uuid4().hex}",
            "object": "batch",
            "endpoint": body["endpoint"],
            "errors": None,
            "input_file_id": input_id,
            "completion_window": body["completion_window"],
            "status": "in_progress",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": now,
            "expires_at": now + window,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
        }
        await self.store.put_meta(f"batch:{batch['id']}", batch)
        # Its lines are admitted against the client's own share, as its other requests are.
        task = asyncio.create_task(self._run(batch, lines, http.get(API_KEY_NAME, ANONYMOUS)))
        self._running[batch["id"]] = task
        task.add_done_callback(lambda _: self._running.pop(batch["id"], None))
        return _json(batch)

    async def _answer(self, batch_id: str, index: int, line: bytes, client: str) -> JsonDict:
        try:
            request = orjson.loads(line)
            body = request["body"]
            if not isinstance(body, dict):
                raise TypeError("body must be an object")
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            return {"error": {"message": f"line {index + 1}: {exc}", "code": 400}}
        chat = {**body, "stream": False}
        answers = self.source.chat(chat, NO_HEADERS, request_id=f"{batch_id}-{index}", client=client)
        async with contextlib.aclosing(answers):
            answer = await anext(answers, None)
        return answer or {"error": {"message": "no answer", "code": 500}}

    async def _run(self, batch: JsonDict, lines: list[bytes], client: str) -> None:
        key = f"batch:{batch['id']}"
        answers: list[JsonDict | None] = [None] * len(lines)
        slots = asyncio.Semaphore(CONCURRENCY)
        counts = dict(batch["request_counts"])  # this runner's own: the topic's copies lag behind

        def cancelled() -> bool:
            return bool(self.store.meta[key]["status"] == "cancelling")

        async def one(index: int) -> None:
            async with slots:
                if cancelled():
                    return
                answer = answers[index] = await self._answer(batch["id"], index, lines[index], client)
                counts["completed" if "error" not in answer else "failed"] += 1

        async def progress() -> None:
            while True:
                await asyncio.sleep(1.0)
                await self.store.put_meta(key, {**self.store.meta[key], "request_counts": dict(counts)})

        reporter = asyncio.create_task(progress())
        try:
            async with asyncio.timeout(batch["expires_at"] - time.time()):
                await asyncio.gather(*(one(i) for i in range(len(lines))))
            status = "cancelled" if cancelled() else "completed"
        except TimeoutError:
            status = "expired"
        finally:
            reporter.cancel()
        state = {**self.store.meta[key], "request_counts": dict(counts), "finalizing_at": int(time.time())}
        out: list[bytes] = []
        errors: list[bytes] = []
        for index, (line, answer) in enumerate(zip(lines, answers, strict=True)):
            if answer is None:
                continue  # not run: cancelled or expired first
            custom = None
            with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
                custom = orjson.loads(line).get("custom_id")
            written, ok = output_line(custom, index, answer)
            (out if ok else errors).append(written)
        if out:
            state["output_file_id"] = (
                await self.store.write_file("batch_output", "output.jsonl", b"\n".join(out) + b"\n")
            )["id"]
        if errors:
            state["error_file_id"] = (
                await self.store.write_file("batch_output", "errors.jsonl", b"\n".join(errors) + b"\n")
            )["id"]
        state["status"] = status
        state[{"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}[status]] = (
            int(time.time())
        )
        await self.store.put_meta(key, state)

    async def retrieve_batch(self, http: web.Request) -> web.StreamResponse:
        batch = await self.store.get_meta(f"batch:{http.match_info['batch_id']}")
        return _json(batch) if batch else _error(404, "No such batch", "batch_id")

    async def cancel_batch(self, http: web.Request) -> web.StreamResponse:
        key = f"batch:{http.match_info['batch_id']}"
        batch = await self.store.get_meta(key)
        if batch is None:
            return _error(404, "No such batch", "batch_id")
        if batch["status"] in FINAL:
            return _error(400, f"Cannot cancel a batch that is {batch['status']}", "batch_id")
        batch = {**batch, "status": "cancelling", "cancelling_at": int(time.time())}
        await self.store.put_meta(key, batch)
        return _json(batch)


def add_batch_routes(app: web.Application, source: ChatSource, topic: str) -> None:
    store = BatchStore(source.connection, topic)
    store.runs_with(app)
    api = BatchApi(source, store)
    app.router.add_post("/v1/files", api.create_file)
    app.router.add_get("/v1/files/{file_id}", api.retrieve_file)
    app.router.add_get("/v1/files/{file_id}/content", api.file_content)
    app.router.add_post("/v1/batches", api.create_batch)
    app.router.add_get("/v1/batches/{batch_id}", api.retrieve_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", api.cancel_batch)
