"""W3C trace context through Kafka, and the optional OpenTelemetry span per request.

Header propagation needs no OpenTelemetry: the ``traceparent``, ``tracestate`` and ``baggage``
headers of an input record are copied to every record it causes (output, error record, dead
letter), as OpenTelemetry's messaging conventions for Kafka carry them. Headers are untrusted input:
a ``traceparent`` that is not valid W3C syntax is dropped together with its ``tracestate`` (as the
W3C spec says a receiver must), and a ``tracestate`` or ``baggage`` over the W3C size limits is
dropped, so a record cannot make the worker write oversized headers.

With the ``otel`` extra and an endpoint (``--otel-endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), ``RequestSpans`` opens one span per request at its first
record (a child of that record's ``traceparent``), gives every output of the request that span as
``traceparent``, and ends it when the request closes, with the GenAI semantic conventions'
attributes (``gen_ai.*``) and the messaging ones (``messaging.*``). OpenTelemetry is imported only
then; ``NO_SPANS`` costs nothing.

``ingest`` and ``gateway`` (and any other producer of input records) call ``propagated(headers)``
on the headers they received (HTTP or Kafka) and put the result on the records they produce.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
BAGGAGE = "baggage"
TRACE_HEADERS = (TRACEPARENT, TRACESTATE, BAGGAGE)
# W3C Trace Context: tracestate may be cut at 512 characters; W3C Baggage: 8,192 bytes in total.
MAX_TRACESTATE_BYTES = 512
MAX_BAGGAGE_BYTES = 8192
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16
# Open request spans kept per worker; past it the oldest is ended (a request that never closed).
MAX_OPEN_SPANS = 100_000

Headers = tuple[tuple[str, bytes], ...]
NO_HEADERS: Headers = ()


def _as_bytes(value: Any) -> bytes | None:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return None


def valid_traceparent(value: bytes) -> bool:
    """W3C ``traceparent`` syntax: version ``ff`` is invalid, ids must not be all zeros; a future
    version may append fields (``-...``) but version ``00`` may not."""
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return False
    version, trace_id, span_id, _, rest = match.groups()
    if version == b"ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return False
    return not (version == b"00" and rest)


_NAMES = frozenset(TRACE_HEADERS)
# A request's records share one traceparent: remember recent verdicts (bounded, cleared when full).
_VERDICTS: dict[bytes, bool] = {}
_MAX_VERDICTS = 4096
# Version 00 is 55 bytes; later versions may append fields. Past this, not a traceparent we keep.
MAX_TRACEPARENT_BYTES = 256


def _valid_cached(value: bytes) -> bool:
    if len(value) > MAX_TRACEPARENT_BYTES:
        return False  # never cached: an untrusted header must not grow the cache's memory
    verdict = _VERDICTS.get(value)
    if verdict is None:
        if len(_VERDICTS) >= _MAX_VERDICTS:
            _VERDICTS.clear()
        verdict = _VERDICTS[value] = valid_traceparent(value)
    return verdict


def propagated(headers: Iterable[tuple[str, Any]] | Mapping[str, Any] | None) -> Headers:
    """The trace-context headers of ``headers`` (Kafka pairs or an HTTP mapping), validated.

    The first occurrence of each name counts (names compared in lower case, as HTTP does). Runs once
    per record: a record without headers costs one test.
    """
    if not headers:
        return NO_HEADERS
    parent = state = baggage = None
    # Kafka gives a list or tuple of pairs; anything else is an HTTP-style mapping.
    pairs = headers if isinstance(headers, list | tuple) else cast(Mapping[str, Any], headers).items()
    for name, value in pairs:
        if name not in _NAMES:
            if not isinstance(name, str) or len(name) > 11:
                continue
            name = name.lower()
        if name == TRACEPARENT:
            if parent is None:
                parent = _as_bytes(value)
        elif name == TRACESTATE:
            if state is None:
                state = _as_bytes(value)
        elif name == BAGGAGE and baggage is None:
            baggage = _as_bytes(value)
    out: list[tuple[str, bytes]] = []
    if parent is not None and _valid_cached(parent):
        out.append((TRACEPARENT, parent))
        if state is not None and len(state) <= MAX_TRACESTATE_BYTES:
            out.append((TRACESTATE, state))
    if baggage is not None and len(baggage) <= MAX_BAGGAGE_BYTES:
        out.append((BAGGAGE, baggage))
    return tuple(out) if out else NO_HEADERS


# --- spans -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """Where an input record sat, for the messaging attributes."""

    topic: str
    partition: int
    offset: int
    group_id: str


@dataclass(slots=True)
class RequestSummary:
    """What one request's span reports, filled from its output chunks as they pass."""

    operation: str = "chat"
    model: str | None = None
    response_id: str | None = None
    finish_reasons: dict[int, str] = field(default_factory=dict)
    input_tokens: int | None = None
    output_tokens: int | None = None
    error_code: int | None = None
    error_type: str | None = None

    def update(self, output: Mapping[str, Any]) -> None:
        """Fold one output envelope (chunk, one-shot response or error record) in."""
        self.operation = "text_completion" if output.get("endpoint") == "completion" else "chat"
        error = output.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            self.error_code = code if isinstance(code, int) else None
            self.error_type = str(error.get("type"))
            return
        body = output.get("body")
        if not isinstance(body, dict):
            return
        chunk = body.get("chunk", body)
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        if isinstance(chunk.get("id"), str):
            self.response_id = chunk["id"]
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                index = choice.get("index")
                self.finish_reasons[index if isinstance(index, int) else 0] = choice["finish_reason"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self.input_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self.output_tokens = usage["completion_tokens"]

    def attributes(self, record: RecordInfo) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": self.operation,
            "gen_ai.provider.name": "vllm",
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": record.topic,
            "messaging.destination.partition.id": str(record.partition),
            "messaging.kafka.offset": record.offset,
            "messaging.consumer.group.name": record.group_id,
        }
        if self.model is not None:
            attributes["gen_ai.request.model"] = self.model
            attributes["gen_ai.response.model"] = self.model
        if self.response_id is not None:
            attributes["gen_ai.response.id"] = self.response_id
        if self.finish_reasons:
            attributes["gen_ai.response.finish_reasons"] = [
                self.finish_reasons[i] for i in sorted(self.finish_reasons)
            ]
        if self.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = self.input_tokens
        if self.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = self.output_tokens
        if self.error_type is not None:
            attributes["error.type"] = self.error_type
        return attributes


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """One processed record as its request's span sees it."""

    request_id: str | None  # None: a dead letter, not a request
    record: RecordInfo
    headers: Headers  # the input record's trace headers
    output: Mapping[str, Any] | None
    closed: bool  # the request ended with this record
    output_tokens: int | None = None


