"""What the gateway takes from a client's headers: who it is (API keys) and its trace context.

API keys are compared with ``secrets.compare_digest`` against every configured key (several keys let
an operator rotate them). The key a request matched names its share of the admission budget.

Trace context is cut at the edge: a client's ``baggage`` would be copied onto every record its
request causes, so only the members named by ``--baggage-keys`` pass, cut to ``--max-baggage-bytes``
(none by default); and a client's ``sampled`` flag would force sampling on the whole pipeline, so it
is cleared unless ``--trust-client-sampling``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from aiohttp import web

from worker.runtime.observability.tracing import BAGGAGE, TRACEPARENT, Headers, propagated
from worker.settings import GatewayOptions

ANONYMOUS = "-"
# The name of the API key a request matched (its share of the budget), set by the auth middleware.
API_KEY_NAME = web.RequestKey("api_key_name", str)


class ApiKeys:
    """The keys clients may present; with none configured, everyone is ``ANONYMOUS``."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self._keys = [(f"key-{i}", key.encode()) for i, key in enumerate(keys)]

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def identify(self, authorization: str | None) -> str | None:
        """The name of the key ``authorization`` carries (``key-0``, ...); ``None``: none of them."""
        if not self._keys:
            return ANONYMOUS
        if authorization is None or not authorization.startswith("Bearer "):
            return None
        given = authorization.removeprefix("Bearer ").encode(errors="surrogateescape")
        found = None
        for name, key in self._keys:  # every key compared, so the time does not tell which one matched
            if secrets.compare_digest(given, key):
                found = name
        return found


def edge_trace(headers: Mapping[str, str], settings: GatewayOptions) -> Headers:
    """The client's trace context as the gateway passes it on (see the module's text)."""
    kept: list[tuple[str, bytes]] = []
    for name, value in propagated(headers):
        if name == BAGGAGE:
            baggage = allowed_baggage(value, settings.baggage_keys, settings.max_baggage_bytes)
            if baggage:
                kept.append((name, baggage))
        elif name == TRACEPARENT and not settings.trust_client_sampling:
            kept.append((name, unsampled(value)))
        else:
            kept.append((name, value))
    return tuple(kept)


def allowed_baggage(value: bytes, keys: tuple[str, ...], limit: int) -> bytes:
    """The members of a W3C ``baggage`` value whose key is in ``keys``, whole, up to ``limit`` bytes."""
    if not keys or limit <= 0:
        return b""
    wanted = {key.encode() for key in keys}
    out = b""
    for member in value.split(b","):
        key = member.split(b"=", 1)[0].strip()
        if key not in wanted:
            continue
        piece = member.strip()
        joined = out + b"," + piece if out else piece
        if len(joined) > limit:
            break
        out = joined
    return out


def unsampled(traceparent: bytes) -> bytes:
    """``traceparent`` with its sampled flag cleared (the trace and parent ids stay)."""
    head, flags = traceparent[:53], traceparent[53:55]
    try:
        cleared = int(flags, 16) & ~1
    except ValueError:
        return traceparent
    return head + b"%02x" % cleared + traceparent[55:]
