"""Property-based fuzzing of the per-record boundary (``EnvelopeProcessor.process``).

For any bytes — arbitrary JSON (integers past 64 bits as numbers and as strings, NaN and
Infinity, nesting past what orjson writes or reads, huge lists), envelopes with any part replaced,
random ``stream_state``s, broken UTF-8 — a record gets exactly one outcome, its serialization
succeeded within the limits, the state a commit would write encodes and restores, and good
streams (recorded Qwen3 streams, real tokenizer, with and without parsers) interleaved with it
come out exactly as they do alone.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
import os
import random
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from schemas.envelope import DeadLetterRecord, OutputEnvelope
from tests.golden_cases import MODELS_DIR, derenderer_for, load_cases, normalize
from tests.paths import REPO_ROOT
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import DeadLetter, EnvelopeProcessor, ProcessResult
from worker.runtime.composition import load_derenderer
from worker.runtime.dead_letters import record as dead_letter_record
from worker.runtime.dead_letters.replay import decode_dead_letter
from worker.runtime.state.changelog import decode, encode_context, encode_progress
from worker.settings import ModelSettings

STREAMS = REPO_ROOT / "samples" / "streams" / "demo-qwen3.jsonl"
MODEL = "qwen3-demo"
FUZZ = settings(
    max_examples=int(os.environ.get("DERENDER_FUZZ_EXAMPLES", "250")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@functools.cache
def _derenderer(parsers: bool) -> Derenderer:
    settings = ModelSettings(
        tokenizer=str(MODELS_DIR / "qwen3"),
        served_model_names=(MODEL,),
        reasoning_parser="qwen3" if parsers else None,
        tool_parser="hermes" if parsers else None,
        enable_auto_tool_choice=parsers,
    )
    return load_derenderer(settings)


@functools.cache
def _streams() -> dict[str, list[dict[str, Any]]]:
    streams: dict[str, list[dict[str, Any]]] = {}
    for line in STREAMS.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        streams.setdefault(record["request_id"], []).append(record)
    return streams


GOOD = {True: ("demo-tool", "demo-completion"), False: ("demo-plain", "demo-completion")}


def _normalized(results: list[ProcessResult]) -> list[Any]:
    """The payloads, with ``created`` and random tool-call ids normalized."""
    payloads = []
    for result in results:
        assert result.payload is not None
        payloads.append(orjson.loads(result.payload))
    return normalize(payloads)


@functools.cache
def _alone(parsers: bool) -> dict[str, list[Any]]:
    """Each good stream's outputs when it runs alone."""
    processor = EnvelopeProcessor(_derenderer(parsers))
    return {
        rid: _normalized([processor.process(orjson.dumps(r)) for r in _streams()[rid]])
        for rid in GOOD[parsers]
    }


# --- values ----------------------------------------------------------------------------------


class Raw:
    """Bytes spliced into a record's JSON as they are (nesting past what any encoder writes)."""

    def __init__(self, text: bytes) -> None:
        self.text = text


BIG_INTS = st.one_of(
    st.integers(min_value=2**63 - 2, max_value=2**64 + 2),
    st.integers(min_value=-(2**64) - 2, max_value=-(2**63) + 2),
    st.integers(min_value=2**64, max_value=2**200),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=200_000),
    BIG_INTS,
    BIG_INTS.map(str),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "\x00", "\ud800", "token_id:99999999999999999999999", "stop", "length", "chat"]),
)
DEEP = st.integers(min_value=120, max_value=1100).flatmap(
    lambda depth: st.sampled_from(
        [Raw(b"[" * depth + b"]" * depth), Raw(b'{"a":' * depth + b"1" + b"}" * depth), Raw(b"[" * depth)]
    )
)
# Each inner list its own object: ``[[1]] * n`` holds one list n times, and a later replacement
# inside it lands in all n (one DEEP there made a 7 MB record; nested twice, CI's worker reached 19 GB
# writing the record, and the kernel killed it).
HUGE = st.integers(min_value=65, max_value=5000).flatmap(
    lambda n: st.sampled_from([[1] * n, list(range(n)), ["x"] * n, [[1] for _ in range(n)]])
)
JSON = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
VALUES = st.one_of(JSON, JSON, JSON, DEEP, HUGE)