class Spans(Protocol):
    def observe(self, event: SpanEvent) -> Headers: ...

    def close_partition(self, partition: int) -> None: ...

    def shutdown(self) -> None: ...


class NoSpans:
    """Without OpenTelemetry: outputs carry the input's own trace headers."""

    def observe(self, event: SpanEvent) -> Headers:
        return event.headers

    def close_partition(self, partition: int) -> None:
        pass

    def shutdown(self) -> None:
        pass


NO_SPANS = NoSpans()


@dataclass(slots=True)
class _OpenSpan:
    span: Any
    record: RecordInfo
    summary: RequestSummary
    headers: Headers  # the span's own traceparent (+ the request's tracestate)


class RequestSpans:
    """One OpenTelemetry span per request; ``tracer`` is an ``opentelemetry.trace.Tracer``."""

    def __init__(self, tracer: Any, *, max_open: int = MAX_OPEN_SPANS, provider: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._tracer = tracer
        self._provider = provider
        self._propagator = TraceContextTextMapPropagator()
        self._open: OrderedDict[str, _OpenSpan] = OrderedDict()
        self._max_open = max_open

    @property
    def open_spans(self) -> int:
        return len(self._open)

    def observe(self, event: SpanEvent) -> Headers:
        """Open (first record), update and close (``closed``) the request's span; the outputs' headers."""
        request_id, record, headers, output = event.request_id, event.record, event.headers, event.output
        closed, output_tokens = event.closed, event.output_tokens
        if request_id is None:  # a dead letter: not a request; its trace headers pass as they came
            return headers
        opened = self._open.get(request_id)
        if opened is None:
            if output is None:  # a duplicate of a request not open here: no span to start
                return headers
            opened = self._start(request_id, record, headers)
            # An error for a request not open here (a rejected first record, a refusal at a cap, a
            # 409 without state) leaves nothing open: its span ends with it.
            closed = closed or isinstance(output.get("error"), dict)
        if output is not None:
            opened.summary.update(output)
        if output_tokens is not None:
            opened.summary.output_tokens = output_tokens
        out = opened.headers + tuple(h for h in headers if h[0] == BAGGAGE)
        if closed:
            self._end(self._open.pop(request_id))
        return out

    def _start(self, request_id: str, record: RecordInfo, headers: Headers) -> _OpenSpan:
        carrier = {name: value.decode("ascii", errors="replace") for name, value in headers}
        parent = self._propagator.extract(carrier) if TRACEPARENT in carrier else None
        span = self._tracer.start_span(
            "process derender",  # GenAI spans are named "{operation} {model}"; set at the end
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            start_time=time.time_ns(),
        )
        out: dict[str, str] = {}
        self._propagator.inject(out, context=self._trace.set_span_in_context(span))
        own = tuple((name, value.encode("ascii")) for name, value in sorted(out.items()))
        opened = _OpenSpan(span, record, RequestSummary(), own)
        self._open[request_id] = opened
        while len(self._open) > self._max_open:
            _, oldest = self._open.popitem(last=False)
            self._end(oldest)
        return opened

    def _end(self, opened: _OpenSpan) -> None:
        summary = opened.summary
        span = opened.span
        span.update_name(f"{summary.operation} {summary.model}" if summary.model else summary.operation)
        span.set_attributes(summary.attributes(opened.record))
        if summary.error_type is not None:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, summary.error_type))
        span.end()

    def close_partition(self, partition: int) -> None:
        """End the spans of one input partition's requests (revoked or reset)."""
        for request_id in [r for r, o in self._open.items() if o.record.partition == partition]:
            self._end(self._open.pop(request_id))

    def close_all(self) -> None:
        """End every open span (partitions revoked, shutdown): their requests continue elsewhere."""
        while self._open:
            _, opened = self._open.popitem(last=False)
            self._end(opened)

    def shutdown(self) -> None:
        self.close_all()
        if self._provider is not None:
            self._provider.shutdown()  # flushes the batch processor


