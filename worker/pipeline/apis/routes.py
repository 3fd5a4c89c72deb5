"""The HTTP handlers of the APIs in ``worker.pipeline.apis``, added to the gateway's application."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import orjson
from aiohttp import web

from worker.pipeline.apis import messages
from worker.pipeline.apis.chat_source import BadRequest, ChatSource, JsonDict
from worker.runtime.tracing import propagated

log = logging.getLogger(__name__)

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def status_of(error: JsonDict) -> int:
    code = error.get("code")
    return code if isinstance(code, int) and 400 <= code <= 599 else 500


async def read_json(http: web.Request) -> JsonDict | str:
    """The request's JSON object, or why it is not one."""
    try:
        body = orjson.loads(await http.read())
    except orjson.JSONDecodeError as exc:
        return f"JSON decode error: {exc}"
    return body if isinstance(body, dict) else "the request body must be a JSON object"


def sse_event(name: str, data: JsonDict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class MessagesApi:
    """``POST /v1/messages``."""

    def __init__(self, source: ChatSource) -> None:
        self.source = source

    async def create(self, http: web.Request) -> web.StreamResponse:
        body = await read_json(http)
        if isinstance(body, str):
            return json_response(messages.error_body(400, body), 400)
        try:
            chat = messages.to_chat_request(body)
        except BadRequest as exc:
            return json_response(messages.error_body(400, str(exc)), 400)
        async with contextlib.aclosing(self.source.chat(chat, propagated(http.headers))) as answers:
            first = await anext(answers, None)
            if first is None or "error" in first:
                error = (first or {}).get("error") or {"message": "no answer", "code": 500}
                return json_response(
                    messages.error_body(status_of(error), str(error.get("message"))), status_of(error)
                )
            if not chat.get("stream"):
                try:
                    return json_response(messages.to_message(first))
                except (KeyError, IndexError, TypeError, ValueError) as exc:
                    log.warning("a chat answer could not be made a message: %r", exc)
                    return json_response(messages.error_body(500, f"unconvertible answer: {exc}"), 500)
            response = web.StreamResponse(headers=SSE_HEADERS)
            await response.prepare(http)
            stream = messages.MessageStream()
            chunk: JsonDict | None = first
            while chunk is not None:
                if "error" in chunk:
                    events = stream.error(chunk["error"])
                    break
                for name, data in stream.feed(chunk):
                    await response.write(sse_event(name, data))
                chunk = await anext(answers, None)
            else:
                events = stream.end()
            for name, data in events:
                await response.write(sse_event(name, data))
            await response.write_eof()
            return response


def add_api_routes(app: web.Application, source: ChatSource) -> None:
    app.router.add_post("/v1/messages", MessagesApi(source).create)
