"""A stand-in for vLLM 0.33.0's render and generate servers, speaking their HTTP protocol.

For the tests, the demo and the pipeline benchmark (no GPU needed). It serves recorded generations
(prompt and output token ids, e.g. the golden cases' or a stream of input envelopes) the way
``vllm/entrypoints/scale_out`` does:

* ``POST /v1/chat/completions/render`` -> one ``GenerateRequest``; ``POST /v1/completions/render`` ->
  a list of them, one per prompt (``cmpl-<id>`` or ``cmpl-<id>-<i>``).
* ``POST /inference/v1/generate``: ``stream: true`` answers ``text/event-stream``,
  ``data: <GenerateTokensStreamResponse JSON>\\n\\n`` per chunk, a usage-only chunk when
  ``stream_options.include_usage``, then ``data: [DONE]\\n\\n``; ``stream: false`` answers one
  ``GenerateTokensResponse``.
* Errors are ``ErrorResponse`` bodies whose ``error.code`` is the HTTP status; an error during a
  stream is a ``data:`` event holding the error object, then ``[DONE]``.
* ``POST /inference/v1/abort_requests`` ``{"request_ids": [...]}``: the stream ends with a
  ``finish_reason: "abort"`` chunk for every unfinished choice.

Faults are chosen per request by the OpenAI request's ``user`` field, ``"fault:<name>"``, from the
``faults`` given to the server: HTTP errors from render or generate, an error event, a connection cut
in the middle of an SSE event, a stall, pacing, an answer as large as the request asks for, a stream
that never finishes. The W3C ``traceparent`` each call carried is kept in ``traceparents``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

JsonDict = dict[str, Any]
_STATUS_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


@dataclass(frozen=True)
class Fault:
    render_status: int | None = None  # render answers this HTTP error
    generate_status: int | None = None  # generate answers this HTTP error
    error_event_after: int | None = None  # N chunks, then a data: error event (a 500, as vLLM)
    cut_after: int | None = None  # N chunks, then half an event and the connection closes
    stall_after: int | None = None  # N chunks, then nothing until the request is aborted
    pace_s: float | None = None  # overrides the server's pace for this request
    # generate answers ``max_tokens`` tokens (cycling the recording's), each with ``top_logprobs``
    # candidates: the size of the answer a client can ask for, without a recording that large
    bulk: bool = False
    no_finish: bool = False  # the stream ends with [DONE] but no choice ever finishes
    only_prompt: int | None = None  # the fault applies to this prompt of a completion only


@dataclass
class Recording:
    """One recorded generation: its prompt ids and generate chunks, per prompt."""

    name: str
    endpoint: str
    request: JsonDict  # the OpenAI request it answers (matched on messages / prompt and tools)
    prompt_token_ids: list[list[int]]
    chunks: list[list[JsonDict]]  # per prompt: the choices-bearing and usage chunks, request_id-less

    def key(self) -> bytes:
        return match_key(self.endpoint, self.request)

    @classmethod
    def from_envelopes(cls, name: str, envelopes: list[JsonDict]) -> Recording:
        """The generation behind one request's input envelopes (stream records or one one-shot record)."""
        first = envelopes[0]["body"]
        request = first.get("chat_request") or first.get("completion_request") or {}
        endpoint = envelopes[0]["endpoint"]
        if first.get("stream"):
            request = {**request, "stream": True}  # what a client of this recording sends
            prompt = first.get("prompt_token_ids") or first["generate_chunk"].get("prompt_token_ids")
            chunks = [_strip(r["body"]["generate_chunk"]) for r in envelopes]
            return cls(name, endpoint, request, [list(prompt or [1])], [chunks])
        responses = first.get("generate_responses") or [first["generate_response"]]
        prompts = first.get("prompt_token_ids")
        if prompts is None or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts] * len(responses)
        return cls(
            name,
            endpoint,
            request,
            [list(p or r.get("prompt_token_ids") or [1]) for p, r in zip(prompts, responses, strict=True)],
            [_chunks_of(r) for r in responses],
        )


def match_key(endpoint: str, request: JsonDict) -> bytes:
    selector = request.get("messages") if endpoint == "chat" else request.get("prompt")
    fields = [endpoint, selector, request.get("tools"), request.get("n"), bool(request.get("stream"))]
    return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)


def _strip(chunk: JsonDict) -> JsonDict:
    return {k: v for k, v in chunk.items() if k != "request_id"}


