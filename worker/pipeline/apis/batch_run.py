"""Running one batch: its lines through a window, its answers written out in chunks, resumable elsewhere.

Line ``i`` is the chat request ``<batch id>-<i>``. At most ``--batch-window`` lines are in flight, all of them
within ``--batch-window`` lines of the first unanswered one, so a run holds at most that many lines and
answers. Answers are appended in input order to the output and error files' current chunk
(``file:<id>:<n>``, the files' ids chosen when the batch is made) as soon as the lines before them are
answered; each chunk is written when it is full or at the next progress write (every ``FLUSH_EVERY_S``),
and the batch record then says how far the files go. A run holds at most the window's lines and answers
plus, per file, one chunk not yet written.

The batch record's ``run`` is what another replica needs to resume: ``flushed`` (lines before it are in the
files), ``submitted`` (no line from it on was ever sent: it is written before a line past it is sent) and
``since_ms`` (no unflushed line was sent before it). A replica that takes the batch over (``lease``) reads
which lines of ``flushed .. submitted`` reached the requests topic: their answers come from the output
topic (``reattach``), the others are sent; no line is sent twice, none is written twice.

A replica that stops gracefully hands the batch over: its lines' chat requests are durable (no error, no
cancel upstream: they are generated on), nothing more goes into the files, and the record is written a last
time with its progress so far and the lease released, so another replica claims it in its next round and
reads the lines in flight back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import orjson

from schemas.envelope import Origin
from worker.pipeline.apis.batch_store import CHUNK_BYTES, BatchStore
from worker.pipeline.apis.chat_source import ChatSource, JsonDict, closing
from worker.pipeline.apis.lease import Holding, lease_of
from worker.pipeline.apis.reattach import OutputTail, one_answer, written
from worker.runtime.observability.tracing import NO_HEADERS

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 1.0


def new_run(client: str) -> JsonDict:
    """The ``run`` of a batch not started yet."""
    return {
        "client": client,
        "output": {"id": f"file-{uuid.uuid4().hex}", "chunks": 0, "bytes": 0, "lines": 0},
        "errors": {"id": f"file-{uuid.uuid4().hex}", "chunks": 0, "bytes": 0, "lines": 0},
        "flushed": 0,
        "submitted": 0,
        "since_ms": int(time.time() * 1000),
    }


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


def chat_of(line: bytes, index: int) -> JsonDict:
    """The chat request of an input line, or the ``{"error": ...}`` that answers a line that is not one."""
    try:
        request = orjson.loads(line)
        body = request["body"]
        if not isinstance(body, dict):
            raise TypeError("body must be an object")
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        return {"error": {"message": f"line {index + 1}: {exc}", "code": 400}}
    return {**body, "stream": False}


def custom_id_of(line: bytes) -> Any:
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
        return orjson.loads(line).get("custom_id")
    return None


class _File:
    """An output or error file being written: its chunks so far and the one being filled."""

    def __init__(self, state: JsonDict, chunk_bytes: int) -> None:
        self.state = dict(state)  # id, chunks, bytes, lines: what is written
        self.chunk_bytes = chunk_bytes
        self.buffer: list[bytes] = []
        self.buffered = 0
        self.buffered_lines = 0

    def add(self, line: bytes) -> None:
        self.buffer.append(line + b"\n")
        self.buffered += len(line) + 1
        self.buffered_lines += 1

    def take(self) -> tuple[int, bytes] | None:
        """The chunk to write (its number and bytes), counted as written."""
        if not self.buffer:
            return None
        chunk = b"".join(self.buffer)
        n = self.state["chunks"]
        self.state["chunks"] += 1
        self.state["bytes"] += len(chunk)
        self.state["lines"] += self.buffered_lines
        self.buffer, self.buffered, self.buffered_lines = [], 0, 0
        return n, chunk


class BatchRun:
    """One batch on the replica holding its lease."""

    def __init__(self, source: ChatSource, store: BatchStore, key: str, holding: Holding) -> None:
        self.source = source
        self.store = store
        self.key = key
        self.batch_id = key.split(":", 1)[1]
        self.holding = holding
        self.window = source.settings.batch_window
        self.chunk_bytes = CHUNK_BYTES
        self.pending: dict[int, JsonDict] = {}  # answered lines not yet in a file
        self.inflight: dict[int, asyncio.Task[JsonDict]] = {}
        self.custom: dict[int, Any] = {}  # the custom_id of each held line
        self.sent_ms: dict[int, int] = {}  # when each held line was sent (at most)
        self.peak_held = 0
        self.started = False  # run() has its progress (before, the record's is current)
        self._release: asyncio.Future[None] | None = None  # see release()

    @property
    def held(self) -> int:
        """Lines in flight, or answered and waiting for a line before them."""
        return len(self.pending) + len(self.inflight)

    def _meta(self) -> JsonDict:
        meta: JsonDict = self.store.meta[self.key]
        return meta

    async def renew(self) -> bool:
        """Write the record with a fresh lease and read up to it: False when the lease was lost."""
        started = time.time()
        meta = self._meta()
        if not self.holding.holds(meta) or not await self.store.put_meta(
            self.key, {**meta, "lease": self.holding.field(started)}
        ):
            return self._lost("renewing")
        await self.store.caught_up()
        if not self.holding.holds(self.store.meta.get(self.key)):
            return self._lost("reading its renewal back")
        self.holding.confirmed(started)
        return True

    async def run(self) -> None:
        meta = self._meta()
        run = meta["run"]
        total = meta["request_counts"]["total"]
        self.durable_counts = dict(meta["request_counts"])  # of the lines in the files' written chunks
        self.counts = dict(self.durable_counts)  # of the lines appended to them
        self.files = (_File(run["output"], self.chunk_bytes), _File(run["errors"], self.chunk_bytes))
        self.flushed = run["flushed"]  # lines before it are in written chunks
        self.appended = self.flushed  # lines before it are in the files, written or buffered
        self.submitted = run["submitted"]
        self.since_ms = run["since_ms"]
        # Lines up to here may have been sent by an earlier holder, from since_ms on.
        self.recover_to, self.recover_ms = self.submitted, self.since_ms
        self.client = run["client"]
        self.started = True
        if meta["status"] == "validating":
            now = int(time.time())
            if not await self._write({"status": "in_progress", "in_progress_at": now}):
                return
        recovering = range(self.flushed, self.submitted)
        ids = {self._request_id(i) for i in recovering}
        sent = await written(self.source.connection, self.source.settings.requests_topic, ids, self.since_ms)
        if sent:
            log.info("batch %s: %d line(s) sent before the takeover are read back", self.batch_id, len(sent))
        async with contextlib.AsyncExitStack() as stack:
            tail = None
            if sent:
                tail = await stack.enter_async_context(
                    OutputTail(self.source.connection, self.source.settings, self.since_ms, sent)
                )
            status = await self._lines(total, sent, tail)
        if status is not None:
            await self._finish(status)

    def _request_id(self, index: int) -> str:
        return f"{self.batch_id}-{index}"

    async def _lines(self, total: int, sent: set[str], tail: OutputTail | None) -> str | None:
        """Send and collect the lines; the batch's final status, or None when the lease was lost."""
        meta = self._meta()
        lines = self.store.lines(meta["input_file_id"], skip=self.flushed)
        index = self.flushed
        exhausted = False
        next_flush = time.monotonic() + FLUSH_EVERY_S
        try:
            while True:
                if closing(self.source):
                    await self.release()
                    return None
                stopping = self._meta()["status"] == "cancelling" or time.time() >= meta["expires_at"]
                while (
                    not exhausted
                    and index < total
                    and index < self.appended + self.window
                    and self.holding.may_act()
                ):
                    # Stopping, only the lines an earlier holder sent are still read back.
                    if stopping and not (index < self.recover_to and self._request_id(index) in sent):
                        if index >= self.recover_to:
                            break
                        index += 1
                        await anext(lines, None)
                        continue
                    line = await anext(lines, None)
                    if line is None:
                        exhausted = True  # the file is shorter than counted: the rest is never answered
                        break
                    if not await self._start(index, line, sent, tail):
                        return None
                    index += 1
                self.peak_held = max(self.peak_held, self.held)
                self._append_ready()
                if self._a_chunk_is_full() and not await self._flush():
                    return None
                if not self.inflight:
                    if stopping or exhausted or index >= total:
                        break
                    if not self.holding.may_act() and not await self.renew():
                        return None
                    continue  # the window moved on (answered lines, or lines that were no request)
                timeout = max(0.0, next_flush - time.monotonic())
                done, _ = await asyncio.wait(
                    set(self.inflight.values()), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                for i, task in list(self.inflight.items()):
                    if task in done:
                        del self.inflight[i]
                        self.pending[i] = task.result()
                self._append_ready()
                if time.time() >= meta["expires_at"]:
                    for task in self.inflight.values():
                        task.cancel()  # the generation is cancelled upstream as its chat closes
                    self.inflight.clear()
                    return "expired"
                if time.monotonic() >= next_flush or self._a_chunk_is_full():
                    if not await self._flush():
                        return None
                    next_flush = time.monotonic() + FLUSH_EVERY_S
            if self._meta()["status"] == "cancelling":
                return "cancelled"
            return "expired" if time.time() >= meta["expires_at"] else "completed"
        finally:
            await lines.aclose()

    async def release(self) -> None:
        """The gateway is stopping: its lines in flight are left to go on upstream (durable), the answers
        not in a written chunk are dropped (read back by the next holder), and the record is written
        with the progress so far and the lease released.

        Once only, and whole: the runner releases when it sees the gateway closing, and again when the
        stop then cancels it, which can come in the middle of the first. Each call waits for the one
        release, which a cancel of its caller does not interrupt."""
        if self._release is None:
            self._release = asyncio.ensure_future(self._release_once())
        await asyncio.shield(self._release)

    async def _release_once(self) -> None:
        if self.holding.lost:
            log.info("batch %s: not handed over, its lease was already taken over", self.batch_id)
            return
        if not self.started:  # waiting for a slot: the record holds its progress
            meta = self._meta()
            if self.holding.holds(meta):
                await self.store.put_meta(self.key, {**meta, "lease": self.holding.released()})
                log.info("batch %s: handed over before it started (its lease released)", self.batch_id)
            return
        inflight = list(self.inflight.values())
        self.inflight.clear()
        for task in inflight:
            task.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)
        if await self._write({}, release=True):
            log.info("batch %s: handed over at line %d (its lease released)", self.batch_id, self.flushed)
        else:
            log.info("batch %s: not handed over, its lease was taken over meanwhile", self.batch_id)

    def _a_chunk_is_full(self) -> bool:
        return any(f.buffered >= f.chunk_bytes for f in self.files)

    async def _start(self, index: int, line: bytes, sent: set[str], tail: OutputTail | None) -> bool:
        """Start line ``index``: read back (it was sent before), or sent (``submitted`` moved past it
        first). False when the lease was lost."""
        request_id = self._request_id(index)
        chat = chat_of(line, index)
        self.custom[index] = custom_id_of(line)
        if "error" in chat:
            self.pending[index] = chat
            return True
        if index < self.recover_to and request_id in sent and tail is not None:
            self.sent_ms[index] = self.recover_ms  # sent by an earlier holder, no earlier than this
            self.inflight[index] = asyncio.create_task(self._read_back(tail, request_id, chat))
            return True
        # Every line sent is timed before it is sent: since_ms stays at or before each unflushed one's.
        self.sent_ms[index] = int(time.time() * 1000)
        if index >= self.submitted:
            self.submitted = min(self._meta()["request_counts"]["total"], index + self.window)
            if not await self._write({}):
                return False
        self.inflight[index] = asyncio.create_task(self._answer(request_id, chat, index))
        return True

    async def _answer(self, request_id: str, chat: JsonDict, index: int) -> JsonDict:
        origin = Origin(api="batch", id=self.batch_id, line=index)
        answers = self.source.chat(
            chat, NO_HEADERS, request_id=request_id, client=self.client, origin=origin, durable=True
        )
        async with contextlib.aclosing(answers):
            answer = await anext(answers, None)
        return answer or {"error": {"message": "no answer", "code": 500}}

    async def _read_back(self, tail: OutputTail, request_id: str, chat: JsonDict) -> JsonDict:
        answer = await one_answer(tail, request_id, chat)
        if "error" in answer:
            self.source.cancel(request_id)  # as the chat path does for a request that did not succeed
        return answer

    def _append_ready(self) -> None:
        """The answered lines from ``appended`` on, while contiguous, go into the files' buffers."""
        while self.appended in self.pending:
            self._append(self.appended)
            self.appended += 1

    def _append(self, index: int) -> None:
        answer = self.pending.pop(index)
        line, ok = output_line(self.custom.pop(index, None), index, answer)
        self.counts["completed" if "error" not in answer else "failed"] += 1
        self.files[0 if ok else 1].add(line)

    async def _flush(self, with_gaps: bool = False) -> bool:
        """Write the buffered chunks, then the record saying so (``with_gaps``: at the end, the answered
        lines after a line never answered go too). False when the lease was lost or the gateway is
        stopping (the batch is handed over from its last written chunk)."""
        if closing(self.source):
            return False
        if with_gaps:
            for index in sorted(self.pending):
                self._append(index)
            self.appended = max(self.appended, self.submitted)
        if self.holding.due() and not await self.renew():
            return False
        for file in self.files:
            taken = file.take()
            if taken is not None:
                n, chunk = taken
                await self.store.send(f"file:{file.state['id']}:{n}", chunk)
        self.flushed = self.appended
        self.durable_counts = dict(self.counts)
        for index in [i for i in self.sent_ms if i < self.flushed]:
            del self.sent_ms[index]
        return await self._write({})

    async def _write(self, changes: JsonDict, release: bool = False) -> bool:
        """The batch record with this run's progress and a fresh lease (``release``: the lease released);
        False when the lease was lost."""
        meta = self._meta()
        if self.holding.lost:
            return False
        if not self.holding.holds(meta):
            return self._lost("writing its progress")
        times = list(self.sent_ms.values())
        if self.flushed < self.recover_to:
            times.append(self.recover_ms)
        run = {
            **meta["run"],
            "output": dict(self.files[0].state),
            "errors": dict(self.files[1].state),
            "flushed": self.flushed,
            "submitted": self.submitted,
            "since_ms": min(times, default=int(time.time() * 1000)),
        }
        record = {
            **meta,
            **changes,
            "request_counts": dict(self.durable_counts),
            "run": run,
            "lease": self.holding.released() if release else self.holding.field(),
        }
        if not await self.store.put_meta(self.key, record):
            return self._lost("writing its progress")
        return True

    def _lost(self, doing: str) -> bool:
        """The lease is another's now: this run acts on the batch no more. False, for the caller."""
        self.holding.lost = True
        lease = lease_of(self.store.meta.get(self.key)) or {}
        log.info(
            "batch %s: lease %s lost while %s (the record holds lease %s of %s)",
            self.batch_id,
            self.holding.id,
            doing,
            lease.get("id"),
            lease.get("owner"),
        )
        return False

    async def _finish(self, status: str) -> None:
        """The answers held go out in input order, the files' metadata is written, then the status."""
        if not await self._flush(with_gaps=status != "completed"):
            return
        state: JsonDict = {"finalizing_at": int(time.time())}
        for file, field, name in zip(
            self.files, ("output_file_id", "error_file_id"), ("output.jsonl", "errors.jsonl"), strict=True
        ):
            if file.state["lines"]:
                meta = {
                    "id": file.state["id"],
                    "bytes": file.state["bytes"],
                    "created_at": int(time.time()),
                    "filename": name,
                    "object": "file",
                    "purpose": "batch_output",
                    "status": "processed",
                    "chunks": file.state["chunks"],
                }
                await self.store.put_meta(f"file:{file.state['id']}", meta)
                state[field] = file.state["id"]
        state["status"] = status
        state[f"{status}_at"] = int(time.time())  # completed_at, expired_at, cancelled_at
        await self._write(state)
