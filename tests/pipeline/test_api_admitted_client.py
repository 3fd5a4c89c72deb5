"""A background response and a batch's lines are admitted against their client's API key, as every
other request is: they ran under the anonymous share, past the key's limits and eating the share of
key-less clients. Without Kafka: the handlers run on a chat source that records who asked, with the
stores held in memory."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

import aiohttp
from aiohttp import web

from tests.async_helpers import serving_app
from tests.pipeline.chat_stand_in import ChatCall, ChatStandIn
from tests.pipeline.memory_stores import MemoryBatchStore, MemoryResponsesStore
from worker.pipeline.apis.batch import BatchApi
from worker.pipeline.apis.chat_source import JsonDict
from worker.pipeline.apis.routes import ResponsesApi
from worker.pipeline.gateway_edge import API_KEY_NAME
from worker.settings import GatewayOptions


class RecordingChat(ChatStandIn):
    """Answers every chat with one error (as a refusal would) and notes the client it was asked for."""

    def __init__(self) -> None:
        super().__init__(GatewayOptions(allow_no_api_key=True))
        self.clients: asyncio.Queue[str] = asyncio.Queue()

    async def answer(self, call: ChatCall) -> AsyncGenerator[JsonDict, None]:
        self.clients.put_nowait(call.client)
        yield {"error": {"message": "refused", "code": 429}}


@web.middleware
async def as_alice(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    request[API_KEY_NAME] = "alice"  # what the gateway's auth middleware sets for a known key
    return await handler(request)


async def first_client(path: str, body: JsonDict) -> tuple[int, str]:
    """The status of ``body`` posted to ``path`` as alice, and the client its first chat was asked for."""
    source = RecordingChat()
    app = web.Application(middlewares=[as_alice])
    if path == "/v1/responses":
        app.router.add_post(path, ResponsesApi(source, MemoryResponsesStore()).create)
    else:
        lines = b'{"custom_id": "a", "body": {"model": "m", "messages": []}}\n'
        store = MemoryBatchStore({"file-in": lines})
        app.router.add_post(path, BatchApi(source, store).create_batch)
    async with serving_app(app) as port:
        url = f"http://127.0.0.1:{port}{path}"
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
            status = response.status
        async with asyncio.timeout(10):
            client = await source.clients.get()
        return status, client


def test_a_background_response_is_admitted_against_its_clients_key() -> None:
    body = {"model": "m", "input": "hi", "background": True}
    assert asyncio.run(first_client("/v1/responses", body)) == (200, "alice")


def test_a_batchs_lines_are_admitted_against_their_clients_key() -> None:
    body = {"input_file_id": "file-in", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    assert asyncio.run(first_client("/v1/batches", body)) == (200, "alice")


def test_a_stalled_batch_upload_ends_with_408_at_the_body_timeout() -> None:
    """``POST /v1/files`` read its multipart body with no time bound: a client that sent half of it
    held the handler for good."""
    source = RecordingChat()
    source.settings = GatewayOptions(allow_no_api_key=True, body_timeout_s=1.0)

    async def run() -> tuple[bytes, float]:
        app = web.Application()
        app.router.add_post("/v1/files", BatchApi(source, MemoryBatchStore()).create_file)
        async with serving_app(app) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = (
                "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                "Content-Length: 100000\r\n\r\n--b\r\n"
            )
            writer.write(head.encode())  # and the rest never comes
            started = time.monotonic()
            async with asyncio.timeout(20):
                status_line = await reader.readline()
            writer.close()
            return status_line, time.monotonic() - started

    status_line, took = asyncio.run(run())
    assert b" 408 " in status_line, status_line
    assert took < 10
