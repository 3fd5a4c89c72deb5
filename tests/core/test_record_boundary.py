"""The per-record boundary: whatever a record holds, it ends as exactly one output, error record,
skip or dead letter, serialized within the limits, and the records after it are unaffected."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from schemas.bounds import MAX_JSON_DEPTH
from schemas.envelope import DeadLetterRecord, OutputEnvelope
from tests.golden_cases import MODELS_DIR, derenderer_for, sample_config
from tests.stream_builders import chat_stream
from worker.core.envelope_processor import DEFAULT_MAX_OUTPUT_BYTES, EnvelopeProcessor, ProcessResult
from worker.core.json_scan import json_depth_exceeds
from worker.core.live_parsers import LIVE_PARSER_BYTES
from worker.runtime.dead_letters import record as dead_letter_record

PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
CONFIG = sample_config(max_model_len=64)
BIG = "18446744073709551616"  # 2**64: no 64-bit integer holds it


def _processor(**options: Any) -> EnvelopeProcessor:
    return EnvelopeProcessor(derenderer_for(CONFIG), max_record_bytes=8 * 1024 * 1024, **options)


def _good() -> list[bytes]:
    return [orjson.dumps(r) for r in chat_stream("good", [[9707], [0], [151645]], prompt_token_ids=PROMPT)]


def _first(**body: Any) -> dict[str, Any]:
    """The first record of request ``bad`` with ``body`` merged in."""
    record = chat_stream("bad", [[9707]], prompt_token_ids=PROMPT)[0]
    record["body"].update(body)
    return record


def _with_choice(**choice: Any) -> dict[str, Any]:
    record = _first()
    record["body"]["generate_chunk"]["choices"][0].update(choice)
    return record


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _dead_letter(result: ProcessResult, limit: int, headers: Any = None) -> bytes:
    """The dead-letter record the worker writes for ``result`` (``dead_letter_record``)."""
    assert result.dead_letter is not None and result.payload is None
    return dead_letter_record.encode(result.dead_letter, headers, None, max_bytes=limit)


def _check_result(result: ProcessResult, limit: int) -> None:
    """One outcome, its payload serialized, within the limit, and valid against the schemas."""
    assert sum([result.duplicate, result.dead_letter is not None, result.output is not None]) == 1
    if result.duplicate:
        assert result.payload is None
        return
    if result.dead_letter is not None:
        letter = _dead_letter(result, limit)
        assert len(letter) <= limit
        DeadLetterRecord.model_validate_json(letter)
    else:
        assert result.payload is not None and len(result.payload) <= limit
        OutputEnvelope.model_validate_json(result.payload)
        assert orjson.dumps(result.output) == result.payload


def _good_outputs(results: Sequence[ProcessResult]) -> list[Any]:
    outs = [orjson.loads(r.payload) for r in results if r.payload and r.request_id == "good"]
    for out in outs:
        out["body"]["chunk"]["created"] = 0
    return outs


def _run_between(bad: bytes, **options: Any) -> ProcessResult:
    """Process ``bad`` between the good stream's records; the good stream must be unchanged."""
    good = _good()
    reference = _processor()
    clean = _good_outputs([reference.process(r) for r in good])
    processor = _processor(**options)
    results = [processor.process(good[0]), processor.process(bad), processor.process(good[1])]
    results.append(processor.process(good[2]))
    for result in results:
        _check_result(result, processor.max_output_bytes)
    assert _good_outputs(results) == clean
    return results[1]


def _error_code(result: ProcessResult) -> int:
    assert result.output is not None and "error" in result.output, result.output
    code: int = result.output["error"]["code"]
    return code


# --- integers past 64 bits -------------------------------------------------------------------

BIG_INT_BODIES: dict[str, dict[str, Any]] = {
    "token id": _with_choice(token_ids=[BIG]),
    "token id as a JSON number": _with_choice(token_ids=[2**64 - 1]),
    "choice index": _with_choice(index=BIG),
    "stop_reason": _with_choice(stop_reason=2**64 - 1, finish_reason="stop"),
    "stream_state.read_offset": _first(stream_state={"read_offset": BIG}),
    "stream_state.logprob_context_token_ids": _first(stream_state={"logprob_context_token_ids": [BIG]}),
    "stream_state.logprob_text_offset": _first(stream_state={"logprob_text_offset": BIG}),
    "prompt_token_ids": _first(prompt_token_ids=[*PROMPT, BIG]),
    "prompt_tokens": _first(prompt_tokens=BIG),
    "usage": _first(
        generate_chunk={
            "request_id": "bad",
            "choices": [],
            "usage": {"prompt_tokens": BIG, "total_tokens": 1},
        }
    ),
    "chat_request.n": _first(chat_request={"model": "test-model", "messages": [], "n": BIG}),
    "logprob placeholder": _with_choice(
        logprobs={"content": [{"token": f"token_id:{BIG}", "logprob": -0.1, "top_logprobs": []}]}
    ),
    "usage sums past 64 bits": _first(
        prompt_tokens=2**63 - 1,
        generate_chunk={
            "request_id": "bad",
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2**63 - 1, "total_tokens": 1},
        },
    ),
}