def _chunks_of(response: JsonDict) -> list[JsonDict]:
    """A one-shot response as a stream: one chunk per choice, then its usage."""
    chunks: list[JsonDict] = [
        {
            "choices": [
                {
                    k: choice.get(k)
                    for k in ("index", "token_ids", "finish_reason", "stop_reason", "logprobs")
                    if choice.get(k) is not None
                }
            ]
        }
        for choice in response["choices"]
    ]
    if response.get("usage"):
        chunks.append({"choices": [], "usage": response["usage"]})
    return chunks


def _error(status: int, message: str) -> JsonDict:
    return {
        "error": {
            "message": message,
            "type": _STATUS_TYPES.get(status, "BadRequestError"),
            "param": None,
            "code": status,
        }
    }


def _error_response(status: int, message: str) -> web.Response:
    return web.json_response(_error(status, message), status=status, dumps=lambda v: orjson.dumps(v).decode())


def _stream_chunk(request_id: str, chunk: JsonDict) -> bytes:
    """A chunk in vLLM's field order; absent optional fields are left out as vLLM's exclude does."""
    if not chunk.get("choices"):  # the usage-only chunk is dumped with exclude_none
        body: JsonDict = {
            "request_id": request_id,
            "usage": chunk.get("usage"),
            "output_mode": "tokens",
            "choices": [],
        }
        return orjson.dumps({k: v for k, v in body.items() if v is not None})
    out: JsonDict = {"request_id": request_id, "usage": chunk.get("usage")}
    for name in ("prompt_token_ids", "mm_placeholders", "metrics"):
        if chunk.get(name) is not None:
            out[name] = chunk[name]
    out["output_mode"] = "tokens"
    out["choices"] = [
        {
            "index": c["index"],
            "finish_reason": c.get("finish_reason"),
            "stop_reason": c.get("stop_reason"),
            "token_ids": c.get("token_ids"),
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
            "logprobs": c.get("logprobs"),
        }
        for c in chunk["choices"]
    ]
    return orjson.dumps(out)


def full_response(request_id: str, model: str | None, prompt: list[int], chunks: list[JsonDict]) -> JsonDict:
    choices: dict[int, JsonDict] = {}
    usage = None
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for c in chunk.get("choices") or ():
            merged = choices.setdefault(
                c["index"], {"index": c["index"], "token_ids": [], "finish_reason": None, "stop_reason": None}
            )
            merged["token_ids"] += c.get("token_ids") or []
            if c.get("logprobs"):
                merged.setdefault("logprobs", {"content": []})["content"] += c["logprobs"]["content"]
            if c.get("finish_reason") is not None:
                merged["finish_reason"] = c["finish_reason"]
                merged["stop_reason"] = c.get("stop_reason")
    completion = sum(len(c["token_ids"]) for c in choices.values())
    return {
        "request_id": request_id,
        "model": model,
        "created": int(time.time()),
        "usage": usage
        or {
            "prompt_tokens": len(prompt),
            "completion_tokens": completion,
            "total_tokens": len(prompt) + completion,
        },
        "output_mode": "tokens",
        "choices": [choices[i] for i in sorted(choices)],
    }


@dataclass
class _Generation:
    recording: Recording
    prompt_index: int
    model: str | None
    fault: Fault
    request: JsonDict = field(default_factory=dict)  # the OpenAI request it was rendered from


def bulk_choice(request: JsonDict, token_ids: list[int]) -> JsonDict:
    """One choice of ``max_tokens`` tokens with ``top_logprobs`` candidates each, as generate answers."""
    count = int(request.get("max_tokens") or request.get("max_completion_tokens") or 16)
    top = int(request.get("top_logprobs") or 0) if request.get("logprobs") else 0
    ids = [token_ids[i % len(token_ids)] for i in range(count)]
    choice: JsonDict = {"index": 0, "token_ids": ids, "finish_reason": "length", "stop_reason": None}
    if request.get("logprobs"):
        choice["logprobs"] = {
            "content": [
                {
                    "token_id": t,
                    "logprob": -0.5,
                    "rank": 1,
                    "top_logprobs": [
                        {"token_id": t + r, "logprob": -0.5 - r, "rank": r + 1} for r in range(top)
                    ],
                }
                for t in ids
            ]
        }
    return choice


