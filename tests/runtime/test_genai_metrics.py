"""GenAI metrics: tokens by kind, requests by finish reason, TTFT / TPOT, error records, bounded labels.

Records go through a real ``OwnedPartition`` (recording sink) whose processor uses the observer's
measured derenderer, as in the worker; golden streams give real reasoning and tool-call output.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.golden_cases import GoldenCase, derenderer_for, load_cases, normalize
from tests.kafka_helpers import QWEN3_CONFIG, generate_sequences
from tests.partition_fakes import TOPICS, RecordingSink, changelog_for
from worker.core.envelope_processor import EnvelopeProcessor
from worker.runtime.observability import metrics_names as m
from worker.runtime.observability.genai_metrics import REQUEST_START_HEADER, request_start_header
from worker.runtime.observability.metrics import Metrics
from worker.runtime.observability.observer import RecordObserver
from worker.runtime.observability.prometheus_export import ExportedMetrics, build_registry, labelled
from worker.runtime.partition import OwnedPartition

CASES = {case.id: case for case in load_cases()}


class TimedRecord:
    def __init__(self, offset: int, envelope: dict[str, Any], timestamp: int, headers: list[Any]) -> None:
        self.topic, self.partition, self.offset = "in", 0, offset
        self.key = envelope["request_id"].encode()
        self.value = orjson.dumps(envelope)
        self.headers = headers
        self.timestamp = timestamp


def _run(
    config: dict[str, Any],
    envelopes: Sequence[dict[str, Any]],
    *,
    metrics: Metrics | None = None,
    step_ms: int = 10,
    headers: list[Any] | None = None,
    observer: RecordObserver | None = None,
) -> tuple[Metrics, RecordingSink]:
    metrics = metrics if metrics is not None else Metrics()
    observer = observer or RecordObserver("g", metrics=metrics)
    sink = RecordingSink()
    task = OwnedPartition(
        TopicPartition("in", 0),
        EnvelopeProcessor(observer.measured(derenderer_for(config))),
        sink,
        TOPICS,
        metrics,
        position=0,
        changelog=changelog_for(TopicPartition("in", 0)),
        observer=observer,
    )

    async def body() -> None:
        for i, envelope in enumerate(envelopes):
            await task.handle(TimedRecord(i, copy.deepcopy(envelope), 1_000_000 + i * step_ms, headers or []))

    asyncio.run(body())
    return metrics, sink


def _counter(metrics: Metrics, name: str, **labels: object) -> int:
    return metrics.counters.get(labelled(name, **labels), 0)


def _tokens(metrics: Metrics, model: str = "test-model") -> dict[str, int]:
    return {
        kind: _counter(metrics, m.GEN_AI_OUTPUT_TOKENS, model=model, token_type=kind)
        for kind in ("reasoning", "content", "tool_call")
    }


def _input_tokens(envelopes: Sequence[dict[str, Any]]) -> int:
    total = 0
    for envelope in envelopes:
        body = envelope["body"]
        chunks = [body["generate_chunk"]] if "generate_chunk" in body else [body.get("generate_response")]
        chunks += body.get("generate_responses") or []
        for chunk in chunks:
            for choice in (chunk or {}).get("choices", []):
                total += len(choice.get("token_ids") or [])
    return total


def test_plain_streams_count_tokens_requests_and_timings() -> None:
    sequences = generate_sequences(6, seed=21, prefix="genai")
    envelopes = [e for s in sequences for e in s.envelopes]
    metrics, sink = _run(QWEN3_CONFIG, envelopes, step_ms=10)
    tokens = _tokens(metrics)
    assert tokens == {"reasoning": 0, "content": _input_tokens(envelopes), "tool_call": 0}
    finishes: dict[str, int] = {}
    for envelope in envelopes:
        for choice in envelope["body"]["generate_chunk"]["choices"]:
            if "finish_reason" in choice:
                finishes[choice["finish_reason"]] = finishes.get(choice["finish_reason"], 0) + 1
    for reason, count in finishes.items():
        assert _counter(metrics, m.GEN_AI_REQUESTS, model="test-model", finish_reason=reason) == count
    finished_tokens = sum(
        _counter(metrics, m.GEN_AI_FINISHED_OUTPUT_TOKENS, model="test-model", finish_reason=r)
        for r in finishes
    )
    assert finished_tokens == tokens["content"]
    # TPOT from record timestamps: records 10 ms apart in one partition, so each choice's value is
    # (its last - its first record time) / (its tokens after the first record).
    expected = []
    offset = 0
    for sequence in sequences:
        per_choice: dict[int, list[tuple[int, int]]] = {}
        for envelope in sequence.envelopes:
            for choice in envelope["body"]["generate_chunk"]["choices"]:
                per_choice.setdefault(choice["index"], []).append((offset, len(choice["token_ids"])))
            offset += 1
        for records in per_choice.values():
            later = sum(n for _, n in records[1:])
            if later:
                expected.append((records[-1][0] - records[0][0]) * 10 / later)
    key = labelled(m.GEN_AI_TIME_PER_OUTPUT_TOKEN_MS, model="test-model")
    assert sorted(metrics.timings[key]) == pytest.approx(sorted(expected))
    # No request-start header and no timing field: TTFT is not observed.
    assert labelled(m.GEN_AI_TIME_TO_FIRST_TOKEN_MS, model="test-model") not in metrics.timings
    assert len(sink.sent) == len(envelopes)


def test_ttft_from_the_request_start_header() -> None:
    [sequence] = generate_sequences(1, seed=4, prefix="ttft")
    start = 1_000_000 - 250  # the request record was written 250 ms before the first chunk
    metrics, _ = _run(QWEN3_CONFIG, sequence.envelopes, headers=[request_start_header(start)])
    assert list(metrics.timings[labelled(m.GEN_AI_TIME_TO_FIRST_TOKEN_MS, model="test-model")]) == [250.0]
    # A malformed header is ignored, not trusted.
    metrics, _ = _run(QWEN3_CONFIG, sequence.envelopes, headers=[(REQUEST_START_HEADER, b"-5")])
    assert labelled(m.GEN_AI_TIME_TO_FIRST_TOKEN_MS, model="test-model") not in metrics.timings


def test_timing_fields_of_the_generate_chunk_win() -> None:
    [sequence] = generate_sequences(1, seed=8, prefix="fields")
    envelopes = copy.deepcopy(sequence.envelopes)
    envelopes[-1]["body"]["generate_chunk"]["metrics"] = {"time_to_first_token_ms": 42.5, "mean_itl_ms": 7.25}
    metrics, _ = _run(QWEN3_CONFIG, envelopes, headers=[request_start_header(1)])
    assert list(metrics.timings[labelled(m.GEN_AI_TIME_TO_FIRST_TOKEN_MS, model="test-model")]) == [42.5]
    assert list(metrics.timings[labelled(m.GEN_AI_TIME_PER_OUTPUT_TOKEN_MS, model="test-model")]) == [7.25]
    # Untrusted fields: a string, a bool, a negative or an absurd value is not a timing.
    for bad in ("12", True, -1, 1e30, float("nan")):
        envelopes[-1]["body"]["generate_chunk"]["metrics"] = {"time_to_first_token_ms": bad}
        metrics, _ = _run(QWEN3_CONFIG, envelopes)
        assert labelled(m.GEN_AI_TIME_TO_FIRST_TOKEN_MS, model="test-model") not in metrics.timings, bad


@pytest.mark.parametrize(
    ("case_id", "kinds"),
    [
        ("qwen3-reasoning-stream-mixed", {"reasoning", "content"}),
        ("qwen3+hermes-stream-reasoning-then-tool", {"reasoning", "tool_call"}),
        ("hermes-stream-content-then-two-calls", {"content", "tool_call"}),
        ("qwen3+hermes-nonstream-reasoning-then-tool", {"reasoning", "tool_call"}),
    ],
)
def test_reasoning_content_and_tool_call_tokens(case_id: str, kinds: set[str]) -> None:
    case: GoldenCase = CASES[case_id]
    metrics, sink = _run(case.config, case.input)
    tokens = _tokens(metrics)
    assert sum(tokens.values()) == _input_tokens(case.input)
    assert {k for k, v in tokens.items() if v} >= kinds
    # Observing changes no output: the golden expectation still holds.
    outputs = [orjson.loads(r.value or b"") for r in sink.sent]
    assert normalize([{k: v for k, v in o.items() if k != "source"} for o in outputs]) == normalize(
        case.expected
    )


def test_error_records_by_code() -> None:
    [sequence] = generate_sequences(1, seed=6, prefix="err")
    gap = dict(sequence.envelopes[0], seq=7, request_id="err-gap")
    unknown_model = copy.deepcopy(sequence.envelopes[0])
    unknown_model["request_id"] = "err-model"
    unknown_model["body"]["generate_chunk"]["request_id"] = "err-model"
    unknown_model["body"]["chat_request" if unknown_model["endpoint"] == "chat" else "completion_request"][
        "model"
    ] = "nope"
    unknown_model["body"]["model"] = "nope"
    metrics, _ = _run(QWEN3_CONFIG, [gap, unknown_model])
    assert _counter(metrics, m.ERROR_RECORDS, code=409) == 1
    assert _counter(metrics, m.ERROR_RECORDS, code=404) == 1
    assert sum(_tokens(metrics).values()) == 0


def test_label_values_are_bounded() -> None:
    sequences = generate_sequences(4, seed=12, prefix="bound")
    envelopes = [copy.deepcopy(e) for s in sequences for e in s.envelopes]
    for envelope in envelopes:
        for choice in envelope["body"]["generate_chunk"]["choices"]:
            if "finish_reason" in choice:
                choice["finish_reason"] = "attacker-chosen-" + envelope["request_id"]
    metrics = Metrics()
    observer = RecordObserver("g", metrics=metrics)
    assert observer.genai is not None
    observer.genai.max_models = 0  # every model name is past the cap
    observer.genai.max_tracked = 2
    _run(QWEN3_CONFIG, envelopes, metrics=metrics, observer=observer)
    reasons = {key for key in metrics.counters if key.startswith(m.GEN_AI_REQUESTS + "{")}
    assert reasons == {labelled(m.GEN_AI_REQUESTS, finish_reason="other", model="other")}
    assert sum(_tokens(metrics, model="other").values()) == _input_tokens(envelopes)
    assert observer.genai.tracked_requests <= 2


def test_exported_under_the_genai_names() -> None:
    [sequence] = generate_sequences(1, seed=4, prefix="prom")
    metrics = ExportedMetrics()
    _run(QWEN3_CONFIG, sequence.envelopes, metrics=metrics, headers=[request_start_header(999_000)])
    text = generate_latest(build_registry(metrics, process_metrics=False)).decode()
    names = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    assert {
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_time_per_output_token_seconds_count",
        "gen_ai_server_output_tokens_total",
        "gen_ai_server_requests_total",
        "gen_ai_server_finished_output_tokens_total",
    } <= names
    assert 'gen_ai_server_output_tokens_total{model="test-model",token_type="content"}' in text