@pytest.mark.parametrize("name", sorted(BIG_INT_BODIES))
def test_integers_past_64_bits_in_a_body_are_a_400(name: str) -> None:
    assert _error_code(_run_between(orjson.dumps(BIG_INT_BODIES[name]))) == 400


def test_a_seq_past_64_bits_is_a_dead_letter() -> None:
    record = _first()
    record["seq"] = BIG
    result = _run_between(orjson.dumps(record))
    assert result.dead_letter is not None and "seq" in result.dead_letter.reason


# --- nesting ---------------------------------------------------------------------------------

DEEP = 300  # deeper than orjson writes (254), shallower than it reads (1024)
DEEP_BODIES: dict[str, dict[str, Any]] = {
    "generate_chunk.metrics": _first(
        generate_chunk={
            "request_id": "bad",
            "choices": [{"index": 0, "token_ids": [9707]}],
            "metrics": {"x": _nested(DEEP)},
        }
    ),
    "chat_request.messages": _first(
        chat_request={"model": "test-model", "messages": [{"role": "user", "content": _nested(DEEP)}]}
    ),
    "chat_request.tools": _first(
        chat_request={
            "model": "test-model",
            "messages": [],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"p": _nested(DEEP)}}}],
        }
    ),
    "an unknown body field": _first(extra=_nested(DEEP)),
    "just past the limit": _first(
        generate_chunk={"request_id": "bad", "choices": [], "metrics": {"x": _nested(MAX_JSON_DEPTH - 3)}}
    ),
}


@pytest.mark.parametrize("name", sorted(DEEP_BODIES))
def test_nesting_deeper_than_the_limit_is_a_400(name: str) -> None:
    result = _run_between(json.dumps(DEEP_BODIES[name]).encode())  # deeper than orjson writes
    assert _error_code(result) == 400
    assert result.output is not None and "deeper than" in result.output["error"]["message"]


def test_nesting_up_to_the_limit_is_accepted_and_copied() -> None:
    # The envelope, body, generate_chunk and metrics objects are 4 levels; the list fills the rest.
    metrics = {"x": _nested(MAX_JSON_DEPTH - 4)}
    record = _first(generate_chunk={"request_id": "bad", "choices": [], "metrics": metrics})
    result = _run_between(orjson.dumps(record))
    assert result.output is not None and result.output["body"]["chunk"]["metrics"] == metrics


@pytest.mark.parametrize(
    ("text", "deeper"),
    [
        (b"[]", False),
        (b"[" * 200 + b"]" * 200, True),
        (b'["' + b"[" * 200 + b'"]', False),  # brackets inside a string do not nest
        (b'["\\"' + b"[" * 200 + b'"]', False),  # nor after an escaped quote
        (b"[" + b"[1]," * 500 + b"1]", False),  # wide, not deep
        (b'{"a":' * 129 + b"1" + b"}" * 129, True),
        (b'{"a":' * 128 + b"1" + b"}" * 128, False),
    ],
)
def test_json_depth(text: bytes, deeper: bool) -> None:
    orjson.loads(text)
    assert json_depth_exceeds(text, 128) is deeper


# --- dead letters ----------------------------------------------------------------------------


def test_nul_bytes_make_a_base64_dead_letter_of_about_their_size() -> None:
    value = b'{"request_id": "' + b"\x00" * (3 * 1024 * 1024) + b'"}'
    result = _run_between(value)
    payload = _dead_letter(result, DEFAULT_MAX_OUTPUT_BYTES)
    letter = DeadLetterRecord.model_validate_json(payload)
    assert letter.original_encoding == "base64" and not letter.truncated
    assert base64.b64decode(letter.original) == value
    assert len(payload) < 1.4 * len(value)  # not the 6x of "\u0000" escapes