STATE_FIELDS = {
    "prev_tokens": st.one_of(st.lists(st.text(max_size=4), max_size=8), st.just(["a"] * 1025)),
    "prev_token_ids": st.one_of(
        st.lists(st.one_of(st.integers(-3, 160_000), BIG_INTS), max_size=8), st.just([1] * 1025)
    ),
    "prefix_offset": st.one_of(st.integers(-2, 12), BIG_INTS),
    "read_offset": st.one_of(st.integers(-2, 12), BIG_INTS),
    "role_sent": st.booleans(),
    "logprob_context_token_ids": st.lists(st.integers(-5, 160_000), max_size=6),
    "logprob_text_offset": st.one_of(st.integers(-2, 1000), BIG_INTS),
    "output_token_ids": st.lists(st.integers(-5, 160_000), max_size=40),
    "output_chunk_lens": st.lists(st.integers(-1, 8), max_size=10),
    "tools_streamed": st.booleans(),
    "last_tool_call_ids": st.lists(st.text(max_size=8), max_size=4),
}


@st.composite
def consistent_states(draw: st.DrawFn) -> dict[str, Any]:
    """A state that passes validation: random tokens replayed through a decoder and parsers."""
    tokens = draw(
        st.lists(st.sampled_from(["a", "Ġb", "ä", "\ufffd", "<think>", "<tool_call>", "{"]), max_size=6)
    )
    read = draw(st.integers(0, len(tokens)))
    ids = draw(st.lists(st.integers(-3, 152_000), max_size=30))
    cuts = sorted(draw(st.sets(st.integers(1, max(len(ids) - 1, 1)), max_size=5)))
    bounds = [0, *[c for c in cuts if 0 < c < len(ids)], len(ids)]
    # Either window form (vLLM 0.33's strings, 0.34's ids), or both: the same window unless it
    # holds "\ufffd", which is no piece (id 0 stands in: the two disagree, a 400).
    window_ids = [
        {"a": 64, "Ġb": 293, "ä": 160, "<think>": 151667, "<tool_call>": 151657, "{": 90}.get(t, 0)
        for t in tokens
    ]
    forms = draw(st.sampled_from([("prev_tokens",), ("prev_token_ids",), ("prev_tokens", "prev_token_ids")]))
    window: dict[str, Any] = {}
    if "prev_tokens" in forms:
        window["prev_tokens"] = tokens
    if "prev_token_ids" in forms:
        window["prev_token_ids"] = window_ids
    return {
        **window,
        "prefix_offset": draw(st.integers(0, read)),
        "read_offset": read,
        "role_sent": draw(st.booleans()),
        "logprob_context_token_ids": ids[-4:],
        "output_token_ids": ids,
        "output_chunk_lens": [b - a for a, b in itertools.pairwise(bounds) if b > a],
        "tools_streamed": draw(st.booleans()),
        "last_tool_call_ids": draw(st.lists(st.text(max_size=8), max_size=3)),
    }


STATES = st.one_of(st.fixed_dictionaries({}, optional=STATE_FIELDS), consistent_states())


# --- records ---------------------------------------------------------------------------------

