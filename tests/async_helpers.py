"""Running a test's coroutine from a plain test function (no async pytest plugin)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_bounded(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """``asyncio.run(coro)``, failed with ``TimeoutError`` once ``timeout_s`` pass."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout_s):
            return await coro

    return asyncio.run(bounded())
