"""Running a test's coroutine from a plain test function (no async pytest plugin)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import orjson
from aiohttp import web

T = TypeVar("T")


def run_bounded(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """``asyncio.run(coro)``, failed with ``TimeoutError`` once ``timeout_s`` pass."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout_s):
            return await coro

    return asyncio.run(bounded())


@contextlib.asynccontextmanager
async def serving_app(app: web.Application) -> AsyncIterator[int]:
    """``app`` served on a free loopback port (yielded), with handlers cancelled as the gateway runs
    them; cleaned up on leaving."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def post_json(port: int, path: str, body: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw HTTP/1.1 POST of ``body`` to the loopback ``port``; the connection is the caller's."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = orjson.dumps(body)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    writer.write(head.encode() + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return reader, writer
