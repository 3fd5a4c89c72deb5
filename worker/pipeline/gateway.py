"""``derender-worker gateway``: an OpenAI-compatible HTTP front for the pipeline.

``POST /v1/chat/completions`` and ``POST /v1/completions`` (streaming as SSE with ``data: [DONE]``, or
one JSON response), ``GET /v1/models``, ``GET /healthz``, optional ``--api-key``. Each request is
written to the requests topic as a ``RequestEnvelope`` and answered from the worker's output records,
read with ``read_committed`` as they arrive. A client that disconnects makes the gateway write a
cancel record, which makes ``ingest`` abort the generation upstream.

Finding the outputs: every replica reads every partition of the output topic from the end it saw at
start and keeps the records whose key is one of its own open requests (it minted their ids), dropping
the rest. N replicas therefore read the output topic N times; see the README for the limits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas.pipeline import CancelRecord, RequestEnvelope
from worker.pipeline.connection import Connection, add_connection_arguments, topic_partitions, wait_for_topics
from worker.runtime.tracing import NO_HEADERS, Headers, propagated
from worker.settings import GatewayOptions, LoggingSettings, add_arguments, load

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
MAX_BODY_BYTES = 16 * 1024 * 1024


def error_body(code: int, message: str, type_: str = "BadRequestError") -> JsonDict:
    """vLLM's ``ErrorResponse``."""
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error_response(error: JsonDict) -> web.Response:
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    return _json_response({"error": error}, status)


def prompt_count(request: JsonDict) -> int:
    """How many prompts a completion request has, as vLLM's render counts them."""
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and not all(isinstance(p, int) for p in prompt):
        return len(prompt)
    return 1


@dataclass
class _Stream:
    """One derender stream of a request: its outputs in ``seq`` order, ingest's error held in place."""

    seen: set[int] = field(default_factory=set)
    held_error: JsonDict | None = None  # ingest's error record, waiting for the outputs before it
    finished: set[int] = field(default_factory=set)
    usage_seen: bool = False


class _Waiter:
    """The records of one open request, as they arrive (``None``: no more will be read)."""

    def __init__(self, request_id: str, ids: list[str]) -> None:
        self.request_id = request_id
        self.ids = ids
        self.queue: asyncio.Queue[tuple[str, JsonDict]] = asyncio.Queue()


