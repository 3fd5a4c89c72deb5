"""Memory caps that bound memory: the live-bytes estimate against measured allocations, the
worker-wide parser pool and its fairness, and the budget never passing its cap under a flood."""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition

from tests.golden_cases import MODELS_DIR
from tests.partition_fakes import TOPICS, FakeRecord, RecordingSink, changelog_for
from worker.core.envelope_processor import EnvelopeProcessor, Refusal
from worker.core.live_parsers import LIVE_PARSER_BYTES, LiveParserPool
from worker.core.sequence_state import SequenceState
from worker.runtime.composition import load_derenderer
from worker.runtime.memory import MemoryBudget
from worker.runtime.observability.metrics import Metrics
from worker.runtime.partition import OwnedPartition
from worker.settings import ModelSettings

# The estimate must stay within this factor of what the requests really allocate.
FACTOR = 2.0


def _processor(
    parsers: bool, pool: LiveParserPool | None = None, budget: MemoryBudget | None = None
) -> EnvelopeProcessor:
    settings = ModelSettings(
        tokenizer=str(MODELS_DIR / "qwen3"),
        served_model_names=("test-model",),
        reasoning_parser="qwen3" if parsers else None,
        tool_parser="hermes" if parsers else None,
        enable_auto_tool_choice=parsers,
    )
    derenderer = load_derenderer(settings)
    pool = pool if pool is not None else LiveParserPool(10_000)
    return EnvelopeProcessor(derenderer, live_parsers=pool, admission=budget)


# A message's extra structure (vLLM's messages take any extra field): a request small encoded
# and large held.
STRUCTURES: dict[str, Any] = {
    "none": None,
    "empty lists": lambda: [[] for _ in range(20_000)],
    "small objects": lambda: [{"a": i} for i in range(5_000)],
    "numbers": lambda: list(range(10_000, 30_000)),
}