@dataclass
class FakeVllm:
    """The fake server. ``start()`` runs it on its own thread and event loop; ``url`` is its base URL."""

    recordings: Iterable[Recording]
    served_model_names: tuple[str, ...] = ("test-model",)
    faults: dict[str, Fault] = field(default_factory=dict)
    pace_s: float = 0.0
    api_key: str | None = None
    # Served instead when a request is generated a second time, so a test can tell two generations apart.
    retry_chunks: list[JsonDict] | None = None
    host: str = "127.0.0.1"
    port: int = 0
    # What the tests look at:
    aborted: list[str] = field(default_factory=list)
    streams_open: int = 0
    max_streams_open: int = 0
    sent_at: dict[str, list[float]] = field(default_factory=dict)  # engine id -> monotonic time per chunk
    traceparents: list[tuple[str, str]] = field(default_factory=list)  # (path, traceparent) per call

    def __post_init__(self) -> None:
        self._by_key = {r.key(): r for r in self.recordings}
        self._generations: dict[str, _Generation] = {}
        self._abort_events: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.generations_of: dict[str, int] = {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- lifecycle -----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_post("/v1/chat/completions/render", self._render_chat)
        app.router.add_post("/v1/completions/render", self._render_completion)
        app.router.add_post("/inference/v1/generate", self._generate)
        app.router.add_post("/inference/v1/abort_requests", self._abort)
        return app

    async def start_async(self) -> None:
        self._runner = web.AppRunner(self.app(), handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])

    async def stop_async(self) -> None:
        for event in self._abort_events.values():
            event.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def start(self) -> FakeVllm:
        started = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.start_async())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fake-vllm", daemon=True)
        self._thread.start()
        started.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop_async(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    # --- handlers ------------------------------------------------------------------------------------

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if "traceparent" in request.headers:
            self.traceparents.append((request.path, request.headers["traceparent"]))
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    def _fault(self, request: JsonDict) -> Fault:
        user = request.get("user")
        if isinstance(user, str) and user.startswith("fault:"):
            return self.faults.get(user.removeprefix("fault:"), Fault())
        return Fault()

    async def _json(self, request: web.Request) -> JsonDict | web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _error_response(400, f"JSON decode error: {exc}")
        if not isinstance(body, dict):
            return _error_response(400, "the request body must be a JSON object")
        return body

    def _check(self, endpoint: str, body: JsonDict) -> tuple[Recording | None, web.Response | None]:
        fault = self._fault(body)
        if fault.render_status is not None:
            return None, _error_response(fault.render_status, f"render failed with {fault.render_status}")
        if body.get("model") not in self.served_model_names:
            return None, _error_response(404, f"The model `{body.get('model')}` does not exist.")
        recording = self._by_key.get(match_key(endpoint, body))
        if recording is None and not body.get("stream"):
            # A one-shot of a streamed recording: generate assembles its chunks, as vLLM's stream: false does.
            recording = self._by_key.get(match_key(endpoint, {**body, "stream": True}))
        if recording is None:
            return None, _error_response(400, "no recorded generation for this request")
        return recording, None

    def _generate_request(
        self, request_id: str, recording: Recording, index: int, body: JsonDict
    ) -> JsonDict:
        stream = bool(body.get("stream"))
        self._generations[request_id] = _Generation(
            recording, index, body.get("model"), self._fault(body), body
        )
        sampling = {
            "n": body.get("n") or 1,
            "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens"),
        }
        out: JsonDict = {
            "request_id": request_id,
            "token_ids": recording.prompt_token_ids[index],
            "sampling_params": {k: v for k, v in sampling.items() if v is not None},
            "model": body.get("model"),
            "stream": stream,
            "stream_options": body.get("stream_options") if stream else None,
            "return_token_ids": body.get("return_token_ids"),
            "output_mode": "tokens",
        }
        return out

    def _base_id(self, request: web.Request) -> str:
        return request.headers.get("X-Request-Id") or uuid.uuid4().hex

    async def _render_chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        recording, error = self._check("chat", body)
        if error is not None:
            return error
        assert recording is not None
        rendered = self._generate_request(f"chatcmpl-{self._base_id(request)}", recording, 0, body)
        return web.Response(body=orjson.dumps(rendered), content_type="application/json")

    async def _render_completion(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        recording, error = self._check("completion", body)
        if error is not None:
            return error
        assert recording is not None
        base = f"cmpl-{self._base_id(request)}"
        count = len(recording.prompt_token_ids)
        rendered = [
            self._generate_request(base if count == 1 else f"{base}-{i}", recording, i, body)
            for i in range(count)
        ]
        return web.Response(body=orjson.dumps(rendered), content_type="application/json")

    async def _abort(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        ids = body.get("request_ids")
        if ids is None:
            return web.json_response({"detail": "Missing 'request_ids' in request body"}, status=400)
        for request_id in ids:
            self.aborted.append(request_id)
            event = self._abort_events.get(request_id)
            if event is not None:
                event.set()
        return web.Response(status=200)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        if not body.get("token_ids") or "sampling_params" not in body:
            return _error_response(400, "token_ids and sampling_params are required")
        generation = self._generations.get(str(body.get("request_id")))
        if generation is None:
            return _error_response(400, "unknown request: render it first")
        fault = generation.fault
        if fault.only_prompt is not None and fault.only_prompt != generation.prompt_index:
            fault = Fault(pace_s=fault.pace_s)
        if fault.generate_status is not None:
            return _error_response(fault.generate_status, f"generate failed with {fault.generate_status}")
        if body.get("model") not in (None, *self.served_model_names):
            return _error_response(404, f"The model `{body.get('model')}` does not exist.")
        engine_id = f"generate-tokens-{body['request_id']}"
        recording, index = generation.recording, generation.prompt_index
        self.generations_of[body["request_id"]] = self.generations_of.get(body["request_id"], 0) + 1
        recorded = recording.chunks[index]
        if self.retry_chunks is not None and self.generations_of[body["request_id"]] > 1:
            recorded = self.retry_chunks
        chunks = [c for c in recorded if c.get("choices")]
        usage_chunks = [c for c in recorded if not c.get("choices")]
        if fault.bulk:
            token_ids = [t for c in chunks for x in c["choices"] for t in x.get("token_ids") or ()] or [1]
            recorded = chunks = [{"choices": [bulk_choice(generation.request, token_ids)]}]
            usage_chunks = []
        if fault.no_finish:
            chunks = [{**c, "choices": [{**x, "finish_reason": None} for x in c["choices"]]} for c in chunks]
        if not body.get("stream"):
            response = full_response(engine_id, generation.model, recording.prompt_token_ids[index], recorded)
            return web.Response(body=orjson.dumps(response), content_type="application/json")
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if include_usage and not usage_chunks:  # vLLM always ends such a stream with usage
            prompt = len(recording.prompt_token_ids[index])
            completion = sum(len(c.get("token_ids") or []) for chunk in chunks for c in chunk["choices"])
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            usage_chunks = [{"choices": [], "usage": usage}]
        return await self._stream(request, engine_id, chunks, usage_chunks if include_usage else [], fault)

    async def _stream(
        self,
        request: web.Request,
        engine_id: str,
        chunks: list[JsonDict],
        usage_chunks: list[JsonDict],
        fault: Fault,
    ) -> web.StreamResponse:
        aborted = self._abort_events.setdefault(engine_id, asyncio.Event())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        pace = fault.pace_s if fault.pace_s is not None else self.pace_s
        unfinished = {c["index"] for chunk in chunks for c in chunk["choices"]}
        self.streams_open += 1
        self.max_streams_open = max(self.max_streams_open, self.streams_open)
        try:
            for sent, chunk in enumerate(chunks):
                if fault.stall_after == sent:
                    await aborted.wait()
                if aborted.is_set():
                    break
                if fault.cut_after == sent:
                    await response.write(b'data: {"request_id": "' + engine_id.encode())
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if fault.error_event_after == sent:
                    await response.write(
                        b"data: " + orjson.dumps(_error(500, "Internal server error")) + b"\n\n"
                    )
                    await response.write(b"data: [DONE]\n\n")
                    return response
                if pace and sent:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(pace):
                            await aborted.wait()
                    if aborted.is_set():
                        break
                await response.write(b"data: " + _stream_chunk(engine_id, chunk) + b"\n\n")
                self.sent_at.setdefault(engine_id, []).append(time.monotonic())
                for c in chunk["choices"]:
                    if c.get("finish_reason") is not None:
                        unfinished.discard(c["index"])
            if aborted.is_set():
                for index in sorted(unfinished):
                    abort = {"choices": [{"index": index, "token_ids": [], "finish_reason": "abort"}]}
                    await response.write(b"data: " + _stream_chunk(engine_id, abort) + b"\n\n")
            for chunk in usage_chunks:
                await response.write(b"data: " + _stream_chunk(engine_id, chunk) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away: vLLM aborts the request then
        finally:
            self.streams_open -= 1
            self._abort_events.pop(engine_id, None)
        return response