def test_a_dead_letter_too_large_for_the_limit_is_truncated_with_size_and_digest() -> None:
    value = b"not json " * 100_000
    payload = _dead_letter(_run_between(value, max_output_bytes=64 * 1024), 64 * 1024)
    assert len(payload) <= 64 * 1024
    letter = DeadLetterRecord.model_validate_json(payload)
    assert letter.truncated and letter.original_encoding == "utf-8"
    assert value.startswith(letter.original.encode()) and len(letter.original) > 60_000
    assert (letter.original_size, letter.original_sha256) == (len(value), hashlib.sha256(value).hexdigest())


def test_a_long_key_and_many_headers_are_cut_to_fit() -> None:
    processor = _processor(max_output_bytes=200_000)
    key = b"k" * 100_000
    headers = [(f"h{i}", b"v" * 1000) for i in range(200)]
    result = processor.process(b"{not json", key)
    payload = _dead_letter(result, 200_000, headers)
    assert result.dead_letter is not None
    dead_key = dead_letter_record.kafka_key(result.dead_letter)
    assert dead_key is not None
    assert len(payload) + len(dead_key) <= 200_000
    letter = DeadLetterRecord.model_validate_json(payload)
    assert letter.truncated and letter.original == "{not json"


# --- carried stream_state --------------------------------------------------------------------

INCONSISTENT_STATES: dict[str, dict[str, Any]] = {
    "prefix_offset past prev_tokens": {"prev_tokens": ["a"], "prefix_offset": 5, "read_offset": 6},
    "read_offset past prev_tokens": {"prev_tokens": ["a", "b"], "prefix_offset": 0, "read_offset": 3},
    "prefix_offset past read_offset": {"prev_tokens": ["a", "b"], "prefix_offset": 2, "read_offset": 1},
    "output_token_ids past max_model_len": {"output_token_ids": [1] * 65, "output_chunk_lens": [65]},
    "chunk lens that do not cover the output": {"output_token_ids": [1, 2], "output_chunk_lens": [1]},
    "logprob context past its window": {"logprob_context_token_ids": [1, 2, 3, 4, 5]},
    "tool call ids past max_model_len": {"last_tool_call_ids": ["x"] * 65},
}


@pytest.mark.parametrize("name", sorted(INCONSISTENT_STATES))
def test_an_inconsistent_carried_state_is_a_400(name: str) -> None:
    result = _run_between(orjson.dumps(_first(stream_state=INCONSISTENT_STATES[name])))
    assert _error_code(result) == 400


def test_a_consistent_carried_state_resumes_the_stream() -> None:
    processor = _processor()
    first = processor.process(_good()[0])
    assert first.output is not None
    state = first.stream_state()
    resumed = chat_stream("other", [[9707], [0], [151645]], prompt_token_ids=PROMPT)[1]
    resumed["body"]["stream_state"] = state
    result = _processor().process(orjson.dumps(resumed))
    assert result.output is not None and "body" in result.output
    assert result.output["body"]["chunk"]["choices"][0]["delta"]["content"] == "!"


# --- per-request bounds ----------------------------------------------------------------------


def test_a_choice_index_must_be_below_n() -> None:
    assert _error_code(_run_between(orjson.dumps(_with_choice(index=1)))) == 400
    assert _error_code(_run_between(orjson.dumps(_with_choice(index=-1)))) == 400
    two = _first(chat_request={"model": "test-model", "messages": [], "n": 2})
    two["body"]["generate_chunk"]["choices"][0]["index"] = 1
    result = _run_between(orjson.dumps(two))
    assert result.output is not None and "body" in result.output


def test_a_request_past_its_state_limit_fails_and_the_partition_goes_on() -> None:
    # Every new choice index of an n=40 request adds a choice state; the limit stops it.
    processor = _processor(max_request_state_bytes=4000)
    request = {"model": "test-model", "messages": [], "n": 40}
    grow = [_first(chat_request=request)]
    for index in range(1, 40):
        record = _with_choice(index=index)
        record["seq"] = index
        for name in ("chat_request", "prompt_token_ids", "prompt_tokens", "model"):
            del record["body"][name]  # inherited from the first record
        grow.append(record)
    good = _good()
    outcomes = []
    for i, record in enumerate(grow):
        outcomes.append(processor.process(orjson.dumps(record)))
        if i < len(good):
            _check_result(processor.process(good[i]), processor.max_output_bytes)
    errors = [r for r in outcomes if r.output is not None and "error" in r.output]
    assert 1 < len(outcomes) - len(errors) < 40  # some choices fitted
    assert errors[0].output is not None
    assert errors[0].output["error"]["code"] == 413 and errors[0].closed
    assert all(_error_code(r) == 409 for r in errors[1:])  # the failed request stays failed
    assert "bad" not in processor.requests


