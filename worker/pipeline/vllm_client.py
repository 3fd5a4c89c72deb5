"""A client for vLLM 0.33.0's render, generate and abort endpoints (``vllm/entrypoints/scale_out``).

Every failure comes back as an ``UpstreamError`` carrying vLLM's error object (``message``, ``type``,
``param``, ``code`` = HTTP status), so ``ingest`` can put it on the output topic as the request's
error record. A server that is unreachable or answers something that is not vLLM's protocol is a 502.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from worker.errors import UpstreamError

JsonDict = dict[str, Any]

# One SSE event may carry a chunk's logprobs and, on the first, the prompt ids.
MAX_EVENT_BYTES = 16 * 1024 * 1024
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
    ) -> None:
        self._session = session
        self._render_url = render_url.rstrip("/")
        self._generate_url = generate_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._idle_timeout_s = idle_timeout_s

    async def _post_json(self, url: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        try:
            async with self._session.post(
                url,
                data=orjson.dumps(body),
                headers={**self._headers, "Content-Type": "application/json", **(headers or {})},
            ) as response:
                raw = await response.read()
                if response.status != 200:
                    raise error_from_body(response.status, raw)
        except aiohttp.ClientError as exc:
            raise UpstreamError(502, f"{url} is unreachable: {exc}") from exc
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(502, f"{url} answered something that is not JSON") from exc

    async def render(self, endpoint: str, request: JsonDict, request_id: str) -> list[JsonDict]:
        """The ``GenerateRequest``s for an OpenAI request: one for chat, one per prompt for completions."""
        result = await self._post_json(
            self._render_url + RENDER_PATHS[endpoint], request, {"X-Request-Id": request_id}
        )
        rendered = result if isinstance(result, list) else [result]
        if not rendered or not all(isinstance(r, dict) and r.get("token_ids") for r in rendered):
            raise UpstreamError(502, "render answered no GenerateRequest with token_ids")
        return rendered

    async def generate(self, generate_request: JsonDict) -> JsonDict:
        """A whole ``GenerateTokensResponse`` (``stream`` false)."""
        body = {**generate_request, "stream": False, "output_mode": "tokens"}
        result = await self._post_json(self._generate_url + GENERATE_PATH, body)
        if not isinstance(result, dict) or not isinstance(result.get("choices"), list):
            raise UpstreamError(502, "generate answered no GenerateTokensResponse")
        return result

    async def generate_stream(self, generate_request: JsonDict) -> AsyncIterator[JsonDict]:
        """Each ``GenerateTokensStreamResponse`` chunk of a streamed generation, until ``[DONE]``.

        An error event, an HTTP error, a stream that ends without ``[DONE]`` or stays silent for
        ``idle_timeout_s`` raise ``UpstreamError``.
        """
        body = {**generate_request, "stream": True, "output_mode": "tokens"}
        url = self._generate_url + GENERATE_PATH
        try:
            async with self._session.post(
                url, data=orjson.dumps(body), headers={**self._headers, "Content-Type": "application/json"}
            ) as response:
                if response.status != 200:
                    raise error_from_body(response.status, await response.read())
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
        """The ``data`` of each SSE event (lines ``data: ...`` up to a blank line)."""
        buffer = b""
        while True:
            try:
                async with asyncio.timeout(self._idle_timeout_s):
                    piece = await response.content.readany()
            except TimeoutError:
                raise UpstreamError(504, f"generate sent nothing for {self._idle_timeout_s:g}s") from None
            if not piece:
                return
            buffer += piece.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = b"\n".join(
                    line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
                )
                if data:
                    yield data
            if len(buffer) > MAX_EVENT_BYTES:
                raise UpstreamError(502, f"an SSE event of generate is larger than {MAX_EVENT_BYTES} bytes")

    async def abort(self, request_ids: list[str]) -> None:
        """Ask generate to abort; best effort (the stream's own end is what counts)."""
        try:
            async with self._session.post(
                self._generate_url + ABORT_PATH,
                data=orjson.dumps({"request_ids": request_ids}),
                headers={**self._headers, "Content-Type": "application/json"},
            ) as response:
                await response.read()
        except aiohttp.ClientError:
            pass