CHOICE = ("body", "generate_chunk", "choices", 0)
PATHS: list[tuple[Any, ...]] = [
    ("request_id",),
    ("seq",),
    ("endpoint",),
    ("body",),
    ("body", "stream"),
    ("body", "model"),
    ("body", "generate_chunk"),
    ("body", "generate_chunk", "request_id"),
    ("body", "generate_chunk", "choices"),
    CHOICE,
    (*CHOICE, "index"),
    (*CHOICE, "token_ids"),
    (*CHOICE, "token_ids", 0),
    (*CHOICE, "finish_reason"),
    (*CHOICE, "stop_reason"),
    (*CHOICE, "logprobs"),
    (*CHOICE, "logprobs", "content", 0, "top_logprobs"),
    ("body", "generate_chunk", "usage"),
    ("body", "generate_chunk", "usage", "prompt_tokens"),
    ("body", "generate_chunk", "metrics"),
    ("body", "prompt_token_ids"),
    ("body", "prompt_token_ids", 0),
    ("body", "prompt_tokens"),
    ("body", "chat_request"),
    ("body", "chat_request", "messages"),
    ("body", "chat_request", "tools"),
    ("body", "chat_request", "n"),
    ("body", "chat_request", "stream_options"),
    ("body", "stream_state"),
    ("body", "unknown"),
    ("unknown",),
]
for _name in STATE_FIELDS:
    PATHS.append(("body", "stream_state", _name))


def _template(rng: random.Random) -> dict[str, Any]:
    """A real record of a recorded stream, moved to request ``bad-N`` (never a good stream's id)."""
    streams = _streams()
    record: dict[str, Any] = json.loads(json.dumps(rng.choice(streams[rng.choice(sorted(streams))])))
    rid = f"bad-{rng.randrange(3)}"
    record["request_id"] = rid
    record["body"].setdefault("generate_chunk", {})["request_id"] = rid
    choice = {"index": 0, "token_ids": [9707], "logprobs": {"content": [{"token_id": 9707, "logprob": -0.1}]}}
    record["body"]["generate_chunk"].setdefault("choices", [choice])
    return record


def _put(record: dict[str, Any], path: tuple[Any, ...], value: Any, delete: bool) -> None:
    node: Any = record
    for part in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(part, {} if not isinstance(part, int) else [])
        elif isinstance(node, list) and isinstance(part, int):
            while len(node) <= part:
                node.append({})
            node = node[part]
        else:
            return
    last = path[-1]
    if isinstance(node, dict):
        if delete:
            node.pop(last, None)
        else:
            node[last] = value
    elif isinstance(node, list) and isinstance(last, int):
        while len(node) <= last:
            node.append(None)
        node[last] = value


def _dumps(record: Any) -> bytes:
    """JSON with ``Raw`` parts spliced in; NaN and Infinity stay as Python writes them."""
    raws: list[bytes] = []

    def mark(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value.text)
            return f"\x00raw{len(raws) - 1}\x00"
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(record), ensure_ascii=False).encode("utf-8", errors="surrogatepass")
    for i, raw in enumerate(raws):
        text = text.replace(f'"\\u0000raw{i}\\u0000"'.encode(), raw)
    return text


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    rng = random.Random(draw(st.integers(0, 2**32)))
    record = _template(rng)
    record["seq"] = draw(st.sampled_from([0, 0, 1, 2, 5]))
    mode = draw(st.sampled_from(["mutate", "mutate", "state", "as recorded"]))
    if mode == "state":  # a resume from a state that passes validation: replayed through the parsers
        record["body"]["stream_state"] = draw(consistent_states())
    for _ in range(draw(st.integers(1, 3)) if mode == "mutate" else 0):
        path = draw(st.sampled_from(PATHS))
        value = draw(STATES) if path == ("body", "stream_state") else draw(VALUES)
        _put(record, path, value, delete=draw(st.integers(0, 9)) == 0)
    return _dumps(record)


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    """A valid record with bytes replaced: broken UTF-8, stray quotes and brackets."""
    value = _dumps(_template(random.Random(draw(st.integers(0, 2**32)))))
    at = draw(st.integers(0, len(value)))
    junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\xe4\xb8", b"\xed\xa0\x80", b'"', b"[", b"}", b"\x00"]))
    return value[:at] + junk + value[at + draw(st.integers(0, 3)) :]


