"""Every request ends, promptly, whatever the client asks or the upstream does (real broker).

Client -> gateway -> Kafka -> ingest (``--max-inflight`` 3) -> fake vLLM -> worker, with the real
``openai`` SDK where a client is involved and the output topic read directly where the records are
what is checked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from openai import OpenAI

from tests.kafka_broker import TopicFactory, run_sync
from tests.kafka_helpers import TopicReader
from tests.pipeline_helpers import (
    ONE_SHOT_CASE,
    STREAM_CASE,
    Pipeline,
    case,
    comparable,
    new_id,
    recording,
    request_of,
    three_prompt_recording,
)

pytestmark = pytest.mark.kafka
MAX_INFLIGHT = 3


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str) -> Iterator[Pipeline]:
    factory = TopicFactory(kafka_bootstrap)
    pipeline = Pipeline(kafka_bootstrap, factory, max_inflight=MAX_INFLIGHT).start(workers=1)
    # The gateway's own cap would refuse the oversized one-shot first (a 400, its own tests); these
    # tests are about what ingest does with what gets past it.
    pipeline.start_gateway("--max-logprob-tokens", str(10**9))
    with pipeline.serving() as ready:
        yield ready


def client(pipeline: Pipeline) -> OpenAI:
    return OpenAI(base_url=f"{pipeline.gateway_url}/v1", api_key="unused", max_retries=0, timeout=90)


def read_stream(stream: Iterator[Any], on_chunk: Any = None) -> tuple[list[Any], openai.APIError | None]:
    """The chunks a streaming client got, and the error that ended its stream (None: it finished)."""
    seen: list[Any] = []
    try:
        for chunk in stream:
            seen.append(chunk)
            if on_chunk is not None:
                on_chunk(len(seen))
    except openai.APIError as exc:
        return seen, exc
    return seen, None


def envelope(request_id: str, endpoint: str, request: dict[str, Any]) -> dict[str, Any]:
    return {"request_id": request_id, "endpoint": endpoint, "request": request}


def test_a_one_shot_too_large_for_a_record_is_a_413_for_the_client(pipeline: Pipeline) -> None:
    body = request_of(
        recording(ONE_SHOT_CASE), user="fault:bulk", max_tokens=20_000, logprobs=True, top_logprobs=20
    )
    with pytest.raises(openai.APIStatusError) as raised:
        client(pipeline).chat.completions.create(**body)
    assert raised.value.status_code == 413
    assert all(p.alive for p in pipeline.ingests), pipeline.logs()
    again = client(pipeline).chat.completions.create(**request_of(recording(ONE_SHOT_CASE)))
    assert again.choices[0].finish_reason is not None


def test_a_stream_that_never_finishes_ends_with_an_error_at_once(pipeline: Pipeline) -> None:
    """[DONE] with no finish_reason: the client waited for the gateway's whole request timeout."""
    body = request_of(recording(STREAM_CASE), user="fault:no-finish")
    started = time.monotonic()
    chunks, error = read_stream(iter(client(pipeline).chat.completions.create(**body)))
    assert error is not None and "unfinished" in str(error), error
    assert time.monotonic() - started < 20, "the error came only with the gateway's timeout"
    assert chunks


def test_one_failing_prompt_of_three_ends_the_others_and_reuses_no_seq(pipeline: Pipeline) -> None:
    three = three_prompt_recording()
    rid = new_id("three")
    ids = [f"{rid}-{i}" for i in range(3)]
    request = request_of(three, user="fault:second-prompt-fails")

    async def go() -> tuple[dict[str, list[dict[str, Any]]], list[Any]]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        inputs = await TopicReader(pipeline.bootstrap, pipeline.topics.input).start()
        try:
            await pipeline.send([envelope(rid, "completion", request)])
            got = await pipeline.outputs(reader, ids, timeout=60)
            deadline = time.monotonic() + 30
            while sum(1 for r in inputs.records if r.key.decode() in ids and b'"close"' in r.value) < 3:
                assert time.monotonic() < deadline, "no close record for every stream on the input topic"
                await asyncio.sleep(0.1)
            return got, list(inputs.records)
        finally:
            await reader.stop()
            await inputs.stop()

    got, inputs = run_sync(go())
    for sid in ids:  # the worker frees each stream's state at once: the close comes after its envelopes
        mine = [orjson.loads(r.value) for r in inputs if r.key.decode() == sid]
        assert mine[-1] == {"request_id": sid, "close": True}, mine[-1]
    failed = [o for o in got[f"{rid}-1"] if o.get("error") is not None]
    assert [e["error"]["code"] for e in failed] == [500]
    for sid in (f"{rid}-0", f"{rid}-2"):  # the siblings were cancelled and aborted upstream
        assert f"generate-tokens-cmpl-{rid}-{sid[-1]}" in pipeline.fake.aborted, pipeline.fake.aborted
    for sid, outputs in got.items():
        seqs = [o["seq"] for o in outputs]
        assert len(seqs) == len(set(seqs)), f"{sid}: a seq used twice: {sorted(seqs)}"
        errors = [o for o in outputs if o.get("error") is not None]
        assert len(errors) == 1 and errors[0]["terminal"] is True, outputs
        assert errors[0]["seq"] == max(seqs), f"{sid}: the error is not the stream's last seq"


