"""A running batch holds at most ``--batch-window`` lines and answers, writes its answers out in chunks as
they come, and a gateway runs at most ``--batch-max-running`` batches (the others wait, ``validating``).
It held every line and every answer of a batch until its end, with no cap on batches at once. Without
Kafka: the batch topic is held in memory and the chat answers come from a stand-in after a short delay."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from schemas.envelope import Origin
from tests.async_helpers import run_bounded, serving_app
from tests.pipeline.chat_stand_in import ChatCall, ChatStandIn
from tests.pipeline.memory_stores import MemoryBatchStore
from worker.pipeline.apis import batch_run, batch_store
from worker.pipeline.apis.batch import BatchApi
from worker.pipeline.apis.chat_source import JsonDict
from worker.settings import GatewayOptions

WINDOW = 8
LINES = 300
BAD_LINE = 17  # not JSON: its answer is an error line


class DelayedChat(ChatStandIn):
    """Answers every chat after a random few milliseconds; counts the requests open at once."""

    def __init__(self, max_delay_s: float = 0.004, **settings: Any) -> None:
        super().__init__(GatewayOptions(allow_no_api_key=True, batch_window=WINDOW, **settings))
        self.max_delay_s = max_delay_s
        self.open = 0
        self.peak_open = 0
        self.asked: list[str] = []
        self.origins: list[Origin | None] = []
        self.topic: list[tuple[str, bytes]] = []  # the batch topic's log, to place each send in it
        self.sends: list[tuple[int, int, int]] = []  # (line, time in ms, records on the topic before it)

    async def answer(self, call: ChatCall) -> AsyncGenerator[JsonDict, None]:
        request_id, origin = call.request_id, call.origin
        self.asked.append(str(request_id))
        self.origins.append(origin)
        line = int(str(request_id).rsplit("-", 1)[1])
        self.sends.append((line, int(time.time() * 1000), len(self.topic)))
        self.open += 1
        self.peak_open = max(self.peak_open, self.open)
        try:
            await asyncio.sleep(random.uniform(0, self.max_delay_s))
            yield {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "choices": []}
        finally:
            self.open -= 1

    def new_request_id(self, prefix: str = "") -> str:
        return f"{prefix}{len(self.asked)}"


def input_file(lines: int) -> bytes:
    rows = [
        b"{not json" if i == BAD_LINE else orjson.dumps({"custom_id": f"line-{i}", "body": {"model": "m"}})
        for i in range(lines)
    ]
    return b"\n".join(rows) + b"\n"


class Gateway:
    """The batch routes on a loopback port, over an in-memory batch topic."""

    def __init__(self, source: DelayedChat, files: dict[str, bytes]) -> None:
        self.store = MemoryBatchStore(files)
        self.api = BatchApi(source, self.store)
        self.app = web.Application()
        self.app.router.add_post("/v1/batches", self.api.create_batch)
        self.app.router.add_get("/v1/batches/{batch_id}", self.api.retrieve_batch)
        self.app.router.add_get("/v1/files/{file_id}/content", self.api.file_content)
        self.peak_held = 0

    async def create(self, session: aiohttp.ClientSession, port: int, file_id: str) -> JsonDict:
        body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        async with session.post(f"http://127.0.0.1:{port}/v1/batches", json=body) as response:
            assert response.status == 200, await response.text()
            batch: JsonDict = await response.json()
            return batch

    async def finished(self, session: aiohttp.ClientSession, port: int, batch_id: str) -> JsonDict:
        while True:
            self.peak_held = max(self.peak_held, self.api.held_lines())
            async with session.get(f"http://127.0.0.1:{port}/v1/batches/{batch_id}") as response:
                batch: JsonDict = await response.json()
            if batch["status"] in batch_store.FINAL:
                return batch
            await asyncio.sleep(0.001)

    async def content(self, session: aiohttp.ClientSession, port: int, file_id: str) -> list[JsonDict]:
        async with session.get(f"http://127.0.0.1:{port}/v1/files/{file_id}/content") as response:
            assert response.status == 200
            return [orjson.loads(line) for line in (await response.read()).splitlines()]


def test_a_batch_holds_at_most_its_window_and_writes_its_answers_in_chunks_as_they_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(batch_run, "CHUNK_BYTES", 2048)  # many chunks from a small batch
    source = DelayedChat()
    gateway = Gateway(source, {"file-in": input_file(LINES)})

    async def scenario() -> tuple[JsonDict, list[JsonDict], list[JsonDict]]:
        async with serving_app(gateway.app) as port, aiohttp.ClientSession() as session:
            created = await gateway.create(session, port, "file-in")
            assert created["status"] == "in_progress" and "lease" not in created and "run" not in created
            done = await gateway.finished(session, port, created["id"])
            out = await gateway.content(session, port, done["output_file_id"])
            errors = await gateway.content(session, port, done["error_file_id"])
            return done, out, errors

    done, out, errors = run_bounded(scenario(), 60)
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": LINES, "completed": LINES - 1, "failed": 1}
    # Every line once, in input order; each request asked once.
    assert [row["custom_id"] for row in out] == [f"line-{i}" for i in range(LINES) if i != BAD_LINE]
    assert [row["id"] for row in errors] == [f"batch_req_{BAD_LINE}"]
    # Each line's request names its batch and line, for consume --assemble and audit.
    assert [(o.api, o.id, o.line) if o else None for o in source.origins] == [
        ("batch", done["id"], int(rid.rsplit("-", 1)[1])) for rid in source.asked
    ]
    assert sorted(source.asked) == sorted(f"{done['id']}-{i}" for i in range(LINES) if i != BAD_LINE)
    # Bounded: never more than the window open upstream, nor held by the run.
    assert 1 < source.peak_open <= WINDOW
    assert 1 < gateway.peak_held <= WINDOW
    # Written out while it ran: the output's chunks are on the topic before the batch's last record.
    keys = [key for key, _ in gateway.store.log]
    out_id = done["output_file_id"]
    chunks = [i for i, key in enumerate(keys) if key.startswith(f"file:{out_id}:")]
    assert len(chunks) >= 5
    progress = [i for i, key in enumerate(keys) if key == f"batch:{done['id']}"]
    assert chunks[0] < progress[len(progress) // 2]  # the first chunk went out early in the run


def test_batches_past_the_cap_wait_validating_and_then_run() -> None:
    source = DelayedChat(batch_max_running=1)
    gateway = Gateway(source, {"file-in": input_file(40)})

    async def scenario() -> list[tuple[str, JsonDict]]:
        async with serving_app(gateway.app) as port, aiohttp.ClientSession() as session:
            first = await gateway.create(session, port, "file-in")
            second = await gateway.create(session, port, "file-in")
            statuses = [first["status"], second["status"]]
            assert statuses == ["in_progress", "validating"]
            assert second["in_progress_at"] is None
            ends = [await gateway.finished(session, port, b["id"]) for b in (first, second)]
            return [(b["status"], b["request_counts"]) for b in ends]

    counts = {"total": 40, "completed": 39, "failed": 1}
    assert run_bounded(scenario(), 60) == [("completed", counts), ("completed", counts)]
    assert source.peak_open <= WINDOW  # one batch at a time


def test_each_batch_record_bounds_which_lines_were_sent_and_since_when(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a takeover relies on: no line at or past ``submitted`` was sent before the record saying so,
    and every line sent and not yet in the files was sent at or after ``since_ms``."""
    monkeypatch.setattr(batch_run, "FLUSH_EVERY_S", 0.01)  # many records while lines are in flight
    source = DelayedChat(max_delay_s=0.03)  # lines sent milliseconds apart
    gateway = Gateway(source, {"file-in": input_file(LINES // 3)})
    source.topic = gateway.store.log

    async def scenario() -> str:
        async with serving_app(gateway.app) as port, aiohttp.ClientSession() as session:
            created = await gateway.create(session, port, "file-in")
            done = await gateway.finished(session, port, created["id"])
            assert done["status"] == "completed"
            return str(created["id"])

    batch_id = run_bounded(scenario(), 60)
    records = [
        (position, orjson.loads(value)["run"])
        for position, (key, value) in enumerate(gateway.store.log)
        if key == f"batch:{batch_id}"
    ]
    assert len(source.sends) == LINES // 3 - 1
    for line, _, before in source.sends:
        latest = [run for position, run in records if position < before][-1]
        assert line < latest["submitted"]
    for position, run in records:
        for line, at_ms, before in source.sends:
            if before <= position and run["flushed"] <= line < run["submitted"]:
                assert at_ms >= run["since_ms"], (line, run)