def _stream(
    rid: str, *, prompt: int, content: int, records: int, tokens: int, seed: int, structure: str = "none"
) -> list[bytes]:
    """One open chat stream (never finished): ``records`` records of ``tokens`` output ids each."""
    rng = random.Random(seed)
    out = []
    for seq in range(records):
        body: dict[str, Any] = {
            "stream": True,
            "generate_chunk": {
                "request_id": rid,
                "choices": [{"index": 0, "token_ids": [rng.randrange(300, 150_000) for _ in range(tokens)]}],
            },
        }
        if seq == 0:
            body["prompt_token_ids"] = [rng.randrange(300, 150_000) for _ in range(prompt)]
            body["prompt_tokens"] = prompt
            message: dict[str, Any] = {"role": "user", "content": "ab c" * (content // 4)}
            if STRUCTURES[structure] is not None:
                message["extra"] = STRUCTURES[structure]()
            body["chat_request"] = {"model": "test-model", "messages": [message]}
        out.append(orjson.dumps({"request_id": rid, "seq": seq, "endpoint": "chat", "body": body}))
    return out


def _estimate(processor: EnvelopeProcessor) -> int:
    requests = sum(ctx.live_bytes() for ctx in processor.requests.values())
    return requests + LIVE_PARSER_BYTES * len(processor.parsers) + processor.closed_live_bytes()


SHAPES: dict[str, dict[str, Any]] = {
    "long prompts": {"parsers": False, "prompt": 4000, "content": 10, "records": 3, "tokens": 3},
    "long messages": {"parsers": False, "prompt": 20, "content": 40_000, "records": 3, "tokens": 3},
    "parsers, long outputs": {"parsers": True, "prompt": 50, "content": 100, "records": 40, "tokens": 8},
    "parsers, short": {"parsers": True, "prompt": 20, "content": 20, "records": 2, "tokens": 2},
    "many output ids per record": {
        "parsers": False,
        "prompt": 20,
        "content": 20,
        "records": 2,
        "tokens": 300,
    },
    **{
        f"request of {structure}": {
            "parsers": False,
            "prompt": 20,
            "content": 20,
            "records": 2,
            "tokens": 2,
            "structure": structure,
        }
        for structure in STRUCTURES
        if structure != "none"
    },
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_live_estimate_tracks_measured_allocations(shape: str) -> None:
    params = dict(SHAPES[shape])
    processor = _processor(bool(params.pop("parsers")))
    count = 60 if "structure" not in params else 10
    streams = [_stream(f"mem-{i}", seed=i, **params) for i in range(count)]
    # A first pass fills the worker-wide caches (vocabulary pieces, bounded; regexes) outside the
    # count; the measured pass runs the same records as fresh requests.
    for i, records in enumerate(streams):
        for value in records:
            processor.process(value, f"mem-{i}".encode())
    processor.requests.clear()
    processor.parsers.drop_owner(processor)
    getattr(processor, "_closed").clear()  # noqa: B009 (the core keeps it private)
    setattr(processor, "_closed_bytes", 0)  # noqa: B010 (and the bytes counted for it)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, records in enumerate(streams):
            for value in records:
                result = processor.process(value, f"mem-{i}".encode())
                assert result.output is not None and "error" not in result.output, result.output
        del result
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    estimate = _estimate(processor)
    assert len(processor.requests) == count
    ratio = measured / estimate
    assert 1 / FACTOR <= ratio <= FACTOR, f"{shape}: measured {measured}, estimated {estimate} ({ratio:.2f}x)"


@pytest.mark.parametrize(
    "request_id",
    [lambda i: f"closed-request-{i:06d}", lambda i: f"{i:06d}" + "\U0001f680" * 500],
    ids=["short ASCII ids", "ids of 500 emoji"],
)
def test_closed_request_memory_is_counted(request_id: Any) -> None:
    processor = _processor(False)
    tiny = [
        orjson.dumps({**orjson.loads(v), "seq": 0})
        for v in _stream("x", prompt=2, content=4, records=1, tokens=1, seed=0)
    ]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(3000):
            envelope = orjson.loads(tiny[0])
            envelope["request_id"] = request_id(i)
            envelope["body"]["generate_chunk"]["choices"][0]["finish_reason"] = "stop"
            processor.process(orjson.dumps(envelope), envelope["request_id"].encode())
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert processor.requests == {}
    estimate = processor.closed_live_bytes()
    assert 1 / FACTOR <= measured / estimate <= FACTOR, (measured, estimate)


# --- the worker-wide parser pool ----------------------------------------------------------------


class _Live:
    """A stand-in for ``SequenceState`` with a live session (the pool only reads and clears ``live``)."""

    def __init__(self) -> None:
        self.live: Any = object()


def test_the_pool_is_shared_and_capped_across_processors() -> None:
    pool = LiveParserPool(4)
    a, b = object(), object()
    states = {}
    for owner, rid in [(a, "r1"), (a, "r2"), (b, "r3"), (b, "r4")]:
        states[rid] = _Live()
        pool.touch(owner, rid, 0, states[rid])
    assert len(pool) == 4 and pool.count(a) == 2 and pool.count(b) == 2
    pool.touch(a, "r1", 0, states["r1"])  # recently used
    states["r5"] = _Live()
    pool.touch(b, "r5", 0, states["r5"])  # over the worker-wide cap: the least recent goes
    assert len(pool) == 4 and pool.evictions == 1 and states["r2"].live is None
    pool.drop_owner(b)  # b's partition was revoked
    assert len(pool) == 1 and pool.count(b) == 0
    assert states["r3"].live is None and states["r1"].live is not None
    pool.drop_request(a, "r1")
    assert len(pool) == 0


def test_one_request_cannot_evict_every_other_requests_parser() -> None:
    pool = LiveParserPool(10)
    owner = object()
    others = [_Live() for _ in range(5)]
    for i, state in enumerate(others):
        pool.touch(owner, f"other-{i}", 0, state)
    greedy = [_Live() for _ in range(2000)]  # a request with 2,000 choice indices
    for index, state in enumerate(greedy):
        pool.touch(owner, "greedy", index, state)
    assert all(state.live is not None for state in others)
    assert len(pool) == 10 and sum(s.live is not None for s in greedy) == 5
    # The others still evict least-recently-used sessions normally.
    newcomer = _Live()
    pool.touch(owner, "newcomer", 0, newcomer)
    assert newcomer.live is not None and len(pool) == 10


def test_eviction_reaches_the_session_in_use_when_each_record_brings_a_new_state() -> None:
    # A record carrying stream_state makes a new SequenceState for the same sequence each time.
    pool = LiveParserPool(1)
    owner = object()
    first, second = _Live(), _Live()
    pool.touch(owner, "r", 0, first)
    pool.touch(owner, "r", 0, second)
    pool.touch(owner, "other", 0, _Live())  # evicts r's session: the one in use now
    assert second.live is None and len(pool) == 1


def test_a_cap_of_zero_keeps_no_session() -> None:
    pool = LiveParserPool(0)
    state = _Live()
    pool.touch(object(), "r", 0, state)
    assert state.live is None and len(pool) == 0 and pool.evictions == 1
    real = SequenceState()  # no session: nothing to keep
    pool.touch(object(), "r", 1, real)
    assert len(pool) == 0


# --- the budget under a flood -------------------------------------------------------------------


def test_the_budget_never_passes_its_cap_under_a_flood() -> None:
    """Four partitions, one budget and one pool; new requests of large prompts until refused: the
    accounted bytes never pass the cap, and the refused ones get a 503 error output."""
    cap = 3 * 1024 * 1024
    budget = MemoryBudget(max_open_requests=0, max_state_bytes=cap)
    pool = LiveParserPool(50)
    tasks = []
    sinks = [RecordingSink() for _ in range(4)]
    for p, sink in enumerate(sinks):
        processor = _processor(True, pool, budget)  # the budget refuses new requests
        tasks.append(
            OwnedPartition(
                TopicPartition("in", p),
                processor,
                sink,
                TOPICS,
                Metrics(),
                position=0,
                changelog=changelog_for(TopicPartition("in", p)),
                budget=budget,
            )
        )
    peak = 0

    async def body() -> None:
        nonlocal peak
        offset = 0
        for i in range(400):
            task = tasks[i % 4]
            for value in _stream(f"flood-{i}", prompt=3000, content=2000, records=3, tokens=4, seed=i):
                await task.handle(FakeRecord(offset, orjson.loads(value)))
                offset += 1
                peak = max(peak, budget.state_bytes)
                assert budget.state_bytes <= cap
                assert len(pool) <= 50

    asyncio.run(body())
    outputs = [orjson.loads(r.value) for sink in sinks for r in sink.sent if r.value]
    refused = [o for o in outputs if o.get("error", {}).get("code") == 503]
    assert refused and peak > cap * 0.8, (len(refused), peak)
    live = sum(sum(t.sizes.values()) for t in tasks) + sum(t.processor.closed_live_bytes() for t in tasks)
    assert live == budget.state_bytes


def test_admission_at_a_cap_follows_the_processors_rules() -> None:
    """At a cap only a record that would really open a request is refused (503): a duplicate of a
    finished request is skipped and a badly placed record dead-lettered, exactly as without a cap."""
    processor = _processor(False)
    processor.require_key = True
    done: list[dict[str, Any]] = [
        {
            "request_id": "done",
            "seq": 0,
            "endpoint": "chat",
            "body": {
                "stream": True,
                "model": "test-model",
                "prompt_token_ids": [9707],
                "generate_chunk": {
                    "request_id": "done",
                    "choices": [{"index": 0, "token_ids": [9707], "finish_reason": "stop"}],
                },
            },
        }
    ]
    assert processor.process(orjson.dumps(done[0]), b"done").closed
    fresh = {**done[0], "request_id": "fresh"}
    fresh["body"] = {
        **done[0]["body"],
        "generate_chunk": {**done[0]["body"]["generate_chunk"], "request_id": "f"},
    }
    controls = {**fresh, "request_id": "bad\x07id"}

    class Full:
        """A budget at its cap, counting what it was asked."""

        asked = 0

        def refusal(self, record_bytes: int) -> Refusal | None:
            self.asked += 1
            return Refusal("open_requests", "full")

    full = Full()
    processor.admission = full
    assert processor.process(orjson.dumps(done[0]), b"done").duplicate
    assert processor.process(orjson.dumps(controls), b"bad\x07id").dead_letter is not None
    assert processor.process(orjson.dumps(fresh), None).dead_letter is not None  # key-less
    assert full.asked == 0
    refused = processor.process(orjson.dumps(fresh), b"fresh")
    assert full.asked == 1 and refused.refused == "open_requests" and not processor.is_open("fresh")
    assert refused.output is not None and refused.output["error"]["code"] == 503
