"""The HTTP handlers of the APIs in ``worker.pipeline.apis``, added to the gateway's application."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from schemas.envelope import Origin
from worker.pipeline.apis import messages, responses
from worker.pipeline.apis.background import BackgroundResponses
from worker.pipeline.apis.batch import add_batch_routes
from worker.pipeline.apis.chat_source import BadRequest, ChatSource, JsonDict
from worker.pipeline.apis.responses_store import FINAL_STATUSES, ResponsesStore
from worker.pipeline.gateway_delivery import SseWriter
from worker.pipeline.gateway_edge import ANONYMOUS, API_KEY_NAME
from worker.runtime.observability.tracing import Headers

log = logging.getLogger(__name__)


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def status_of(error: JsonDict) -> int:
    code = error.get("code")
    return code if isinstance(code, int) and 400 <= code <= 599 else 500


async def read_json(http: web.Request, source: ChatSource) -> JsonDict | str:
    """The request's JSON object, or why it is not one (read within the gateway's body limits)."""
    raw = await source.read_body(http)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"JSON decode error: {exc}"
    return body if isinstance(body, dict) else "the request body must be a JSON object"


async def answered(http: web.Request, body: Any, what: str, timeout_s: float) -> web.StreamResponse:
    """A JSON answer written here within ``timeout_s`` (as the chat path's one-shot): returned to
    aiohttp, an answer of many MiB waited with no bound for a client that never reads it."""
    response = json_response(body)
    try:
        async with asyncio.timeout(timeout_s):
            await response.prepare(http)
            await response.write_eof()
    except TimeoutError:
        log.info("%s: the answer waited over %gs for its client; ended", what, timeout_s)
        if http.transport is not None:
            http.transport.close()
    return response


def abandoned(http: web.Request, writer: SseWriter | None, what: str, timeout_s: float) -> web.StreamResponse:
    """A stream whose client took no write within ``timeout_s``: the connection is closed (leaving the
    handler closes its chat, which cancels the generation upstream)."""
    log.info("%s: a write waited over %gs; ended", what, timeout_s)
    if http.transport is not None:
        http.transport.close()
    return writer.response if writer is not None else web.StreamResponse()


class MessagesApi:
    """``POST /v1/messages``."""

    def __init__(self, source: ChatSource) -> None:
        self.source = source

    async def create(self, http: web.Request) -> web.StreamResponse:
        body = await read_json(http, self.source)
        if isinstance(body, str):
            return json_response(messages.error_body(400, body), 400)
        try:
            chat = messages.to_chat_request(body)
        except BadRequest as exc:
            return json_response(messages.error_body(400, str(exc)), 400)
        # The id names the API on the topics (an audit report shows it): msg_, resp_, batch_.
        request_id = self.source.new_request_id("msg_")
        client = http.get(API_KEY_NAME, ANONYMOUS)
        origin = Origin(api="messages", id=request_id)
        answers = self.source.chat(
            chat, self.source.trace(http), request_id=request_id, client=client, origin=origin
        )
        async with contextlib.aclosing(answers):
            first = await anext(answers, None)
            if first is None or "error" in first:
                error = (first or {}).get("error") or {"message": "no answer", "code": 500}
                return json_response(
                    messages.error_body(status_of(error), str(error.get("message"))), status_of(error)
                )
            if not chat.get("stream"):
                try:
                    message = messages.to_message(first)
                except (KeyError, IndexError, TypeError, ValueError) as exc:
                    log.warning("a chat answer could not be made a message: %r", exc)
                    return json_response(messages.error_body(500, f"unconvertible answer: {exc}"), 500)
                timeout_s = self.source.settings.write_timeout_s
                return await answered(http, message, f"message {request_id}", timeout_s)
            timeout_s = self.source.settings.write_timeout_s
            writer = None
            try:
                writer = await SseWriter.open(http, timeout_s)
                stream = messages.MessageStream()
                chunk: JsonDict | None = first
                while chunk is not None:
                    if "error" in chunk:
                        events = stream.error(chunk["error"])
                        break
                    for name, data in stream.feed(chunk):
                        await writer.named(name, data)
                    chunk = await anext(answers, None)
                else:
                    events = stream.end()
                for name, data in events:
                    await writer.named(name, data)
                await writer.end()
            except TimeoutError:
                return abandoned(http, writer, f"message {request_id}", timeout_s)
            return writer.response


class ResponsesApi:
    """``POST /v1/responses``, ``GET /v1/responses/{id}`` (``?stream=true&starting_after=N``),
    ``POST /v1/responses/{id}/cancel``."""

    def __init__(self, source: ChatSource, store: ResponsesStore | None) -> None:
        self.source = source
        self.store = store
        self.background = BackgroundResponses(source, store) if store is not None else None

    def _error(self, status: int, message: str, param: str | None = None) -> web.Response:
        return json_response(responses.error_body(status, message, param), status)

    def _not_found(self, response_id: str) -> web.Response:
        return self._error(404, f"Response with id '{response_id}' not found.", "response_id")

    async def create(self, http: web.Request) -> web.StreamResponse:
        body = await read_json(http, self.source)
        if isinstance(body, str):
            return self._error(400, body)
        store = self.store if body.get("store", True) else None
        if body.get("background") and store is None:
            message = (
                "background can only be used when `store` is true (and the gateway has --responses-topic)"
            )
            return self._error(400, message, "background")
        previous = None
        previous_id = body.get("previous_response_id")
        if previous_id is not None:
            record = await self.store.get(str(previous_id)) if self.store is not None else None
            if record is None or record.get("messages") is None:
                return self._not_found(str(previous_id))
            previous = responses.Previous(record["messages"], record["response"].get("output") or [])
        try:
            chat_messages = responses.input_messages(body, previous)
            stream = bool(body.get("stream")) or bool(body.get("background"))
            chat = responses.to_chat_request(body, chat_messages, stream=stream)
        except BadRequest as exc:
            return self._error(400, str(exc))
        response_id = self.source.new_request_id("resp_")
        trace = self.source.trace(http)
        client = http.get(API_KEY_NAME, ANONYMOUS)
        if body.get("background"):
            assert store is not None
            return await self._background_start(http, body, chat, chat_messages, response_id, trace, client)
        response = responses.response_object(body, response_id, responses.now(), "in_progress")
        origin = Origin(api="responses", id=response_id)
        answers = self.source.chat(chat, trace, request_id=response_id, client=client, origin=origin)
        async with contextlib.aclosing(answers):
            first = await anext(answers, None)
            if first is None or "error" in first:
                error = (first or {}).get("error") or {"message": "no answer", "code": 500}
                return self._error(status_of(error), str(error.get("message")))
            if stream:
                return await self._stream(http, answers, first, response, chat_messages, store)
            try:
                items, finish = responses.output_items(first)
            except (KeyError, IndexError, TypeError) as exc:
                return self._error(500, f"unconvertible answer: {exc}")
            final = responses.finished(response, items, finish, first.get("usage"))
            if store is not None:
                await store.put(response_id, {"response": final, "messages": chat_messages, "events": None})
            return await answered(
                http, final, f"response {response_id}", self.source.settings.write_timeout_s
            )

    async def _stream(
        self,
        http: web.Request,
        answers: AsyncIterator[JsonDict],
        first: JsonDict,
        response: JsonDict,
        chat_messages: list[JsonDict],
        store: ResponsesStore | None,
    ) -> web.StreamResponse:
        timeout_s = self.source.settings.write_timeout_s
        writer = None
        try:
            writer = await SseWriter.open(http, timeout_s)
            converter = responses.ResponseStream(response)
            async for event in responses.converted(converter, first, answers):
                await writer.named(event["type"], event)
            if store is not None:
                record = {"response": converter.response, "messages": chat_messages, "events": None}
                await store.put(response["id"], record)
            await writer.end()
        except TimeoutError:
            return abandoned(http, writer, f"response {response['id']}", timeout_s)
        return writer.response

    async def _background_start(
        self,
        http: web.Request,
        body: JsonDict,
        chat: JsonDict,
        chat_messages: list[JsonDict],
        response_id: str,
        trace: Headers,
        client: str,
    ) -> web.StreamResponse:
        assert self.background is not None
        queued = responses.response_object(body, response_id, responses.now(), "queued")
        # Admitted against the client's own share, as its other requests are.
        await self.background.start(queued, chat, chat_messages, trace, client)
        if body.get("stream"):
            return await self._follow(http, response_id, None)
        return json_response(queued)

    async def retrieve(self, http: web.Request) -> web.StreamResponse:
        response_id = http.match_info["response_id"]
        record = await self.store.get(response_id) if self.store is not None else None
        if record is None:
            return self._not_found(response_id)
        if http.query.get("stream", "").lower() != "true":
            timeout_s = self.source.settings.write_timeout_s
            return await answered(http, record["response"], f"response {response_id}", timeout_s)
        if record.get("events") is None:
            return self._error(400, f"Response '{response_id}' has no stored events to stream", "stream")
        after = http.query.get("starting_after")
        try:  # int() itself: isdigit() passed '²' and '--5', which int() refused with a 500
            starting_after = None if after is None else int(after)
        except ValueError:
            return self._error(400, "starting_after must be an integer", "starting_after")
        return await self._follow(http, response_id, starting_after)

    async def _follow(self, http: web.Request, response_id: str, after: int | None) -> web.StreamResponse:
        """The stored events after ``after``, then each new one as the record is rewritten, to the end
        (or until nothing new came for ``--request-timeout-s``: the replica running it may be gone)."""
        assert self.store is not None
        timeout_s = self.source.settings.write_timeout_s
        writer = None
        try:
            writer = await SseWriter.open(http, timeout_s)
            sent = -1 if after is None else after
            loop = asyncio.get_running_loop()
            last_new = loop.time()
            while loop.time() - last_new < self.source.settings.request_timeout_s:
                record = self.store.records.get(response_id) or await self.store.get(response_id)
                if record is None:
                    break
                for event in record.get("events") or []:
                    if event["sequence_number"] > sent:
                        await writer.named(event["type"], event)
                        sent = event["sequence_number"]
                        last_new = loop.time()
                if record["response"].get("status") in FINAL_STATUSES:
                    break
                await self.store.changed(1.0)
            await writer.end()
        except TimeoutError:
            return abandoned(http, writer, f"response {response_id} (followed)", timeout_s)
        return writer.response

    async def cancel(self, http: web.Request) -> web.StreamResponse:
        response_id = http.match_info["response_id"]
        record = await self.store.get(response_id) if self.store is not None else None
        if record is None or self.store is None:
            return self._not_found(response_id)
        if record["response"].get("status") not in ("queued", "in_progress"):
            return self._error(400, "Cannot cancel a synchronous response.", "response_id")
        self.source.cancel(response_id)
        cancelled = {**record, "response": {**record["response"], "status": "cancelled"}}
        await self.store.put(response_id, cancelled)
        return json_response(cancelled["response"])


def add_api_routes(app: web.Application, source: ChatSource) -> None:
    app.router.add_post("/v1/messages", MessagesApi(source).create)
    settings = source.settings
    store = None
    if settings.responses_topic:
        store = ResponsesStore(
            source.connection, settings.responses_topic, settings.responses_store_max_mb * 1024 * 1024
        )
        store.runs_with(app)
    if settings.batch_topic:
        add_batch_routes(app, source, settings.batch_topic)
    api = ResponsesApi(source, store)
    if api.background is not None:
        api.background.runs_with(app)
    app.router.add_post("/v1/responses", api.create)
    app.router.add_get("/v1/responses/{response_id}", api.retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", api.cancel)
