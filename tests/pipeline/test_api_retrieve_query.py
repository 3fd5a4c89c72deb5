"""GET /v1/responses/{id}?stream=true&starting_after=N with an N that is no integer is a 400 JSON
answer: '²' and '--5' passed the handler's isdigit() check and int() raised, a text/plain 500.
Without Kafka: the stored response is held in memory."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import aiohttp
import pytest
from aiohttp import web

from tests.async_helpers import serving_app
from tests.pipeline.memory_stores import MemoryResponsesStore
from tests.pipeline.test_api_admitted_client import RecordingChat
from worker.pipeline.apis.routes import ResponsesApi

RESPONSE_ID = "resp_1"
DONE = {"id": RESPONSE_ID, "object": "response", "status": "completed"}
EVENT = {"type": "response.completed", "sequence_number": 0, "response": DONE}


async def retrieve(starting_after: str) -> tuple[int, str, bytes]:
    store = MemoryResponsesStore()
    store.records = OrderedDict({RESPONSE_ID: {"response": DONE, "messages": [], "events": [EVENT]}})
    app = web.Application()
    app.router.add_get("/v1/responses/{response_id}", ResponsesApi(RecordingChat(), store).retrieve)
    async with serving_app(app) as port:
        url = f"http://127.0.0.1:{port}/v1/responses/{RESPONSE_ID}"
        query = {"stream": "true", "starting_after": starting_after}
        async with aiohttp.ClientSession() as session, session.get(url, params=query) as response:
            return response.status, response.content_type, await response.read()


@pytest.mark.parametrize("after", ["²", "--5", "x"])
def test_a_starting_after_that_is_no_integer_is_a_400(after: str) -> None:
    status, content_type, _ = asyncio.run(retrieve(after))
    assert (status, content_type) == (400, "application/json")


def test_an_integer_starting_after_streams_the_events_after_it() -> None:
    status, content_type, body = asyncio.run(retrieve("-1"))
    assert (status, content_type) == (200, "text/event-stream")
    assert body.startswith(b"event: response.completed\n")
    status, _, body = asyncio.run(retrieve("0"))
    assert status == 200 and body == b""
