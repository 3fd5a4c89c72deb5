"""W3C trace context from input records to every record they cause, and the optional span per request.

Header propagation is tested through a real ``OwnedPartition`` (recording sink) and end to end
through a worker process on the real broker; spans with the OpenTelemetry SDK's in-memory exporter.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.golden_cases import derenderer_for
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import QWEN3_CONFIG, TopicReader, WorkerGroup, generate_sequences, make_worker_topics
from tests.partition_fakes import RecordingSink, owned_partition
from tests.paths import REPO_ROOT
from worker.runtime.observability.observer import RecordObserver
from worker.runtime.observability.tracing import (
    MAX_BAGGAGE_BYTES,
    MAX_TRACESTATE_BYTES,
    NO_SPANS,
    RequestSpans,
    build_spans,
    propagated,
    valid_traceparent,
)
from worker.runtime.partition import OwnedPartition

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
HEADERS = [
    ("traceparent", PARENT.encode()),
    ("tracestate", b"vendor=opaque"),
    ("baggage", b"tenant=acme"),
    ("x-other", b"not propagated"),
]


# --- header validation -----------------------------------------------------------------------------


def test_valid_traceparent() -> None:
    assert valid_traceparent(PARENT.encode())
    assert valid_traceparent(f"01-{TRACE_ID}-00f067aa0ba902b7-01-future".encode())
    for bad in (
        f"00-{TRACE_ID}-00f067aa0ba902b7-01-extra",  # version 00 has exactly four fields
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",  # version ff is forbidden
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01",  # upper-case hex
        f"00-{TRACE_ID}-00f067aa0ba902b7",  # no flags
        "",
    ):
        assert not valid_traceparent(bad.encode()), bad


def test_propagated_keeps_only_valid_trace_headers() -> None:
    assert propagated(HEADERS) == (
        ("traceparent", PARENT.encode()),
        ("tracestate", b"vendor=opaque"),
        ("baggage", b"tenant=acme"),
    )
    assert propagated(None) == ()
    assert propagated([("x-other", b"1")]) == ()
    # HTTP mappings (gateway) work too, names compared in lower case, first occurrence wins.
    assert propagated({"Traceparent": PARENT}) == (("traceparent", PARENT.encode()),)
    assert (
        propagated([("traceparent", PARENT.encode()), ("traceparent", b"garbage")])[0][1] == PARENT.encode()
    )
    # An invalid traceparent takes its tracestate along; baggage is independent of it.
    assert propagated([("traceparent", b"garbage"), ("tracestate", b"a=b"), ("baggage", b"k=v")]) == (
        ("baggage", b"k=v"),
    )
    # Oversized values are dropped rather than copied.
    big_state = b"a=" + b"x" * MAX_TRACESTATE_BYTES
    big_baggage = b"k=" + b"v" * MAX_BAGGAGE_BYTES
    assert propagated(
        [("traceparent", PARENT.encode()), ("tracestate", big_state), ("baggage", big_baggage)]
    ) == (("traceparent", PARENT.encode()),)
    assert propagated([("traceparent", None), ("baggage", 3)]) == ()


# --- through a partition ---------------------------------------------------------------------------


class TracedRecord:
    def __init__(
        self, offset: int, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        self.topic, self.partition, self.offset = "in", 2, offset
        self.key, self.value, self.headers = key, value, headers
        self.timestamp = 0


def _task(sink: RecordingSink, observer: RecordObserver) -> OwnedPartition:
    return owned_partition(derenderer_for(QWEN3_CONFIG), sink, observer=observer)


def _records(envelopes: list[dict[str, Any]], headers: list[tuple[str, bytes]]) -> list[TracedRecord]:
    return [
        TracedRecord(i, orjson.dumps(e), e["request_id"].encode(), headers) for i, e in enumerate(envelopes)
    ]


def _feed(task: OwnedPartition, records: list[TracedRecord]) -> None:
    async def body() -> None:
        for record in records:
            await task.handle(record)

    asyncio.run(body())


def test_outputs_errors_and_dead_letters_carry_the_inputs_trace_context() -> None:
    [sequence] = generate_sequences(1, seed=3, prefix="trace")
    sink = RecordingSink()
    task = _task(sink, RecordObserver("g"))
    gap = dict(sequence.envelopes[1], request_id="trace-gap", seq=5)  # a 409 error record
    records = _records([*sequence.envelopes, gap], HEADERS)
    records.append(TracedRecord(len(records), b"not json", b"k", HEADERS))  # a dead letter
    records.append(TracedRecord(len(records), b"{}", b"k", []))  # a dead letter without headers
    _feed(task, records)
    expected = propagated(HEADERS)
    outputs = [r for r in sink.sent if r.topic == "out"]
    letters = [r for r in sink.sent if r.topic == "dlq"]
    assert len(outputs) == len(sequence.envelopes) + 1 and len(letters) == 2
    assert all(r.headers == expected for r in outputs)
    assert orjson.loads(outputs[-1].value or b"")["error"]["code"] == 409
    assert letters[0].headers == expected
    assert letters[1].headers == ()


def test_spans_one_per_request_with_genai_and_messaging_attributes() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = RequestSpans(provider.get_tracer("test"))
    sink = RecordingSink()
    task = _task(sink, RecordObserver("group-7", spans))
    first, second = generate_sequences(2, seed=5, prefix="span")
    other_parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    records = _records(first.envelopes, HEADERS)
    records += [
        TracedRecord(
            len(records) + i,
            orjson.dumps(e),
            e["request_id"].encode(),
            [("traceparent", other_parent.encode())],
        )
        for i, e in enumerate(second.envelopes)
    ]
    records.append(TracedRecord(len(records), b"[]", b"k", HEADERS))  # a dead letter: no span
    # A duplicate of a request that already closed opens no span either.
    records.append(TracedRecord(len(records), orjson.dumps(first.envelopes[0]), records[0].key, HEADERS))
    _feed(task, records)
    finished = exporter.get_finished_spans()
    assert len(finished) == 2 and spans.open_spans == 0
    by_trace = {format(s.context.trace_id, "032x"): s for s in finished}
    span = by_trace[TRACE_ID]
    assert span.parent is not None and format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert span.kind is SpanKind.CONSUMER
    operation = "chat" if first.envelopes[0]["endpoint"] == "chat" else "text_completion"
    assert span.name == f"{operation} test-model"
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.operation.name"] == operation
    assert attributes["gen_ai.request.model"] == "test-model"
    first_chunk = orjson.loads(sink.sent[0].value or b"")["body"]["chunk"]
    assert attributes["gen_ai.response.id"] == first_chunk["id"]
    assert attributes["gen_ai.response.finish_reasons"] == (
        "stop",
    )  # OpenTelemetry keeps sequences as tuples
    assert attributes["messaging.system"] == "kafka"
    assert attributes["messaging.destination.name"] == "in"
    assert attributes["messaging.destination.partition.id"] == "2"
    assert attributes["messaging.kafka.offset"] == 0
    assert attributes["messaging.consumer.group.name"] == "group-7"
    # Every output of the request continues the trace from the worker's span (tracestate inherited);
    # baggage passes as given.
    own = f"00-{TRACE_ID}-{format(span.context.span_id, '016x')}-01".encode()
    first_outputs = [
        r for r in sink.sent if r.topic == "out" and r.key == first.envelopes[0]["request_id"].encode()
    ]
    assert first_outputs and all(
        dict(r.headers) == {"traceparent": own, "tracestate": b"vendor=opaque", "baggage": b"tenant=acme"}
        for r in first_outputs
    )
    assert "0af7651916cd43dd8448eb211c80319c" in by_trace
    [letter] = [r for r in sink.sent if r.topic == "dlq"]
    assert letter.headers == propagated(HEADERS)


def test_an_expired_request_ends_its_span_with_an_error() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = RequestSpans(provider.get_tracer("test"))
    sink = RecordingSink()
    task = _task(sink, RecordObserver("g", spans))
    [sequence] = generate_sequences(1, seed=9, prefix="ttl")
    _feed(task, _records(sequence.envelopes[:1], HEADERS))
    assert spans.open_spans == 1 and not exporter.get_finished_spans()
    assert asyncio.run(task.expire(0.0)) == 1
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    expired = sink.sent[-1]
    assert orjson.loads(expired.value or b"")["error"]["code"] == 408
    assert dict(expired.headers)["traceparent"].startswith(f"00-{TRACE_ID}-".encode())


def test_closing_a_partition_ends_its_open_spans() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = RequestSpans(provider.get_tracer("test"), max_open=2)
    observer = RecordObserver("g", spans)
    task = _task(RecordingSink(), observer)
    sequences = generate_sequences(3, seed=2, prefix="open")
    _feed(task, _records([s.envelopes[0] for s in sequences], HEADERS))
    # Three requests opened, at most two spans kept: the oldest was ended.
    assert spans.open_spans == 2 and len(exporter.get_finished_spans()) == 1
    observer.partition_closed(3)
    assert spans.open_spans == 2
    observer.partition_closed(2)
    assert spans.open_spans == 0 and len(exporter.get_finished_spans()) == 3


def test_no_opentelemetry_without_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert build_spans(None) is NO_SPANS
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert build_spans(None) is NO_SPANS
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    spans = build_spans(None)
    assert isinstance(spans, RequestSpans)
    spans.shutdown()
    # A fresh interpreter running the worker's record path with trace headers never imports it.
    code = f"""