def test_a_request_context_past_the_state_limit_is_refused() -> None:
    big_messages = [{"role": "user", "content": "x" * 10_000}]
    record = _first(chat_request={"model": "test-model", "messages": big_messages})
    assert _error_code(_run_between(orjson.dumps(record), max_request_state_bytes=8000)) == 413


def test_a_later_record_whose_request_is_too_large_fails_the_request() -> None:
    from worker.runtime.state.changelog import encode_context

    processor = _processor(max_request_state_bytes=8000)
    records = [orjson.loads(r) for r in _good()]
    processor.process(orjson.dumps(records[0]))
    records[1]["body"]["chat_request"] = {"model": "test-model", "messages": [{"content": "x" * 10_000}]}
    assert len(encode_context(processor.requests["good"])) <= 8000
    refused = processor.process(orjson.dumps(records[1]))
    assert _error_code(refused) == 413 and refused.closed
    assert _error_code(processor.process(orjson.dumps(records[2]))) == 409


def test_an_output_past_the_output_limit_is_a_413_and_fails_the_request() -> None:
    processor = _processor(max_output_bytes=20_000)
    records = [orjson.dumps(r) for r in chat_stream("r", [[9707], [0], [15]], prompt_token_ids=PROMPT)]
    processor.process(records[0])
    huge = orjson.loads(records[1])
    huge["body"]["generate_chunk"]["request_id"] = "i" * 30_000  # copied into the chunk's id
    result = processor.process(orjson.dumps(huge))
    assert _error_code(result) == 413 and result.closed
    assert result.payload is not None and len(result.payload) <= 20_000
    assert _error_code(processor.process(records[2])) == 409


def test_error_messages_are_bounded() -> None:
    record = _with_choice(token_ids=["x"] * 50_000)
    result = _run_between(orjson.dumps(record))
    assert _error_code(result) == 400
    assert result.payload is not None and len(result.payload) < 8_000


# --- keys ------------------------------------------------------------------------------------


def test_keyless_records_and_control_characters_are_dead_letters_when_keys_are_required() -> None:
    keyed = _processor(require_key=True)
    good = _good()[0]
    assert keyed.process(good, b"good").output is not None
    keyless = keyed.process(_good()[1])
    assert keyless.dead_letter is not None and "no key" in keyless.dead_letter.reason
    record = chat_stream("bad\x07id", [[9707]], prompt_token_ids=PROMPT)[0]
    control = keyed.process(orjson.dumps(record), b"bad\x07id")
    assert control.dead_letter is not None and "control characters" in control.dead_letter.reason
    # Replay reads key-less JSON lines: without require_key both are processed.
    plain = _processor()
    assert plain.process(good).output is not None
    assert plain.process(orjson.dumps(record)).output is not None


# --- a processing bug ------------------------------------------------------------------------


def test_an_unexpected_exception_fails_its_request_with_a_500_and_the_stream_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    processor = _processor()
    good = _good()
    real = processor.derenderer.chat_stream

    def broken(body: Any, state: Any) -> Any:
        if body.generate_chunk.request_id == "bad":
            raise ZeroDivisionError("a bug")
        return real(body, state)

    monkeypatch.setattr(processor.derenderer, "chat_stream", broken)
    processor.process(good[0])
    result = processor.process(orjson.dumps(_first()))
    assert isinstance(result.internal_error, ZeroDivisionError)  # logged and counted by the runtime
    # The client learns at once that its request failed, and why: our fault, not its own.
    assert result.output is not None and result.closed and not processor.is_open("bad")
    error = result.output["error"]
    assert error["code"] == 500 and error["type"] == "InternalServerError" and "a bug" in error["message"]
    _check_result(result, processor.max_output_bytes)
    assert processor.process(good[1]).output is not None


# --- replay ----------------------------------------------------------------------------------


