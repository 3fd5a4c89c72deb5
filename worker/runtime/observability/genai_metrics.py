"""GenAI metrics on ``/metrics``: latency per token, tokens by kind, requests by finish reason.

Names follow the OpenTelemetry GenAI metrics conventions, translated to Prometheus by
``prometheus_export`` (``gen_ai.server.time_to_first_token_ms`` ->
``gen_ai_server_time_to_first_token_seconds``); see ``metrics_names``.

Where the numbers come from:

* **Tokens** are the generate chunk's ``token_ids``, seen by ``MeasuredDerenderer`` (the worker's
  ``Derenderer`` with a hook after each derender call). A record's tokens are split among the kinds
  its output delta carries (``reasoning``, ``content``, ``tool_call``) in proportion to their
  characters; a record with no visible text (a partial character, buffered markup) counts for the
  kind its sequence showed last (``content`` before anything was shown).
* **Time to first token** is vLLM's own ``metrics.time_to_first_token_ms`` when a generate chunk
  carries it; else, when the request's records carry the ``derender-request-start-ms`` header (the
  Kafka timestamp of the request, set by whoever turned the request into generate chunks), the create
  time of its first token record minus that; else it is not observed.
* **Time per output token** is vLLM's ``metrics.mean_itl_ms`` when a chunk carries it; else, per
  choice, (create time of its last record - create time of its first) / (its tokens - the first
  record's tokens), from the records' Kafka timestamps.

vLLM 0.33.0's generate endpoint fills ``metrics`` with speculative-decoding stats only, so with it the
timings come from record timestamps. Timings are observed when a request closes.

Label values are bounded: ``model`` keeps the first ``max_models`` names (then ``other``),
``finish_reason`` only OpenAI's and vLLM's values (else ``other``), ``code`` only HTTP statuses. No
request ids. Counters count processing: a partition reset re-processes (and re-counts) the records
since its last commit.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.derender import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
)
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import ProcessResult
from worker.core.sequence_state import SequenceState
from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.metrics import Metrics
from worker.runtime.observability.prometheus_export import labelled

REQUEST_START_HEADER = "derender-request-start-ms"
DEFAULT_MAX_MODELS = 16
# Requests whose timing is followed at once; past it the oldest is forgotten (its timings are lost).
DEFAULT_MAX_TRACKED = 100_000
FINISH_REASONS = frozenset(
    {"stop", "length", "tool_calls", "abort", "error", "content_filter", "function_call", "repetition"}
)
KINDS = ("reasoning", "content", "tool_call")
OTHER = "other"
_MAX_TIMING_MS = 86_400_000.0  # a day: anything longer is a bad field or a skewed clock
_LABEL_UNSAFE = re.compile(r'[{}=,"\\\n]')


def request_start_header(timestamp_ms: int) -> tuple[str, bytes]:
    """The header a producer of input records adds so TTFT can be measured from record timestamps."""
    return (REQUEST_START_HEADER, str(int(timestamp_ms)).encode("ascii"))


def _timing_field(metrics: Mapping[str, Any] | None, name: str) -> float | None:
    if not metrics:
        return None
    value = metrics.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or not 0 <= value <= _MAX_TIMING_MS:
        return None
    return float(value)


def _start_header(headers: Any) -> int | None:
    for name, value in headers or ():
        if name == REQUEST_START_HEADER:
            if isinstance(value, bytes) and 0 < len(value) <= 16 and value.isdigit():
                return int(value)
            return None
    return None


def _text_len(value: Any) -> int:
    return len(value) if isinstance(value, str) else 0


def _kinds_of_message(message: Mapping[str, Any]) -> dict[str, int]:
    """Characters per kind of a chat delta or message."""
    tool = 0
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            tool += _text_len(function.get("name")) + _text_len(function.get("arguments"))
    return {
        "reasoning": _text_len(message.get("reasoning")) + _text_len(message.get("reasoning_content")),
        "content": _text_len(message.get("content")),
        "tool_call": tool,
    }


def _output_choice(choices: Sequence[Any], index: int) -> dict[str, Any] | None:
    """The output choice with ``index`` (a streamed chunk has one; a one-shot response all)."""
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index") == index:
            return choice
    return None


def _split(tokens: int, chars: Mapping[str, int], fallback: str) -> tuple[dict[str, int], str]:
    """``tokens`` spread over the kinds in proportion to their characters; the last kind shown."""
    shown = [k for k in KINDS if chars.get(k)]
    if len(shown) <= 1:  # the common record: one kind, or nothing visible
        kind = shown[0] if shown else fallback
        return {kind: tokens}, kind
    total = sum(chars[k] for k in shown)
    out: dict[str, int] = {}
    left = tokens
    for kind in shown[:-1]:
        share = tokens * chars[kind] // total
        out[kind] = share
        left -= share
    out[shown[-1]] = left
    return out, shown[-1]


@dataclass(slots=True)
class _Choice:
    first_ts: int
    first_tokens: int
    last_ts: int
    tokens: int = 0
    kind: str = "content"


@dataclass(slots=True)
class _Request:
    model: str
    start_ts: int | None
    choices: dict[int, _Choice] = field(default_factory=dict)
    first_token_ts: int | None = None
    tokens: int = 0  # output tokens of every choice so far
    ttft_ms: float | None = None  # vLLM's own
    tpot_ms: float | None = None  # vLLM's own


@dataclass(slots=True)
class _Seen:
    """What one derender call saw: per choice (index, tokens, finish reason), timing fields, output."""

    stream: bool
    choices: list[tuple[int, int, str | None]]
    timing: dict[str, Any] | None
    output: dict[str, Any]

    @classmethod
    def of(cls, stream: bool, gen: Any, output: dict[str, Any]) -> _Seen:
        """What a call saw of one generate chunk or response ``gen``."""
        choices = [(c.index, len(c.token_ids or ()), c.finish_reason) for c in gen.choices]
        return cls(stream, choices, gen.metrics, output)


class MeasuredDerenderer(Derenderer):
    """The worker's ``Derenderer``, telling ``GenAiMetrics`` what each call saw (same outputs)."""

    _genai: GenAiMetrics

    @classmethod
    def wrapping(cls, base: Derenderer, genai: GenAiMetrics) -> MeasuredDerenderer:
        measured = cls.__new__(cls)
        measured.__dict__.update(base.__dict__)  # shares the tokenizer, decoder and parsers
        measured._genai = genai
        return measured

    def chat_stream(
        self, body: DerenderChatStreamRequest, state: SequenceState | None
    ) -> tuple[dict[str, Any], SequenceState]:
        chunk, state = super().chat_stream(body, state)
        self._genai.seen = _Seen.of(True, body.generate_chunk, chunk)
        return chunk, state

    def completion_stream(
        self, body: DerenderCompletionStreamRequest, state: SequenceState | None
    ) -> tuple[dict[str, Any], SequenceState]:
        chunk, state = super().completion_stream(body, state)
        self._genai.seen = _Seen.of(True, body.generate_chunk, chunk)
        return chunk, state

    def chat(self, body: DerenderChatRequest) -> dict[str, Any]:
        response = super().chat(body)
        self._genai.seen = _Seen.of(False, body.generate_response, response)
        return response

    def completion(self, body: DerenderCompletionRequest) -> dict[str, Any]:
        response = super().completion(body)
        choices: list[tuple[int, int, str | None]] = []
        timing = None
        for gen in body.generate_responses:  # the response numbers the choices of all prompts in turn
            timing = timing or gen.metrics
            choices += [
                (len(choices) + i, len(c.token_ids or ()), c.finish_reason) for i, c in enumerate(gen.choices)
            ]
        self._genai.seen = _Seen(False, choices, timing, response)
        return response