import asyncio, sys, orjson
from aiokafka import TopicPartition
from tests.golden_cases import derenderer_for
from tests.kafka_helpers import QWEN3_CONFIG, generate_sequences
from tests.partition_fakes import TOPICS, FakeRecord, RecordingSink, changelog_for
import worker.commands.run, worker.runtime.worker
from worker.core.envelope_processor import EnvelopeProcessor
from worker.runtime.observability.metrics import Metrics
from worker.runtime.observability.observer import RecordObserver
from worker.runtime.partition import OwnedPartition
from worker.runtime.observability.tracing import build_spans
sink = RecordingSink()
task = OwnedPartition(TopicPartition("in", 2), EnvelopeProcessor(derenderer_for(QWEN3_CONFIG)), sink, TOPICS,
                     Metrics(), position=0, changelog=changelog_for(TopicPartition("in", 2)),
                     observer=RecordObserver("g", build_spans(None)))
[s] = generate_sequences(1, seed=1, prefix="x")
async def main():
    for i, e in enumerate(s.envelopes):
        record = FakeRecord(i, e)
        record.headers = [("traceparent", {PARENT.encode()!r})]
        await task.handle(record)
asyncio.run(main())
assert sink.sent and all(r.headers for r in sink.sent)
sys.exit(1 if any(m.startswith("opentelemetry") for m in sys.modules) else 0)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {"PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stderr


# --- end to end on the real broker -----------------------------------------------------------------


@pytest.mark.kafka
def test_worker_propagates_trace_headers_through_kafka(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    topics = make_worker_topics(kafka_topic_factory, 2)
    sequences = generate_sequences(2, seed=13, prefix=f"e2e-{uuid.uuid4().hex[:6]}")
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG)

    async def body() -> tuple[list[Any], list[Any]]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            count = 0
            for sequence in sequences:
                for envelope in sequence.envelopes:
                    await producer.send(
                        topics.input,
                        orjson.dumps(envelope),
                        key=envelope["request_id"].encode(),
                        headers=HEADERS,
                    )
                    count += 1
            await producer.send(topics.input, b"not json", key=b"bad", headers=HEADERS)
            await producer.flush()
        finally:
            await producer.stop()
        outputs = await TopicReader(kafka_bootstrap, topics.output).start()
        letters = await TopicReader(kafka_bootstrap, topics.dlq).start()
        try:
            await outputs.wait_for(count, 120, "outputs", group.logs)
            await letters.wait_for(1, 60, "dead letters", group.logs)
        finally:
            await outputs.stop()
            await letters.stop()
        return outputs.records, letters.records

    group.start()
    try:
        outputs, letters = asyncio.run(body())
    finally:
        group.stop_all()
    expected = [(name, value) for name, value in propagated(HEADERS)]
    assert outputs and all(list(r.headers) == expected for r in outputs)
    assert [list(r.headers) for r in letters] == [expected]


# --- the OTLP exporter, end to end -----------------------------------------------------------------


class OtlpReceiver:
    """A minimal OTLP/HTTP collector: keeps every span POSTed to /v1/traces."""

    def __init__(self) -> None:
        import http.server
        import threading

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        receiver = self
        self.spans: list[Any] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            receiver.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attribute in span.attributes:
        value = attribute.value
        kind = value.WhichOneof("value")
        out[attribute.key] = (
            [v.string_value for v in value.array_value.values]
            if kind == "array_value"
            else getattr(value, kind)
        )
    return out


@pytest.mark.kafka
def test_worker_exports_spans_to_an_otlp_endpoint(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    receiver = OtlpReceiver()
    topics = make_worker_topics(kafka_topic_factory, 2)
    sequences = generate_sequences(3, seed=19, prefix=f"otlp-{uuid.uuid4().hex[:6]}")
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG)

    async def body() -> list[Any]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for sequence in sequences:
                for envelope in sequence.envelopes:
                    key = envelope["request_id"].encode()
                    await producer.send(topics.input, orjson.dumps(envelope), key=key, headers=HEADERS)
            await producer.flush()
        finally:
            await producer.stop()
        outputs = await TopicReader(kafka_bootstrap, topics.output).start()
        try:
            await outputs.wait_for(sum(len(s.envelopes) for s in sequences), 120, "outputs", group.logs)
        finally:
            await outputs.stop()
        return outputs.records

    group.start(["--otel-endpoint", receiver.url])
    try:
        outputs = asyncio.run(body())
    finally:
        statuses = group.stop_all()  # SIGTERM flushes the span exporter
        receiver.stop()
    assert statuses == [0]
    assert len(receiver.spans) == len(sequences)
    by_id = {}
    for span in receiver.spans:
        assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == "00f067aa0ba902b7"
        attributes = _attributes(span)
        assert attributes["messaging.destination.name"] == topics.input
        assert attributes["messaging.consumer.group.name"] == group.group_id
        assert attributes["gen_ai.request.model"] == "test-model"
        assert attributes["gen_ai.usage.output_tokens"] > 0
        by_id[span.span_id.hex()] = attributes
    # Each output names its request's span as parent: downstream work joins the same trace.
    for record in outputs:
        parent = dict(record.headers)["traceparent"].decode()
        assert parent.startswith(f"00-{TRACE_ID}-") and parent.split("-")[2] in by_id


def test_an_error_for_a_request_never_opened_ends_its_span() -> None:
    # A first record that is rejected (here: a seq past 0 without stream_state, a 409) opens no
    # request; its span must not stay open until the LRU evicts it.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = RequestSpans(provider.get_tracer("test"))
    task = _task(RecordingSink(), RecordObserver("g", spans))
    [sequence] = generate_sequences(1, seed=4, prefix="rejected")
    _feed(task, _records(sequence.envelopes[1:2], HEADERS))
    assert spans.open_spans == 0
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR


def test_an_oversized_traceparent_is_dropped_and_never_cached() -> None:
    from worker.runtime.observability import tracing

    huge = b"00-" + b"a" * 100_000
    before = len(tracing._VERDICTS)
    assert propagated([("traceparent", huge), ("tracestate", b"k=v")]) == ()
    assert len(tracing._VERDICTS) == before
