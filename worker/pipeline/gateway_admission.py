"""What the gateway lets in: a request body checked as the worker and vLLM check it, the limits of
one request, and the open requests and bytes each API key and the whole gateway may hold.

Everything here runs before a record is written to Kafka, so a request refused here costs nothing
downstream. ``admit_body`` validates with the same pydantic models as the worker (``schemas.openai``),
so a value vLLM coerces (``"n": "2"``) is read as vLLM reads it, and a shape vLLM refuses
(``"stream_options": "x"``) is the same 400. The limits and their defaults are in docs/gateway.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ValidationError

from schemas.openai import ChatCompletionRequest, CompletionRequest
from worker.core.record_errors import validation_message
from worker.core.vllm_version import VllmBehaviour
from worker.settings import GatewayOptions

JsonDict = dict[str, Any]
Endpoint = Literal["chat", "completion"]


def error_info(code: int, message: str, type_: str = "BadRequestError", param: str | None = None) -> JsonDict:
    """The ``error`` of vLLM's ``ErrorResponse``."""
    return {"message": message, "type": type_, "param": param, "code": code}


def error_body(code: int, message: str, type_: str = "BadRequestError", param: str | None = None) -> JsonDict:
    """vLLM's ``ErrorResponse``."""
    return {"error": error_info(code, message, type_, param)}


class Refused(Exception):
    """An HTTP error answered before anything reaches Kafka."""

    def __init__(self, status: int, body: JsonDict, retry_after_s: int | None = None) -> None:
        super().__init__(body["error"]["message"])
        self.status = status
        self.body = body
        self.retry_after_s = retry_after_s

    @classmethod
    def bad_request(cls, message: str, param: str | None = None) -> Refused:
        return cls(400, error_body(400, message, param=param))


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request body that may be written to the requests topic, with what the gateway reads of it."""

    endpoint: Endpoint
    raw: bytes  # the body as the client sent it: ingest and the worker validate it again, the same way
    stream: bool
    n: int
    include_usage: bool
    prompts: int  # generate streams the request opens (a completion may have several prompts)

    @property
    def size(self) -> int:
        return len(self.raw)


_MODELS: dict[str, type[BaseModel]] = {"chat": ChatCompletionRequest, "completion": CompletionRequest}


def admit_body(raw: bytes, endpoint: Endpoint, limits: GatewayOptions) -> Admitted:
    """``raw`` as a request of ``endpoint``, or ``Refused`` with the 400/413 vLLM (or a limit) gives."""
    if len(raw) > limits.max_body_bytes:
        raise Refused(
            413,
            error_body(
                413,
                f"the request body has {len(raw)} bytes; this gateway takes at most {limits.max_body_bytes}",
                "RequestEntityTooLarge",
            ),
        )
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Refused.bad_request(f"JSON decode error: {exc}") from None
    if not isinstance(body, dict):
        raise Refused.bad_request("the request body must be a JSON object")
    try:
        context = VllmBehaviour.of(limits.vllm_version).request_context
        request = _MODELS[endpoint].model_validate(body, context=context)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise Refused.bad_request(message, param) from None
    return _within_limits(endpoint, body, raw, request, limits)


def _within_limits(
    endpoint: Endpoint, body: JsonDict, raw: bytes, request: BaseModel, limits: GatewayOptions
) -> Admitted:
    stream = bool(getattr(request, "stream", False))
    options = getattr(request, "stream_options", None)
    include_usage = bool(stream and options is not None and options.include_usage)
    n = getattr(request, "n", None)
    n = 1 if n is None else n
    if not 1 <= n <= limits.max_n:
        raise Refused.bad_request(f"n must be between 1 and {limits.max_n} on this gateway, got {n}", "n")
    prompts = prompt_count(getattr(request, "prompt", None)) if endpoint == "completion" else 1
    if prompts > limits.max_prompts:
        raise Refused.bad_request(
            f"{prompts} prompts in one request; this gateway takes at most {limits.max_prompts}", "prompt"
        )
    top = _top_logprobs(endpoint, request)
    max_tokens = _max_tokens(body)
    if not stream and top is not None and max_tokens is not None:
        # The whole answer is one record: one that cannot fit must be refused here, not fail in ingest.
        wanted = prompts * n * max_tokens * (top + 1)
        if wanted > limits.max_logprob_tokens:
            raise Refused.bad_request(
                f"prompts x n x max_tokens x (top logprobs + 1) = {wanted} exceeds this gateway's "
                f"{limits.max_logprob_tokens} for a non-streaming request; stream it, or ask for fewer",
                "max_tokens",
            )
    return Admitted(endpoint, raw, stream, n, include_usage, prompts)


def prompt_count(prompt: Any) -> int:
    """How many prompts a completion request has, as vLLM counts them: a list whose first item is a
    token id is one prompt."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