# --- configuration ---------------------------------------------------------------------------------


OTEL_ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def otel_wanted(endpoint: str | None) -> bool:
    """Spans are on with ``--otel-endpoint`` or a standard OTLP endpoint variable, unless
    ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(endpoint) or any(os.environ.get(name) for name in OTEL_ENDPOINT_ENVS)


def build_spans(endpoint: str | None, service_name: str = "derender-worker") -> Spans:
    """``RequestSpans`` exporting over OTLP/HTTP when wanted, else ``NO_SPANS``.

    ``endpoint`` is the collector's base URL (``http://collector:4318``); ``/v1/traces`` is
    appended as the OTLP specification does for ``OTEL_EXPORTER_OTLP_ENDPOINT``. Everything else
    (headers, timeouts, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, sampling) comes from the
    standard ``OTEL_*`` variables, read by the SDK.
    """
    if not otel_wanted(endpoint):
        return NO_SPANS
    from worker.errors import ConfigurationError

    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigurationError(
            "tracing was asked for (--otel-endpoint / OTEL_EXPORTER_OTLP_*) but OpenTelemetry is not "
            "installed: pip install 'derender-worker[otel]'"
        ) from exc
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    exporter = (
        OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces") if endpoint else OTLPSpanExporter()
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return RequestSpans(provider.get_tracer("derender-worker"), provider=provider)