def test_a_cancel_behind_a_full_max_inflight_is_read_at_once(pipeline: Pipeline) -> None:
    """Every generate slot held by a stalled stream: a queued request's cancel still ends it."""
    stalled = [envelope(new_id("hold"), "chat", request_of(recording(STREAM_CASE), user="fault:stall"))]
    stalled += [envelope(new_id("hold"), "chat", request_of(recording(STREAM_CASE), user="fault:stall"))]
    stalled += [envelope(new_id("hold"), "chat", request_of(recording(STREAM_CASE), user="fault:stall"))]
    queued = envelope(new_id("queued"), "chat", recording(STREAM_CASE).request)

    async def go() -> tuple[float, dict[str, list[dict[str, Any]]]]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        try:
            await pipeline.send(stalled)
            holders = [r["request_id"] for r in stalled]
            await pipeline.wait_for_count(reader, holders, 2 * MAX_INFLIGHT)  # every slot is taken
            await pipeline.send([queued, {"request_id": queued["request_id"], "cancel": True}])
            started = time.monotonic()
            ended = await pipeline.outputs(reader, [queued["request_id"]], timeout=30)
            took = time.monotonic() - started
            await pipeline.send([{"request_id": rid, "cancel": True} for rid in holders])
            await pipeline.outputs(reader, holders, timeout=30)
            return took, ended
        finally:
            await reader.stop()

    took, ended = run_sync(go())
    outputs = ended[queued["request_id"]]
    assert [o["error"]["code"] for o in outputs if o.get("error")] == [499], outputs
    assert took < 15


def test_sigkill_of_ingest_mid_stream_ends_the_client_stream_within_a_minute(pipeline: Pipeline) -> None:
    # A chunk every 2 s: the kill lands mid-generation, however late the client reads.
    body = request_of(recording(STREAM_CASE), user="fault:crawl")
    want = comparable(case(STREAM_CASE).expected)
    killed_at: list[float] = []

    def kill_ingest_after_two(count: int) -> None:
        if count == 2:
            next(p for p in pipeline.ingests if p.alive).kill()
            killed_at.append(time.monotonic())
            pipeline.start_ingest()

    seen, error = read_stream(iter(client(pipeline).chat.completions.create(**body)), kill_ingest_after_two)
    assert error is not None and "cut off" in str(error), (error, pipeline.logs())
    assert 2 <= len(seen) < len(want)  # a chunk committed before the kill may still follow
    assert time.monotonic() - killed_at[0] < 60


def test_a_request_past_its_deadline_ends_with_a_504_without_reaching_vllm(pipeline: Pipeline) -> None:
    rid = new_id("late")
    late = {
        **envelope(rid, "chat", recording(STREAM_CASE).request),
        "deadline_ms": int(time.time() * 1000) - 1,
    }

    async def go() -> list[dict[str, Any]]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        try:
            await pipeline.send([late])
            return (await pipeline.outputs(reader, [rid], timeout=30))[rid]
        finally:
            await reader.stop()

    got = run_sync(go())
    assert [(o["seq"], o["error"]["code"], o["terminal"]) for o in got] == [(0, 504, True)]
    assert pipeline.fake.generations_of.get(f"chatcmpl-{rid}") is None  # never generated


def test_max_inflight_counts_streams_not_requests(pipeline: Pipeline) -> None:
    """One stalled stream and a completion with three prompts: at most --max-inflight (3) streams open
    (counting requests, 2 of 3, let four streams open); the completion still ends whole."""
    stall = envelope(new_id("stall"), "chat", request_of(recording(STREAM_CASE), user="fault:stall"))
    rid = new_id("three")
    three = envelope(rid, "completion", request_of(three_prompt_recording()))
    ids = [f"{rid}-{i}" for i in range(3)]

    async def go() -> dict[str, list[dict[str, Any]]]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        try:
            await pipeline.send([stall])
            await pipeline.wait_for_count(reader, [stall["request_id"]], 2)
            pipeline.fake.max_streams_open = pipeline.fake.streams_open
            await pipeline.send([three])
            got = await pipeline.outputs(reader, ids, timeout=60)
            await pipeline.send([{"request_id": stall["request_id"], "cancel": True}])
            await pipeline.outputs(reader, [stall["request_id"]], timeout=30)
            return got
        finally:
            await reader.stop()

    got = run_sync(go())
    assert pipeline.fake.max_streams_open <= MAX_INFLIGHT
    for sid in ids:
        assert not [o for o in got[sid] if o.get("error")], got[sid]
