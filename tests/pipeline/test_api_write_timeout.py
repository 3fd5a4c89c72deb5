"""The Responses and Messages streams end a client that reads nothing within the write timeout, as the
chat stream does, and close their chat (which cancels the generation upstream); their one-shot answers
are written within it too. Without Kafka: the handlers run on a chat source that answers forever, or
once with a large answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

import pytest
from aiohttp import web

from tests.async_helpers import post_json, serving_app
from tests.pipeline.chat_stand_in import ChatCall, ChatStandIn
from worker.pipeline.apis.chat_source import JsonDict
from worker.pipeline.apis.routes import MessagesApi, ResponsesApi
from worker.settings import GatewayOptions

WRITE_TIMEOUT_S = 1.0


class EndlessChat(ChatStandIn):
    """A chat source whose stream never ends: each chunk carries 64 KiB of content."""

    def __init__(self) -> None:
        super().__init__(GatewayOptions(allow_no_api_key=True, write_timeout_s=WRITE_TIMEOUT_S))
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def answer(self, call: ChatCall) -> AsyncGenerator[JsonDict, None]:
        try:
            while True:
                delta = {"role": "assistant", "content": "x" * 65536}
                yield {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
                await asyncio.sleep(0)
        finally:
            if not self.closed.done():
                self.closed.set_result(None)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def ended_after_a_silent_client(
    make: Callable[[EndlessChat], Handler], path: str, body: JsonDict
) -> float:
    """Seconds from a client that sends its request and never reads to its chat being closed."""
    source = EndlessChat()
    app = web.Application()
    app.router.add_post(path, make(source))
    async with serving_app(app) as port:
        _reader, writer = await post_json(port, path, body)
        started = time.monotonic()
        try:
            async with asyncio.timeout(30):
                await source.closed
        finally:
            writer.close()
        return time.monotonic() - started


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("/v1/responses", {"model": "m", "input": "hi", "stream": True, "store": False}),
    ],
)
def test_a_stream_whose_client_reads_nothing_ends_within_the_write_timeout(path: str, body: JsonDict) -> None:
    def make(source: EndlessChat) -> Handler:
        if path == "/v1/messages":
            return MessagesApi(source).create
        return ResponsesApi(source, None).create

    took = asyncio.run(ended_after_a_silent_client(make, path, body))
    # The socket buffers fill within a few chunks; then one write waits the timeout and ends it.
    assert took < WRITE_TIMEOUT_S + 10


class OneLargeAnswer(EndlessChat):
    """Answers once, with 16 MiB of content."""

    async def answer(self, call: ChatCall) -> AsyncGenerator[JsonDict, None]:
        message = {"role": "assistant", "content": "x" * (16 * 1024 * 1024)}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        yield {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": usage,
        }


async def connection_closed_after_a_silent_client(
    make: Callable[[EndlessChat], Handler], path: str, body: JsonDict
) -> bool:
    """Whether the gateway closes the connection of a client that sent its request and read nothing
    for a while (kept alive, it would stay open once read)."""
    source = OneLargeAnswer()
    app = web.Application()
    app.router.add_post(path, make(source))
    async with serving_app(app) as port:
        reader, writer = await post_json(port, path, body)
        await asyncio.sleep(WRITE_TIMEOUT_S + 3)
        try:
            async with asyncio.timeout(15):
                while await reader.read(1 << 20):
                    pass
            return True
        except TimeoutError:
            return False
        finally:
            writer.close()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"model": "m", "input": "hi", "store": False}),
    ],
)
def test_a_one_shot_answer_whose_client_reads_nothing_ends_within_the_write_timeout(
    path: str, body: JsonDict
) -> None:
    def make(source: EndlessChat) -> Handler:
        if path == "/v1/messages":
            return MessagesApi(source).create
        return ResponsesApi(source, None).create

    assert asyncio.run(connection_closed_after_a_silent_client(make, path, body))
