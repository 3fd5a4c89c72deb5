"""What the API front ends need of the gateway: one chat request run through the pipeline."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

from aiohttp import web

from schemas.envelope import Origin
from worker.pipeline.connection import Connection
from worker.runtime.observability.tracing import Headers
from worker.settings import GatewayOptions

JsonDict = dict[str, Any]


class ChatSource(Protocol):
    """The gateway, as the other APIs use it (``worker.pipeline.gateway.Gateway``)."""

    settings: GatewayOptions
    connection: Connection

    def chat(
        self,
        body: JsonDict,
        trace: Headers,
        request_id: str | None = None,
        client: str = "-",
        origin: Origin | None = None,
        durable: bool = False,
    ) -> AsyncGenerator[JsonDict, None]:
        """The chat request's chunks (``stream: true``) or its one response body, or a last
        ``{"error": ...}``, admitted against ``client``'s share of the gateway's limits. Closing the
        iterator before its end cancels the generation upstream. ``origin`` (the API and its object
        id) is written on the request record, so ``consume --assemble`` and ``audit`` can name it.
        ``durable``: its answer is read back by another replica if this one stops (a background
        response's, a batch line's), so a graceful stop neither ends it with an error nor cancels it."""
        ...

    def new_request_id(self, prefix: str = "") -> str:
        """A new request id starting with ``prefix``, chosen so its answer comes back to this gateway
        replica's share of the output topic (``worker.pipeline.gateway_routing``)."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop the generation of a chat request sent with ``request_id`` (idempotent)."""
        ...

    async def read_body(self, http: web.Request) -> bytes:
        """The request body within the gateway's size and time limits (raises its ``Refused``)."""
        ...

    def trace(self, http: web.Request) -> Headers:
        """The trace context a client's request passes on."""
        ...


def closing(source: ChatSource) -> bool:
    """Whether the gateway is stopping (SIGTERM): it takes nothing new, and durable work is handed over
    (a stand-in source without the flag never stops)."""
    return bool(getattr(source, "closing", False))


class BadRequest(ValueError):
    """A client's request the conversion cannot take: answered with a 400 naming the reason."""


def text_of(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be a string")
    return value


def list_of(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadRequest(f"{what} must be a list")
    return value


def dict_of(value: Any, what: str) -> JsonDict:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be an object")
    return value


def chat_delta(chunk: JsonDict) -> tuple[JsonDict, str | None, Any]:
    """The first choice's delta, finish reason and stop reason of a chat chunk (``{}`` when it has none)."""
    choices = chunk.get("choices") or []
    if not choices:
        return {}, None, None
    choice = choices[0]
    return choice.get("delta") or {}, choice.get("finish_reason"), choice.get("stop_reason")