def test_replay_never_dies_and_good_lines_are_unaffected(tmp_path: Path) -> None:
    big_seq = _first()
    big_seq["seq"] = BIG
    states = [_first(stream_state=state) for state in INCONSISTENT_STATES.values()]
    bodies = [*BIG_INT_BODIES.values(), *DEEP_BODIES.values(), *states, big_seq]
    poison = [json.dumps({**b, "request_id": f"bad-{i}"}).encode() for i, b in enumerate(bodies)]
    poison.append(b"\x00" * 1000)
    good = _good()
    lines = [good[0], *poison, good[1], good[2]]
    argv = ["--tokenizer", str(MODELS_DIR / "qwen3"), "--served-model-name", "test-model"]

    def replay(path: Path) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "worker.cli", "replay", str(path), *argv, "--max-model-len", "64"]
        return subprocess.run(command, capture_output=True, timeout=120, check=False)

    mixed, alone = tmp_path / "mixed.jsonl", tmp_path / "alone.jsonl"
    mixed.write_bytes(b"\n".join(lines) + b"\n")
    alone.write_bytes(b"\n".join(good) + b"\n")
    done, reference = replay(mixed), replay(alone)
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr[-2000:]
    outputs = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert all("error" in o for o in outputs if o["request_id"] != "good")

    def good_of(stdout: bytes) -> list[Any]:
        outs = [orjson.loads(line) for line in stdout.splitlines()]
        return [
            {**o, "body": {**o["body"], "chunk": {**o["body"]["chunk"], "created": 0}}}
            for o in outs
            if o["request_id"] == "good"
        ]

    assert good_of(done.stdout) == good_of(reference.stdout) and len(good_of(done.stdout)) == 3


# --- live memory estimate --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt_len", "tokens", "n", "parsers"),
    [(9, 5, 1, False), (4000, 5, 1, False), (4000, 100, 4, False), (20, 5, 1, True), (20, 300, 1, True)],
)
def test_live_bytes_is_close_to_what_tracemalloc_measures(
    prompt_len: int, tokens: int, n: int, parsers: bool
) -> None:
    import gc
    import tracemalloc

    config = {**CONFIG, "max_model_len": None}
    if parsers:
        config |= {"reasoning_parser": "qwen3", "tool_parser": "hermes", "enable_auto_tool_choice": True}
    processor = EnvelopeProcessor(derenderer_for(config))
    backend = processor.derenderer.tokenizer.backend
    ids = backend.encode("Derender turns ids into text. Café 北京 🤗 " * 300, add_special_tokens=False).ids
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

    def request(rid: str) -> list[bytes]:
        chat = {"model": "test-model", "messages": [{"role": "user", "content": "hi " * 50}], "n": n}
        if parsers:
            chat["tools"] = tools
        records = chat_stream(
            rid, [[t] for t in ids[:tokens]], prompt_token_ids=ids[:prompt_len], chat_request=chat
        )
        for seq, record in enumerate(records):
            record["body"]["generate_chunk"]["choices"][0]["index"] = seq % n
            record["body"]["generate_chunk"]["choices"][0].pop("finish_reason", None)
        return [orjson.dumps(r) for r in records]

    for value in request("warm-up"):  # caches of the decoder and parsers
        processor.process(value)
    batches = [request(f"r{i}") for i in range(10)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for batch in batches:
            for value in batch:
                assert processor.process(value).output is not None
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    contexts = [processor.requests[f"r{i}"] for i in range(10)]
    sessions = sum(state.live is not None for ctx in contexts for state in ctx.sequences.values())
    estimate = sum(ctx.live_bytes() for ctx in contexts) + LIVE_PARSER_BYTES * sessions  # the pool's
    assert 0.7 * measured <= estimate <= 1.4 * measured, (estimate, measured)


def test_a_close_record_frees_the_request_at_once_and_writes_nothing() -> None:
    """ingest ended the request (an upstream error, a stream that never finished): the state went
    only at the TTL; a close record drops it now, and later records of it are duplicates."""
    processor = _processor()
    first, *_ = _good()
    assert processor.process(first, b"good").output is not None
    assert processor.is_open("good")
    closed = processor.process(orjson.dumps({"request_id": "good", "close": True}), b"good")
    assert (closed.closed, closed.output, closed.payload, closed.dead_letter) == (True, None, None, None)
    assert not processor.is_open("good")
    assert processor.process(first, b"good").duplicate  # seq 0 again: the request is over
    # A close for a request not open here: nothing happens; a malformed one is a dead letter.
    unknown = processor.process(orjson.dumps({"request_id": "other", "close": True}), b"other")
    assert (unknown.closed, unknown.output, unknown.dead_letter) == (False, None, None)
    bad = processor.process(orjson.dumps({"request_id": "good", "close": "yes"}), b"good")
    assert bad.dead_letter is not None and "close" in bad.dead_letter.reason
    wrong_key = processor.process(orjson.dumps({"request_id": "good", "close": True}), b"other")
    assert wrong_key.dead_letter is not None
