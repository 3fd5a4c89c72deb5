"""``derender-worker gateway``: an OpenAI-compatible HTTP front for the pipeline.

``POST /v1/chat/completions`` and ``POST /v1/completions`` (streaming as SSE with ``data: [DONE]``, or
one JSON response), ``GET /v1/models``, ``GET /healthz``. Each request is checked and admitted
(``gateway_admission``), written to the requests topic as a ``RequestEnvelope`` and answered from the
worker's output records, read with ``read_committed`` as they arrive (``gateway_delivery``). A request
that does not end as a success (the client went away, an error, a timeout, a slow client, SIGTERM)
makes the gateway write a cancel record, which makes ``ingest`` abort the generation upstream.

Another API in front of the same pipeline (a module of its own) uses ``Gateway.exchange``: it
admits a chat or completion body, sends it, and gives a ``Delivery`` to read the answer from; the
route table is ``Gateway.app``, to which a module adds its routes with ``Gateway.add_routes``.

Finding the outputs (``gateway_routing``): replicas share the output partitions through a consumer
group and mint request ids whose keys hash to partitions they own, so each replica reads its share of
the output topic, plus the partitions of any of its requests whose id it could not choose;
docs/gateway.md#scaling-and-its-cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from schemas.envelope import Origin
from schemas.pipeline import CancelRecord
from worker import stop_signals
from worker.errors import KafkaClientError
from worker.pipeline.apis.routes import add_api_routes
from worker.pipeline.connection import Connection, add_connection_arguments, wait_for_topics
from worker.pipeline.gateway_admission import Admitted, Budget, Endpoint, Refused, admit_body, error_body
from worker.pipeline.gateway_delivery import Delivery, Mailbox, SseWriter, shutdown_error, stream_ids
from worker.pipeline.gateway_edge import ANONYMOUS, API_KEY_NAME, ApiKeys, edge_trace
from worker.pipeline.gateway_routing import ReplyRouting
from worker.runtime.kafka_client.base import AckedProducer, OutgoingRecord
from worker.runtime.observability.structured_logging import configure
from worker.runtime.observability.tracing import NO_HEADERS, Headers
from worker.settings import GatewayOptions, LoggingSettings, add_arguments, load

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
_READ_CHUNK = 64 * 1024


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def error_response(error: JsonDict) -> web.Response:
    """An error record's ``error`` as vLLM answers it: its code is the HTTP status."""
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    return json_response({"error": error}, status)


def refused_response(refused: Refused) -> web.Response:
    headers = {"Retry-After": str(refused.retry_after_s)} if refused.retry_after_s is not None else None
    return json_response(refused.body, refused.status, headers)


@dataclass
class Exchange:
    """One request in flight: read its answer from ``delivery``; ``succeeded()`` once it was given
    whole, otherwise leaving the ``exchange`` block cancels it upstream."""

    request_id: str
    delivery: Delivery
    ok: bool = False

    def succeeded(self) -> None:
        self.ok = True