RECORDS = st.one_of(
    envelopes(),
    envelopes(),
    envelopes(),
    corrupted(),
    JSON.map(_dumps),
    st.binary(max_size=64),
    DEEP.map(lambda raw: raw.text),
)


# --- the property ----------------------------------------------------------------------------


def _outcome(result: ProcessResult) -> str:
    if result.duplicate:
        return "duplicate"
    if result.dead_letter is not None:
        return "dead letter: " + result.dead_letter.reason.split(":")[0][:40]
    assert result.output is not None
    error = result.output.get("error")
    return f"error {error['code']}" if error else "output"


def _check(result: ProcessResult, processor: EnvelopeProcessor) -> None:
    assert result.internal_error is None, result.dead_letter
    outcomes = [result.duplicate, result.dead_letter is not None, result.output is not None]
    assert sum(outcomes) == 1, result
    if result.duplicate:
        assert result.payload is None
        return
    if result.dead_letter is not None:
        assert result.payload is None
        limit = processor.max_output_bytes
        payload = dead_letter_record.encode(result.dead_letter, None, None, max_bytes=limit)
        key = dead_letter_record.kafka_key(result.dead_letter) or b""
        assert len(payload) + len(key) <= limit
        DeadLetterRecord.model_validate_json(payload)
        return
    assert result.payload is not None
    assert len(result.payload) <= processor.max_output_bytes
    OutputEnvelope.model_validate_json(result.payload)
    assert orjson.dumps(result.output) == result.payload


def _check_state(processor: EnvelopeProcessor) -> None:
    """What a commit would write for every open request encodes, fits and restores."""
    for ctx in processor.requests.values():
        assert ctx.state_bytes() <= processor.max_request_state_bytes
        snapshot, progress = encode_context(ctx, 2**63 - 1), encode_progress(ctx, 2**63 - 1)
        assert len(snapshot) <= ctx.state_bytes() and len(progress) <= ctx.state_bytes()
        restored = decode(processor.derenderer, snapshot, progress).ctx
        # A restore writes every window in the worker's own form (a caller's form comes back with
        # the caller's next record): compare with the states as written in that form.
        forms = {i: s.form for i, s in ctx.sequences.items()}
        try:
            for state in ctx.sequences.values():
                state.form = processor.derenderer.options.behaviour.state_form
            assert encode_context(restored) == encode_context(ctx)
        finally:
            for i, form in forms.items():
                ctx.sequences[i].form = form


@FUZZ
@given(
    bad=st.lists(RECORDS, min_size=1, max_size=4),
    parsers=st.booleans(),
    keyed=st.sampled_from([False, False, False, True]),
    small_limits=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_any_record_gets_one_outcome_and_good_streams_are_unchanged(
    bad: list[bytes], parsers: bool, keyed: bool, small_limits: bool, seed: int
) -> None:
    limits: dict[str, Any] = (
        {"max_output_bytes": 64 * 1024, "max_request_state_bytes": 16 * 1024} if small_limits else {}
    )
    processor = EnvelopeProcessor(_derenderer(parsers), require_key=keyed, **limits)
    good = [r for rid in GOOD[parsers] for r in _streams()[rid]]
    rng = random.Random(seed)
    # Good streams in order, bad records anywhere between them.
    queue: list[tuple[bool, bytes, bytes | None]] = [
        (True, orjson.dumps(r), r["request_id"].encode()) for r in good
    ]
    for value in bad:
        queue.insert(rng.randrange(len(queue) + 1), (False, value, _key_of(value) if keyed else None))
    got: dict[str, list[ProcessResult]] = {rid: [] for rid in GOOD[parsers]}
    for is_good, value, key in queue:
        result = processor.process(value, key)
        _check(result, processor)
        _check_state(processor)
        if not is_good:
            event(_outcome(result))
        if is_good:
            assert result.request_id is not None
            got[result.request_id].append(result)
    assert {rid: _normalized(results) for rid, results in got.items()} == _alone(parsers)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``value`` (lists: their first 40 items), the containers' own included."""
    found = [path] if path else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:40]):
            found += _leaves(item, (*path, index))
    return found