class GenAiMetrics:
    """Folds each processed record into the GenAI metrics of a worker's ``Metrics``."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        max_models: int = DEFAULT_MAX_MODELS,
        max_tracked: int = DEFAULT_MAX_TRACKED,
    ) -> None:
        self.metrics = metrics
        self.max_models = max_models
        self.max_tracked = max_tracked
        self.seen: _Seen | None = None  # set by MeasuredDerenderer during ``process``
        self._models: set[str] = set()
        self._requests: OrderedDict[str, _Request] = OrderedDict()
        self._keys: dict[tuple[Any, ...], str] = {}

    def measured(self, derenderer: Derenderer) -> MeasuredDerenderer:
        return MeasuredDerenderer.wrapping(derenderer, self)

    @property
    def tracked_requests(self) -> int:
        return len(self._requests)

    # --- labels ------------------------------------------------------------------------------------

    def _model(self, value: Any) -> str:
        if not isinstance(value, str) or not value or len(value) > 128 or _LABEL_UNSAFE.search(value):
            return OTHER
        if value in self._models:
            return value
        if len(self._models) >= self.max_models:
            return OTHER
        self._models.add(value)
        return value

    def _key(self, name: str, **labels: str) -> str:
        """``labelled(name, **labels)``, cached (label values here come from small fixed sets)."""
        cache = (name, *labels.values())  # one call site per name, so the order is fixed
        key = self._keys.get(cache)
        if key is None:
            key = self._keys[cache] = labelled(name, **labels)
        return key

    # --- per record --------------------------------------------------------------------------------

    def observe(self, record: Any, result: ProcessResult) -> int | None:
        """Count one processed record; the request's output tokens so far (``None``: not a request)."""
        seen, self.seen = self.seen, None
        output = result.output
        if output is None:
            return None
        error = output.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            self.metrics.increment(
                self._key(m.ERROR_RECORDS, code=str(code) if isinstance(code, int) else OTHER)
            )
            if result.closed and result.request_id is not None:
                self._close(result.request_id, record.timestamp if record is not None else None)
            return None
        if seen is None or result.request_id is None:
            return None
        body = seen.output
        model = self._model(body.get("model"))
        outputs = body.get("choices") or ()
        timestamp = int(record.timestamp) if record is not None else 0
        if not seen.stream:
            one_shot = _Request(model, None)
            self._count(one_shot, seen, outputs, timestamp, stream=False)
            self._finish(one_shot, timestamp)
            return one_shot.tokens
        request = self._requests.get(result.request_id)
        if request is None:
            request = _Request(model, _start_header(record.headers) if record is not None else None)
            self._requests[result.request_id] = request
            while len(self._requests) > self.max_tracked:
                self._requests.popitem(last=False)
        self._count(request, seen, outputs, timestamp, stream=True)
        if result.closed:
            self._close(result.request_id, timestamp)
        return request.tokens

    def expired(self, result: ProcessResult) -> None:
        """A request closed by its TTL (its 408 error record is counted by ``observe``)."""
        if result.request_id is not None:
            self._requests.pop(result.request_id, None)

    def _count(
        self, request: _Request, seen: _Seen, outputs: Sequence[Any], timestamp: int, *, stream: bool
    ) -> None:
        if seen.timing:
            ttft = _timing_field(seen.timing, "time_to_first_token_ms")
            if ttft is not None:
                request.ttft_ms = ttft
            tpot = _timing_field(seen.timing, "mean_itl_ms")
            if tpot is not None:
                request.tpot_ms = tpot
        for index, tokens, finish in seen.choices:
            choice = request.choices.get(index)
            if choice is None:
                choice = request.choices[index] = _Choice(timestamp, tokens, timestamp)
            if tokens and request.first_token_ts is None:
                request.first_token_ts = timestamp
            choice.tokens += tokens
            request.tokens += tokens
            choice.last_ts = timestamp
            out = _output_choice(outputs, index)
            if out is not None:
                message = out.get("delta") if stream else out.get("message")
                if isinstance(message, dict):
                    chars = _kinds_of_message(message)
                else:
                    chars = {"content": _text_len(out.get("text"))}
            else:
                chars = {}
            shares, choice.kind = _split(tokens, chars, choice.kind)
            for kind, count in shares.items():
                if count:
                    self.metrics.increment(
                        self._key(m.GEN_AI_OUTPUT_TOKENS, model=request.model, token_type=kind), count
                    )
            if finish is not None:
                reason = finish if finish in FINISH_REASONS else OTHER
                self.metrics.increment(
                    self._key(m.GEN_AI_REQUESTS, model=request.model, finish_reason=reason)
                )
                self.metrics.increment(
                    self._key(m.GEN_AI_FINISHED_OUTPUT_TOKENS, model=request.model, finish_reason=reason),
                    choice.tokens,
                )

    def _close(self, request_id: str, timestamp: int | None) -> None:
        request = self._requests.pop(request_id, None)
        if request is not None:
            self._finish(request, timestamp or 0)

    def _finish(self, request: _Request, timestamp: int) -> None:
        """The request's timings, observed once it closed."""
        ttft = request.ttft_ms
        if ttft is None and request.start_ts is not None and request.first_token_ts is not None:
            measured = float(request.first_token_ts - request.start_ts)
            ttft = measured if 0 <= measured <= _MAX_TIMING_MS else None
        if ttft is not None:
            self.metrics.timing(self._key(m.GEN_AI_TIME_TO_FIRST_TOKEN_MS, model=request.model), ttft)
        if request.tpot_ms is not None:
            self.metrics.timing(
                self._key(m.GEN_AI_TIME_PER_OUTPUT_TOKEN_MS, model=request.model), request.tpot_ms
            )
            return
        for choice in request.choices.values():
            later = choice.tokens - choice.first_tokens
            elapsed = choice.last_ts - choice.first_ts
            if later > 0 and 0 < elapsed <= _MAX_TIMING_MS:
                self.metrics.timing(
                    self._key(m.GEN_AI_TIME_PER_OUTPUT_TOKEN_MS, model=request.model), elapsed / later
                )