class Gateway:
    def __init__(self, settings: GatewayOptions, connection: Connection) -> None:
        self.settings = settings
        self.connection = connection
        self.keys = ApiKeys(settings.api_keys)
        self.budget = Budget(settings)
        self.mailboxes: dict[str, Mailbox] = {}  # by output record key (request id, or request-prompt)
        self.open: dict[str, Mailbox] = {}  # by request id
        self.durable: set[str] = set()  # the open requests a stop hands over (``chat(durable=True)``)
        self.producer: AckedProducer | None = None
        self.routing = ReplyRouting(
            settings.output_topic,
            connection,
            self._deliver,
            mode=settings.reply_routing,
            group_id=settings.reply_group_id,
            refresh_s=settings.output_partition_refresh_s,
        )
        self._cancels: set[asyncio.Task[None]] = set()
        self._routes: list[Callable[[web.Application], None]] = []
        self.ready = False
        self.closing = False
        self.started = int(time.time())

    # --- Kafka -------------------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        await wait_for_topics(self.connection, s.requests_topic, s.output_topic)
        self.producer = self.connection.acked_producer()
        await self.producer.start()
        await self.routing.start()
        self.routing.add_done_callback(self._reader_ended)
        self.ready = True

    def _reader_ended(self, task: asyncio.Task[None]) -> None:
        """Without its reader the gateway cannot answer: say so on /healthz, and in the log."""
        self.ready = False
        if not task.cancelled() and task.exception() is not None:
            log.error("the output topic reader failed: %r", task.exception())

    async def stop(self) -> None:
        """Stop reading, then flush every cancel not yet written before the producer closes."""
        self.ready = False
        if self._cancels:  # the other half of --shutdown-timeout-s (the handlers had the first)
            await asyncio.wait(set(self._cancels), timeout=self.settings.shutdown_timeout_s / 2)
        await self.routing.stop()
        if self.producer is not None:
            await self.producer.stop()

    def _deliver(self, key: str, value: bytes) -> bool:
        """An output record, from the reader: to its open request's mailbox; False when it has none."""
        mailbox = self.mailboxes.get(key)
        if mailbox is None:
            return False
        mailbox.put(key, value)
        return True

    def new_request_id(self, prefix: str = "") -> str:
        """A chat request's id whose replies come to this replica's partitions (``gateway_routing``):
        for an API that names its requests itself (``msg_``, ``resp_``)."""
        return self.routing.mint(prefix)

    async def _send(self, request_id: str, value: bytes, trace: Headers = NO_HEADERS) -> None:
        assert self.producer is not None
        await self.producer.send_and_wait(
            OutgoingRecord(self.settings.requests_topic, key=request_id.encode(), value=value, headers=trace)
        )

    def cancel(self, request_id: str) -> None:
        """Write the cancel record from a task of its own (the caller may be being cancelled); ``stop``
        waits for it. Cancelling twice is harmless: ingest ignores a cancel of a request it ended."""
        if self.producer is None:
            return
        cancel = CancelRecord(request_id=request_id, cancel=True).model_dump_json().encode()
        task = asyncio.get_running_loop().create_task(self._send(request_id, cancel))
        self._cancels.add(task)
        task.add_done_callback(self._cancel_sent)

    def _cancel_sent(self, task: asyncio.Task[None]) -> None:
        self._cancels.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a cancel record could not be written: %r", task.exception())

    # --- one request, for any API ------------------------------------------------------------------

    def exchange(
        self, http: web.Request, admitted: Admitted
    ) -> contextlib.AbstractAsyncContextManager[Exchange]:
        """Admit ``admitted`` against the budget (``Refused``: 429/503), write it to the requests topic
        and yield its ``Exchange``; on leaving, free its share and, unless it succeeded, cancel it."""
        return self._exchange(http.get(API_KEY_NAME, ANONYMOUS), self.trace(http), admitted)

    def trace(self, http: web.Request) -> Headers:
        """The trace context a client's request passes on (cut at the edge, ``gateway_edge``)."""
        return edge_trace(http.headers, self.settings)

    @contextlib.asynccontextmanager
    async def _exchange(
        self,
        client: str,
        trace: Headers,
        admitted: Admitted,
        request_id: str | None = None,
        origin: Origin | None = None,
        durable: bool = False,
    ) -> AsyncIterator[Exchange]:
        if self.closing:
            raise Refused(503, error_body(503, "the gateway is shutting down", "ServiceUnavailableError"), 1)
        ticket = self.budget.admit(client, admitted.size)
        request_id = request_id or self.routing.mint("", lambda rid: {rid, *stream_ids(rid, admitted)})
        mailbox = Mailbox(self.settings.max_queued_bytes, ticket.add, lambda: self.cancel(request_id))
        delivery = Delivery(request_id, admitted, mailbox, self.settings.request_timeout_s)
        keys = {request_id, *delivery.stream_ids}
        for key in keys:
            self.mailboxes[key] = mailbox
        self.open[request_id] = mailbox
        if durable:
            self.durable.add(request_id)
        exchange = Exchange(request_id, delivery)
        sent = False
        route = None
        try:
            route = await self.routing.open(sorted(keys))  # read before anything is written
            # The body is JSON already checked: spliced in, not serialized again.
            envelope = b'{"request_id":%s,"endpoint":"%s",%s"request":%s%s}' % (
                orjson.dumps(request_id),
                admitted.endpoint.encode(),
                b""
                if origin is None
                else b'"origin":%s,' % origin.model_dump_json(exclude_none=True).encode(),
                admitted.raw,
                self._deadline(admitted),
            )
            await self._send(request_id, envelope, trace)
            sent = True
            yield exchange
        finally:
            for key in keys:
                self.mailboxes.pop(key, None)
            self.open.pop(request_id, None)
            self.durable.discard(request_id)
            if route is not None:
                self.routing.close(route)
            mailbox.end(shutdown_error())  # drops whatever is still queued
            ticket.release()
            # A durable request left as the gateway stops is handed over: its generation goes on.
            if sent and not exchange.ok and not (durable and self.closing):
                self.cancel(request_id)

    def _deadline(self, admitted: Admitted) -> bytes:
        """When ingest may give up on the request: past the request timeout its client has had its 504.
        A one-shot's answer is one record, so it gets ``deadline_ms`` (not started, or aborted, after
        it). A stream gets ``start_by_ms``: the timeout runs between records, so a long stream may
        rightly outlive it, but its first record is waited for no longer, so it must start by then."""
        at = int((time.time() + self.settings.request_timeout_s) * 1000)
        return b',"start_by_ms":%d' % at if admitted.stream else b',"deadline_ms":%d' % at

    async def chat(
        self,
        body: JsonDict,
        trace: Headers = NO_HEADERS,
        request_id: str | None = None,
        client: str = ANONYMOUS,
        origin: Origin | None = None,
        durable: bool = False,
    ) -> AsyncGenerator[JsonDict, None]:
        """One chat request for the other APIs (``worker.pipeline.apis``), admitted like any other: its
        chunks (``stream: true``) or its one response body, or a last ``{"error": ...}`` (a refusal's
        too). Closing it before its end cancels the generation upstream, unless it is ``durable`` and
        the gateway is stopping (its owner hands it over). ``origin`` names the API and its object on
        the request record, for readers of the topics."""
        try:
            admitted = admit_body(orjson.dumps(body), "chat", self.settings)
            async with self._exchange(client, trace, admitted, request_id, origin, durable) as exchange:
                if admitted.stream:
                    async for event in exchange.delivery.events():
                        yield event
                        if "error" in event:
                            return
                else:
                    answer = await exchange.delivery.result()
                    if "error" not in answer:
                        # Whole already: a caller closes this after the answer, which is no cancel (ingest
                        # would keep a cancel of an ended request among its early cancels, bounded).
                        exchange.succeeded()
                    yield answer
                    return
                exchange.succeeded()
        except Refused as refused:
            yield {"error": refused.body["error"]}
        except KafkaClientError as exc:
            log.warning("a request could not be queued on %s: %r", self.settings.requests_topic, exc)
            yield {
                "error": error_body(503, "the request could not be queued", "ServiceUnavailableError")[
                    "error"
                ]
            }

    # --- HTTP --------------------------------------------------------------------------------------

    def add_routes(self, register: Callable[[web.Application], None]) -> None:
        """Another API's routes, added to the app ``app()`` builds (they get auth and the limits)."""
        self._routes.append(register)

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._auth, self._refusals], client_max_size=self.settings.max_body_bytes + 1
        )
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/healthz", self._health)
        add_api_routes(app, self)
        for register in self._routes:
            register(app)
        return app

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            name = self.keys.identify(request.headers.get("Authorization"))
            if name is None and "x-api-key" in request.headers:  # the Anthropic SDKs' header
                name = self.keys.identify(f"Bearer {request.headers['x-api-key']}")
            if name is None:
                return json_response(error_body(401, "Unauthorized", "AuthenticationError"), 401)
            request[API_KEY_NAME] = name
        return await handler(request)

    @web.middleware
    async def _refusals(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """A request refused while a handler reads or admits it (body too large or too slow, full)."""
        try:
            return await handler(request)
        except Refused as refused:
            return refused_response(refused)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        ok = self.ready and self.routing.alive and not self.closing
        return web.Response(text="ok" if ok else "unavailable", status=200 if ok else 503)

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
        return json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completion")

    async def read_body(self, http: web.Request) -> bytes:
        """The request body, at most ``--max-body-bytes`` (413) read within ``--body-timeout-s`` (408)."""
        limit = self.settings.max_body_bytes
        if http.content_length is not None and http.content_length > limit:
            raise Refused(
                413, error_body(413, f"the request body is over {limit} bytes", "RequestEntityTooLarge")
            )
        pieces: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                while piece := await http.content.read(_READ_CHUNK):
                    size += len(piece)
                    if size > limit:
                        raise Refused(
                            413,
                            error_body(
                                413, f"the request body is over {limit} bytes", "RequestEntityTooLarge"
                            ),
                        )
                    pieces.append(piece)
        except TimeoutError:
            timeout = self.settings.body_timeout_s
            raise Refused(
                408, error_body(408, f"the request body took over {timeout:g}s", "RequestTimeout")
            ) from None
        return b"".join(pieces)

    async def admit(self, http: web.Request, endpoint: Endpoint) -> Admitted:
        """Read and check a chat or completion request (``Refused`` when it may not run)."""
        return admit_body(await self.read_body(http), endpoint, self.settings)

    async def _serve(self, http: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        try:
            admitted = await self.admit(http, endpoint)
            async with self.exchange(http, admitted) as exchange:
                if admitted.stream:
                    return await self._stream(http, exchange)
                return await self._one_shot(http, exchange)
        except Refused as refused:
            return refused_response(refused)
        except KafkaClientError as exc:  # not written: nothing runs, the client may retry
            log.warning("a request could not be queued on %s: %r", self.settings.requests_topic, exc)
            return refused_response(
                Refused(503, error_body(503, "the request could not be queued", "ServiceUnavailableError"), 1)
            )

    async def _one_shot(self, http: web.Request, exchange: Exchange) -> web.StreamResponse:
        answer = await exchange.delivery.result()
        if "error" in answer:
            return error_response(answer["error"])
        # Written here, within the write timeout and while the request holds its share of the budget:
        # left to aiohttp, an answer of many MiB would wait for a client that never reads, unbounded.
        response = json_response(answer)
        try:
            async with asyncio.timeout(self.settings.write_timeout_s):
                await response.prepare(http)
                await response.write_eof()
        except TimeoutError:
            log.info(
                "request %s: the answer waited over %gs for its client; ended",
                exchange.request_id,
                self.settings.write_timeout_s,
            )
            if http.transport is not None:
                http.transport.close()
            return response
        exchange.succeeded()
        return response

    async def _stream(self, http: web.Request, exchange: Exchange) -> web.StreamResponse:
        events = exchange.delivery.events()
        first = await anext(events, None)
        if first is not None and "error" in first:  # nothing sent yet: a plain HTTP error, as vLLM
            return error_response(first["error"])
        writer = await SseWriter.open(http, self.settings.write_timeout_s)
        event = first
        failed = False
        try:
            while event is not None:
                await writer.event(event)
                if "error" in event:
                    failed = True
                    break
                event = await anext(events, None)
            await writer.close()
        except TimeoutError:  # the client stopped reading: leaving the exchange cancels the request
            log.info("request %s: a write waited over %gs; ended", exchange.request_id, writer.timeout_s)
            if http.transport is not None:
                http.transport.close()
            return writer.response
        if not failed:
            exchange.succeeded()
        return writer.response

    async def shut_down(self) -> None:
        """SIGTERM: refuse new requests, end every open one with an error event and cancel it, except
        the durable ones: their owners (background responses, batches) release them to another replica."""
        self.closing = True
        for request_id, mailbox in list(self.open.items()):
            if request_id not in self.durable:
                mailbox.end(shutdown_error())


# --- the command ------------------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gateway = commands.add_parser("gateway", help="OpenAI-compatible HTTP server in front of the pipeline")
    add_arguments(gateway, GatewayOptions)
    add_connection_arguments(gateway, producing=True)
    add_arguments(gateway, LoggingSettings)
    gateway.set_defaults(handler=_gateway, graceful_stop=True)


def _gateway(args: argparse.Namespace) -> int:
    configure(load(LoggingSettings, args))
    settings = load(GatewayOptions, args)
    connection = Connection.from_args(args, "gateway")

    async def main() -> int:
        stop = asyncio.Event()
        stop_signals.hand_over(asyncio.get_running_loop(), stop.set)
        gateway = Gateway(settings, connection)
        # Start-up waits for the topics to exist, without end: a stop meanwhile must not wait for it.
        if not await stop_signals.finished_before(asyncio.ensure_future(gateway.start()), stop):
            await gateway.stop()
            log.info("stopped before serving")
            return 0
        # A client that disconnects cancels its handler, which writes the cancel record. Idle and
        # slow connections: aiohttp closes one that has not sent its headers within keepalive_timeout.
        runner = web.AppRunner(
            gateway.app(),
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=settings.header_timeout_s,
            shutdown_timeout=settings.shutdown_timeout_s / 2,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, settings.host, settings.port).start()
            log.info("gateway serving on %s:%d", settings.host, settings.port)
            await stop.wait()
            log.info(
                "stopping: %d open request(s) end and are cancelled, %d are handed over",
                len(gateway.open) - len(gateway.durable),
                len(gateway.durable),
            )
        finally:
            await gateway.shut_down()
            # Bounded below the pod's grace period: the handlers end (writing their cancels), the
            # background responses and batches release their leases, then stop() flushes every
            # cancel before the producer closes.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settings.shutdown_timeout_s / 2):
                    await runner.cleanup()
            await gateway.stop()
        return 0

    return asyncio.run(main())
