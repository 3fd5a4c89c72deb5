"""A stand-in for the gateway as the API handlers see it (``worker.pipeline.apis.chat_source.ChatSource``),
so a handler test writes only how its chat answers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from aiohttp import web

from schemas.envelope import Origin
from worker.pipeline.apis.chat_source import JsonDict
from worker.pipeline.connection import Connection
from worker.runtime.observability.tracing import NO_HEADERS, Headers
from worker.settings import GatewayOptions


@dataclass(frozen=True)
class ChatCall:
    """What one ``chat()`` was asked."""

    body: JsonDict
    request_id: str | None
    client: str
    origin: Origin | None
    durable: bool


class ChatStandIn:
    """``chat()`` notes its call and answers with ``answer(call)``, which a test writes; the rest of
    the protocol does what the gateway does where a handler test does not look."""

    def __init__(self, settings: GatewayOptions) -> None:
        self.settings = settings
        self.connection: Connection = None  # type: ignore[assignment]  # no handler under test reads Kafka
        self.closing = False
        self.calls: list[ChatCall] = []

    def chat(
        self,
        body: JsonDict,
        trace: Headers,
        request_id: str | None = None,
        client: str = "-",
        origin: Origin | None = None,
        durable: bool = False,
    ) -> AsyncGenerator[JsonDict, None]:
        call = ChatCall(body, request_id, client, origin, durable)
        self.calls.append(call)
        return self.answer(call)

    def answer(self, call: ChatCall) -> AsyncGenerator[JsonDict, None]:
        raise NotImplementedError

    def new_request_id(self, prefix: str = "") -> str:
        return prefix + uuid.uuid4().hex

    def cancel(self, request_id: str) -> None:
        pass

    async def read_body(self, http: web.Request) -> bytes:
        return await http.read()

    def trace(self, http: web.Request) -> Headers:
        return NO_HEADERS