def _top_logprobs(endpoint: Endpoint, request: BaseModel) -> int | None:
    """How many alternatives per token the request asks for, ``None`` without logprobs."""
    if endpoint == "chat":
        if not getattr(request, "logprobs", False):
            return None
        top = getattr(request, "top_logprobs", 0) or 0
    else:
        top = getattr(request, "logprobs", None)
        if top is None:
            return None
    return max(top, 0) if top != -1 else _ALL_LOGPROBS


# ``-1`` asks for the whole vocabulary; counted as vLLM's default --max-logprobs, the most it gives.
_ALL_LOGPROBS = 20


def _max_tokens(body: JsonDict) -> int | None:
    """``max_completion_tokens`` or ``max_tokens`` as vLLM reads them (an integer or its digits)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.strip().isdigit() and len(value) < 20:
            return int(value)
    return None


# --- what is open at once ------------------------------------------------------------------------


@dataclass(slots=True)
class _Use:
    requests: int = 0
    bytes: int = 0


@dataclass
class Budget:
    """Open requests and bytes in flight (request bodies plus outputs queued for their clients), per
    API key and in total. A request over its key's share is a 429, over the gateway's a 503; both say
    ``Retry-After``."""

    limits: GatewayOptions
    total: _Use = field(default_factory=_Use)
    by_key: dict[str, _Use] = field(default_factory=dict)

    def admit(self, key: str, size: int) -> Ticket:
        limits = self.limits
        mine = self.by_key.get(key) or _Use()
        retry = limits.retry_after_s
        if mine.requests >= limits.max_open_requests_per_key:
            raise _full(429, f"{mine.requests} requests are open for this API key", retry)
        if mine.bytes + size > limits.max_bytes_in_flight_per_key:
            raise _full(429, f"{mine.bytes} bytes are in flight for this API key", retry)
        if self.total.requests >= limits.max_open_requests:
            raise _full(503, f"{self.total.requests} requests are open on this gateway", retry)
        if self.total.bytes + size > limits.max_bytes_in_flight:
            raise _full(503, f"{self.total.bytes} bytes are in flight on this gateway", retry)
        self.by_key[key] = mine
        ticket = Ticket(self, key, mine)
        ticket.requests(1)
        ticket.add(size)
        return ticket


def _full(status: int, why: str, retry_after_s: int) -> Refused:
    kind = "RateLimitError" if status == 429 else "ServiceUnavailableError"
    return Refused(status, error_body(status, f"{why}; retry later", kind), retry_after_s)


@dataclass(slots=True)
class Ticket:
    """One admitted request's share of the budget; ``release`` gives all of it back."""

    budget: Budget
    key: str
    use: _Use
    held: int = 0
    open: bool = False

    def requests(self, delta: int) -> None:
        self.use.requests += delta
        self.budget.total.requests += delta
        self.open = delta > 0

    def add(self, size: int) -> None:
        self.held += size
        self.use.bytes += size
        self.budget.total.bytes += size

    def release(self) -> None:
        if self.open:
            self.requests(-1)
        self.add(-self.held)
        if self.use.requests == 0 and self.use.bytes == 0:
            self.budget.by_key.pop(self.key, None)
