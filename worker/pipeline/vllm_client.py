"""A client for vLLM 0.33.0's render, generate and abort endpoints (``vllm/entrypoints/scale_out``).

Every failure comes back as an ``UpstreamError`` carrying vLLM's error object (``message``, ``type``,
``param``, ``code`` = HTTP status), so ``ingest`` can put it on the output topic as the request's
error record. A server that is unreachable or answers something that is not vLLM's protocol is a 502;
one that takes longer than its timeout is a 504; an answer larger than ``max_response_bytes`` is a 413
(it could not fit a record either). Reads are bounded: a body is read up to its cap, an SSE event up to
``MAX_EVENT_BYTES``. The request's W3C trace context goes to vLLM as HTTP headers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from worker.errors import UpstreamError
from worker.runtime.observability.tracing import TRACEPARENT, TRACESTATE, Headers

JsonDict = dict[str, Any]

# One SSE event may carry a chunk's logprobs and, on the first, the prompt ids.
MAX_EVENT_BYTES = 16 * 1024 * 1024
# A render or one-shot generate answer: past this it cannot become a record anyway.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
# An error body is only read for its message.
MAX_ERROR_BODY_BYTES = 64 * 1024
RENDER_PATHS = {"chat": "/v1/chat/completions/render", "completion": "/v1/completions/render"}
GENERATE_PATH = "/inference/v1/generate"
ABORT_PATH = "/inference/v1/abort_requests"


def error_from_body(status: int, raw: bytes) -> UpstreamError:
    """vLLM's ``ErrorResponse`` (or FastAPI's ``{"detail": ...}``) as an ``UpstreamError``."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        code = error.get("code") if isinstance(error.get("code"), int) else status
        return UpstreamError(
            code, str(error.get("message", "")), str(error.get("type") or ""), error.get("param")
        )
    detail = body.get("detail") if isinstance(body, dict) else raw[:200].decode(errors="replace")
    return UpstreamError(status, f"upstream answered HTTP {status}: {detail}")