class Gateway:
    def __init__(self, settings: GatewayOptions, connection: Connection) -> None:
        self.settings = settings
        self.connection = connection
        self.waiters: dict[str, _Waiter] = {}
        self.producer: AIOKafkaProducer | None = None
        self.consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None
        self.ready = False
        self.started = int(time.time())

    # --- Kafka -------------------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        await wait_for_topics(self.connection, s.requests_topic, s.output_topic)
        self.producer = self.connection.producer(linger_ms=0)
        await self.producer.start()
        self.consumer = self.connection.consumer()
        await self.consumer.start()
        partitions = await topic_partitions(self.connection, s.output_topic)
        self.consumer.assign(partitions)
        await self.consumer.seek_to_end(*partitions)
        for tp in partitions:  # fix the start before the first request can be written
            await self.consumer.position(tp)
        self._reader = asyncio.create_task(self._read())
        self._reader.add_done_callback(self._reader_ended)
        self.ready = True

    def _reader_ended(self, task: asyncio.Task[None]) -> None:
        """Without its reader the gateway cannot answer: say so on /healthz, and in the log."""
        self.ready = False
        if not task.cancelled() and task.exception() is not None:
            log.error("the output topic reader failed: %r", task.exception())

    async def stop(self) -> None:
        self.ready = False
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self.consumer is not None:
            await self.consumer.stop()
        if self.producer is not None:
            await self.producer.stop()

    async def _read(self) -> None:
        assert self.consumer is not None
        while True:
            batches = await self.consumer.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    key = record.key.decode(errors="replace") if record.key else ""
                    waiter = self.waiters.get(key)
                    if waiter is None or record.value is None:
                        continue
                    with contextlib.suppress(orjson.JSONDecodeError):
                        value = orjson.loads(record.value)
                        if isinstance(value, dict):
                            waiter.queue.put_nowait((key, value))

    async def _send(self, request_id: str, value: bytes, trace: Headers = NO_HEADERS) -> None:
        assert self.producer is not None
        await self.producer.send_and_wait(
            self.settings.requests_topic, value=value, key=request_id.encode(), headers=list(trace) or None
        )

    def _cancel_later(self, request_id: str) -> None:
        """Write the cancel record from a task of its own: the handler is being cancelled."""
        cancel = CancelRecord(request_id=request_id, cancel=True).model_dump_json().encode()
        task = asyncio.get_running_loop().create_task(self._send(request_id, cancel))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    # --- HTTP --------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/healthz", self._health)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        key = self.settings.api_key
        if (
            key
            and request.path.startswith("/v1/")
            and request.headers.get("Authorization") != f"Bearer {key}"
        ):
            return _json_response(error_body(401, "Unauthorized", "AuthenticationError"), 401)
        response: web.StreamResponse = await handler(request)
        return response

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok" if self.ready else "starting", status=200 if self.ready else 503)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.started,
                "owned_by": "vllm",
                "root": name,
                "parent": None,
            }
            for name in self.settings.served_model_names
        ]
        return _json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completion")

    async def _serve(self, http: web.Request, endpoint: str) -> web.StreamResponse:
        try:
            body = orjson.loads(await http.read())
        except orjson.JSONDecodeError as exc:
            return _json_response(error_body(400, f"JSON decode error: {exc}"), 400)
        if not isinstance(body, dict):
            return _json_response(error_body(400, "the request body must be a JSON object"), 400)
        request_id = uuid.uuid4().hex
        stream = bool(body.get("stream"))
        count = prompt_count(body) if endpoint == "completion" and stream else 1
        stream_ids = [request_id] if count == 1 else [f"{request_id}-{i}" for i in range(count)]
        waiter = _Waiter(request_id, stream_ids)
        for key in {request_id, *stream_ids}:
            self.waiters[key] = waiter
        envelope = RequestEnvelope(request_id=request_id, endpoint=endpoint, request=body)
        done = False
        try:
            # The client's W3C trace context (as vLLM honours it on its HTTP entry points) rides on.
            await self._send(request_id, envelope.model_dump_json().encode(), propagated(http.headers))
            if stream:
                response = await self._stream(http, waiter, request_id, body, count)
            else:
                response = await self._one_shot(waiter, request_id)
            done = True
            return response
        finally:
            for key in {request_id, *stream_ids}:
                self.waiters.pop(key, None)
            if not done:  # the client went away (or we failed): stop the generation upstream
                self._cancel_later(request_id)

    async def _next(self, waiter: _Waiter) -> tuple[str, JsonDict]:
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                return await waiter.queue.get()
        except TimeoutError:
            self._cancel_later(waiter.request_id)
            timeout = self.settings.request_timeout_s
            return "", {
                "error": {
                    "message": f"no answer within {timeout:g}s",
                    "type": "TimeoutError",
                    "param": None,
                    "code": 504,
                }
            }

    async def _one_shot(self, waiter: _Waiter, request_id: str) -> web.StreamResponse:
        while True:
            _, record = await self._next(waiter)
            if record.get("error") is not None:
                return _error_response(record["error"])
            body = record.get("body")
            if isinstance(body, dict) and "chunk" not in body:
                return _json_response(body)

    async def _events(self, waiter: _Waiter, body: JsonDict, count: int) -> AsyncIterator[JsonDict]:
        """The client's events in order: chunks, then possibly one error; ends when the request ended."""
        given = body.get("n")
        n = given if isinstance(given, int) and given > 0 else 1
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        streams = {sid: _Stream() for sid in waiter.ids}
        usage_total: JsonDict | None = None
        while True:
            key, record = await self._next(waiter)
            state = streams.get(key)
            error = record.get("error")
            if error is not None and (state is None or "source" in record):
                yield {"error": error}  # a timeout, an error of the whole request, or the worker's own
                return
            if state is None or not isinstance(record.get("seq"), int):
                continue  # another request's
            if error is not None and record.get("terminal") is True and record["seq"] in state.seen:
                yield {"error": error}  # ingest ended the stream at a seq already shown (it restarted)
                return
            if record["seq"] in state.seen:
                continue  # a duplicate
            if error is not None:
                state.held_error = record
            else:
                chunk = (record.get("body") or {}).get("chunk")
                if not isinstance(chunk, dict):
                    continue
                state.seen.add(record["seq"])
                position = waiter.ids.index(key)
                if count > 1:  # choices of prompt i are i*n .. i*n+n-1, as vLLM's completions number them
                    chunk = {
                        **chunk,
                        "choices": [{**c, "index": position * n + c["index"]} for c in chunk["choices"]],
                    }
                for choice in chunk["choices"]:
                    if choice.get("finish_reason") is not None:
                        state.finished.add(choice["index"])
                if not chunk["choices"] and chunk.get("usage"):
                    state.usage_seen = True
                    if count > 1:  # one usage chunk for the whole request, summed at the end
                        usage_total = _add_usage(usage_total, chunk)
                        continue
                yield chunk
            held = state.held_error
            if held is not None and all(s in state.seen for s in range(held["seq"])):
                yield {"error": held["error"]}
                return
            if all(len(s.finished) >= n and (s.usage_seen or not include_usage) for s in streams.values()):
                if usage_total is not None:
                    yield usage_total
                return

    async def _stream(
        self, http: web.Request, waiter: _Waiter, request_id: str, body: JsonDict, count: int
    ) -> web.StreamResponse:
        events = self._events(waiter, body, count)
        first = await anext(events, None)
        if first is not None and "error" in first:  # nothing sent yet: a plain HTTP error, as vLLM
            return _error_response(first["error"])
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await response.prepare(http)
        event = first
        while event is not None:
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
            if "error" in event:
                break
            event = await anext(events, None)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _add_usage(total: JsonDict | None, chunk: JsonDict) -> JsonDict:
    usage = chunk["usage"]
    if total is None:
        return {**chunk, "usage": dict(usage)}
    summed = dict(total["usage"])
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        summed[name] = (summed.get(name) or 0) + (usage.get(name) or 0)
    return {**total, "usage": summed}


# --- the command ------------------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gateway = commands.add_parser("gateway", help="OpenAI-compatible HTTP server in front of the pipeline")
    add_arguments(gateway, GatewayOptions)
    add_connection_arguments(gateway, producing=True)
    add_arguments(gateway, LoggingSettings)
    gateway.set_defaults(handler=_gateway)


def _gateway(args: argparse.Namespace) -> int:
    load(LoggingSettings, args).configure()
    settings = load(GatewayOptions, args)
    connection = Connection.from_args(args, "gateway")

    async def main() -> int:
        gateway = Gateway(settings, connection)
        await gateway.start()
        # A client that disconnects cancels its handler, which writes the cancel record.
        runner = web.AppRunner(gateway.app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, settings.host, settings.port).start()
            log.info("gateway serving on %s:%d", settings.host, settings.port)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()
            await gateway.stop()
        return 0

    return asyncio.run(main())