_TOOL_CASES = [
    case
    for case in load_cases()
    if any("tools" in (record["body"].get("chat_request") or {}) for record in case.input)
]


@FUZZ
@given(case_index=st.integers(0, 10**6), data=st.data())
def test_every_golden_case_with_any_part_replaced_gets_one_outcome_per_record(
    case_index: int, data: st.DataObject
) -> None:
    """Every family's real records (tools, tool_choice, logprobs, usage, one-shot bodies), each
    with values anywhere replaced: each record still gets one outcome, never an internal error."""
    # Half the time inside the OpenAI request of a case that has tools: their checks walk raw
    # input before any field is validated (few cases have a named tool_choice).
    in_request = data.draw(st.booleans())
    cases = _TOOL_CASES if in_request else load_cases()
    case = cases[case_index % len(cases)]
    records: list[dict[str, Any]] = json.loads(json.dumps(case.input))
    for _ in range(data.draw(st.integers(1, 3))):
        record = records[data.draw(st.integers(0, len(records) - 1))]
        paths = _leaves(record)
        if in_request and "chat_request" in record["body"]:
            paths = [p for p in paths if p[:2] == ("body", "chat_request") and len(p) > 2]
        path = data.draw(st.sampled_from(paths))
        _put(record, path, data.draw(VALUES), delete=data.draw(st.integers(0, 9)) == 0)
    processor = EnvelopeProcessor(derenderer_for(case.config))
    for record in records:
        result = processor.process(_dumps(record))
        _check(result, processor)
        _check_state(processor)
        event(_outcome(result))


def _key_of(value: bytes) -> bytes | None:
    """The key a producer would give: the request_id, when there is one."""
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        return None
    rid = data.get("request_id") if isinstance(data, dict) else None
    return rid.encode("utf-8", errors="surrogatepass") if isinstance(rid, str) else None


@settings(max_examples=300, deadline=None)
@given(
    value=st.one_of(
        st.binary(max_size=3000),
        st.text(max_size=1000).map(lambda t: t.encode("utf-8", errors="surrogatepass")),
        st.integers(0, 3000).map(lambda n: b"\x00" * n),
    ),
    key=st.one_of(st.none(), st.binary(max_size=6000)),
    headers=st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=3000)), max_size=12),
    reason=st.text(max_size=5000),
    limit=st.integers(100, 20_000),
)
def test_a_dead_letter_fits_its_limit_whenever_its_fixed_part_does(
    value: bytes, key: bytes | None, headers: list[tuple[str, bytes]], reason: str, limit: int
) -> None:
    letter = DeadLetter(reason, value, key)
    source = {"topic": "in", "partition": 0, "offset": 1}
    payload = dead_letter_record.encode(letter, headers, source, max_bytes=limit)
    record = DeadLetterRecord.model_validate_json(payload)
    kafka_key = len(dead_letter_record.kafka_key(letter) or b"")
    # Everything but the original: its size and hash describe the whole value (a longer size has
    # more digits), so measure the same letter with no room for the original at all.
    fixed = len(dead_letter_record.encode(letter, headers, source, max_bytes=0)) + kafka_key
    if limit >= fixed:
        assert len(payload) + kafka_key <= limit
    original = (
        base64.b64decode(record.original)
        if record.original_encoding == "base64"
        else record.original.encode()
    )
    assert value.startswith(original) and (record.truncated or original == value)
    assert (record.original_size, record.original_sha256) == (len(value), hashlib.sha256(value).hexdigest())
    if not record.truncated:
        # ``dlq replay`` re-sends the exact header bytes, UTF-8 or not.
        assert decode_dead_letter(payload, dead_letter_record.kafka_key(letter)).headers == headers