class VllmClient:
    """Render on ``render_url``, generate and abort on ``generate_url`` (they may be one server)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        render_url: str,
        generate_url: str,
        api_key: str | None = None,
        idle_timeout_s: float = 60.0,
        *,
        render_timeout_s: float = 60.0,
        generate_timeout_s: float = 600.0,
        headers_timeout_s: float = 60.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self._session = session
        self._render_url = render_url.rstrip("/")
        self._generate_url = generate_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._idle_timeout_s = idle_timeout_s
        self._render_timeout_s = render_timeout_s
        self._generate_timeout_s = generate_timeout_s
        self._headers_timeout_s = headers_timeout_s
        self._max_response_bytes = max_response_bytes

    def _request_headers(self, trace: Headers, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Auth, JSON, and the request's trace context (vLLM honours ``traceparent``)."""
        headers = {**self._headers, "Content-Type": "application/json", **(extra or {})}
        for name, value in trace:
            if name in (TRACEPARENT, TRACESTATE):
                headers[name] = value.decode("latin-1")
        return headers

    async def _post_json(
        self, url: str, body: Any, timeout_s: float, trace: Headers = (), extra: dict[str, str] | None = None
    ) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                async with self._session.post(
                    url, data=orjson.dumps(body), headers=self._request_headers(trace, extra)
                ) as response:
                    if response.status != 200:
                        raise error_from_body(
                            response.status, await read_bounded(response, MAX_ERROR_BODY_BYTES, cut=True)
                        )
                    raw = await read_bounded(response, self._max_response_bytes)
        except aiohttp.ClientError as exc:
            raise UpstreamError(502, f"{url} is unreachable: {exc}") from exc
        except TimeoutError:
            raise UpstreamError(504, f"{url} did not answer within {timeout_s:g}s") from None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(502, f"{url} answered something that is not JSON") from exc

    async def render(
        self, endpoint: str, request: JsonDict, request_id: str, trace: Headers = ()
    ) -> list[JsonDict]:
        """The ``GenerateRequest``s for an OpenAI request: one for chat, one per prompt for completions."""
        result = await self._post_json(
            self._render_url + RENDER_PATHS[endpoint],
            request,
            self._render_timeout_s,
            trace,
            {"X-Request-Id": request_id},
        )
        rendered = result if isinstance(result, list) else [result]
        if not rendered or not all(isinstance(r, dict) and r.get("token_ids") for r in rendered):
            raise UpstreamError(502, "render answered no GenerateRequest with token_ids")
        return rendered

    async def generate(self, generate_request: JsonDict, trace: Headers = ()) -> JsonDict:
        """A whole ``GenerateTokensResponse`` (``stream`` false)."""
        body = {**generate_request, "stream": False, "output_mode": "tokens"}
        result = await self._post_json(
            self._generate_url + GENERATE_PATH, body, self._generate_timeout_s, trace
        )
        if not isinstance(result, dict) or not isinstance(result.get("choices"), list):
            raise UpstreamError(502, "generate answered no GenerateTokensResponse")
        return result

    async def generate_stream(
        self, generate_request: JsonDict, trace: Headers = ()
    ) -> AsyncIterator[JsonDict]:
        """Each ``GenerateTokensStreamResponse`` chunk of a streamed generation, until ``[DONE]``.

        An error event, an HTTP error, a stream that ends without ``[DONE]``, answers no headers within
        ``headers_timeout_s`` or stays silent for ``idle_timeout_s`` raise ``UpstreamError``.
        """
        body = {**generate_request, "stream": True, "output_mode": "tokens"}
        url = self._generate_url + GENERATE_PATH
        try:
            try:
                async with asyncio.timeout(self._headers_timeout_s):
                    response = await self._session.post(
                        url, data=orjson.dumps(body), headers=self._request_headers(trace)
                    )
            except TimeoutError:
                raise UpstreamError(
                    504, f"generate sent no response headers within {self._headers_timeout_s:g}s"
                ) from None
            async with response:
                if response.status != 200:
                    raise error_from_body(
                        response.status, await read_bounded(response, MAX_ERROR_BODY_BYTES, cut=True)
                    )
                async for data in self._events(response):
                    if data == b"[DONE]":
                        return
                    try:
                        event = orjson.loads(data)
                    except orjson.JSONDecodeError as exc:
                        raise UpstreamError(502, "generate sent an event that is not JSON") from exc
                    if not isinstance(event, dict):
                        raise UpstreamError(502, "generate sent an event that is not an object")
                    if isinstance(event.get("error"), dict):
                        error = event["error"]
                        code = error.get("code") if isinstance(error.get("code"), int) else 500
                        raise UpstreamError(
                            code, str(error.get("message", "")), error.get("type"), error.get("param")
                        )
                    yield event
        except aiohttp.ClientError as exc:
            raise UpstreamError(502, f"the generation stream was cut off: {exc}") from exc
        raise UpstreamError(502, "the generation stream was cut off before [DONE]")

    async def _events(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """The ``data`` of each SSE event (lines ``data: ...`` up to a blank line).

        Line ends are ``\\r\\n``, ``\\n`` or ``\\r`` (the SSE grammar); a ``\\r`` that ends a read is held
        back, since its ``\\n`` may start the next one. The buffer grows in place and each search starts
        where the last one stopped, so one large event costs linear time, not a copy per read.
        """
        buffer = bytearray()
        scanned = 0  # no event boundary starts before this index
        held_cr = False
        while True:
            try:
                async with asyncio.timeout(self._idle_timeout_s):
                    piece = await response.content.readany()
            except TimeoutError:
                raise UpstreamError(504, f"generate sent nothing for {self._idle_timeout_s:g}s") from None
            if not piece:
                return
            if held_cr:
                piece = b"\r" + piece
            held_cr = piece.endswith(b"\r")
            if held_cr:
                piece = piece[:-1]
            buffer += piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            start = 0
            while (end := buffer.find(b"\n\n", scanned)) >= 0:
                event = bytes(buffer[start:end])
                start = scanned = end + 2
                data = b"\n".join(
                    line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
                )
                if data:
                    yield data
            if start:
                del buffer[:start]
            scanned = max(0, len(buffer) - 1)
            if len(buffer) > MAX_EVENT_BYTES:
                raise UpstreamError(502, f"an SSE event of generate is larger than {MAX_EVENT_BYTES} bytes")

    async def abort(self, request_ids: list[str]) -> None:
        """Ask generate to abort; best effort (the stream's own end is what counts)."""
        try:
            async with asyncio.timeout(self._render_timeout_s):
                async with self._session.post(
                    self._generate_url + ABORT_PATH,
                    data=orjson.dumps({"request_ids": request_ids}),
                    headers=self._request_headers(()),
                ) as response:
                    await read_bounded(response, MAX_ERROR_BODY_BYTES, cut=True)
        except (aiohttp.ClientError, TimeoutError, UpstreamError):
            pass


async def read_bounded(response: aiohttp.ClientResponse, limit: int, *, cut: bool = False) -> bytes:
    """The body, at most ``limit`` bytes: past it, the first ``limit`` bytes when ``cut``, else a 413."""
    declared = response.content_length
    if declared is not None and declared > limit and not cut:
        raise UpstreamError(413, f"{response.url.path} answered {declared} bytes, over the limit of {limit}")
    body = bytearray()
    while len(body) <= limit:
        piece = await response.content.read(min(1 << 20, limit + 1 - len(body)))
        if not piece:
            return bytes(body)
        body += piece
    if cut:
        return bytes(body[:limit])
    raise UpstreamError(413, f"{response.url.path} answered more than {limit} bytes")
