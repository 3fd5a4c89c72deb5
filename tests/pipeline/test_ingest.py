"""``ingest`` on the real broker: requests topic -> fake vLLM -> worker -> output topic (Kafka only)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_vllm import Recording
from tests.kafka_broker import TopicFactory, run_sync
from tests.kafka_helpers import TopicReader
from tests.pipeline_helpers import (
    COMPLETION_CASE,
    N2_CASE,
    ONE_SHOT_CASE,
    STREAM_CASE,
    Pipeline,
    assemble,
    case,
    cli,
    comparable,
    new_id,
    recording,
    reference_outputs,
    request_of,
    two_prompt_recording,
)

pytestmark = pytest.mark.kafka


# Every test with either client library under ingest's group member and transactions.
@pytest.fixture(scope="module", params=["confluent", "aiokafka"])
def pipeline(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    factory = TopicFactory(kafka_bootstrap)
    pipeline = Pipeline(kafka_bootstrap, factory, ingest_client=request.param).start(workers=1)
    try:
        yield pipeline
    finally:
        pipeline.stop()
        factory.cleanup()


def envelope(request_id: str, endpoint: str, request: dict[str, Any]) -> dict[str, Any]:
    return {"request_id": request_id, "endpoint": endpoint, "request": request}


async def _read(pipeline: Pipeline, records: list[dict[str, Any]], timeout: float = 60.0) -> dict[str, Any]:
    reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
    try:
        await pipeline.send(records)
        return await pipeline.outputs(reader, [r["request_id"] for r in records], timeout)
    finally:
        await reader.stop()


def test_stream_one_shot_and_completion_match_the_golden_outputs(pipeline: Pipeline) -> None:
    stream, one_shot, completion = case(STREAM_CASE), case(ONE_SHOT_CASE), case(COMPLETION_CASE)
    ids = {name: new_id(name) for name in ("stream", "one-shot", "completion")}
    records = [
        envelope(ids["stream"], "chat", recording(stream.id).request),
        envelope(ids["one-shot"], "chat", recording(one_shot.id).request),
        envelope(ids["completion"], "completion", recording(completion.id).request),
    ]
    got = run_sync(_read(pipeline, records))
    # Every chunk field for field as vLLM's own derender (ids aside: ingest names the generation).
    assert comparable(got[ids["stream"]]) == comparable(stream.expected)
    assert comparable(got[ids["one-shot"]]) == comparable(one_shot.expected)
    assert comparable(got[ids["completion"]]) == comparable(completion.expected)
    first = got[ids["stream"]][0]["body"]["chunk"]
    assert first["id"] == f"generate-tokens-chatcmpl-{ids['stream']}"  # render got X-Request-Id
    tool = assemble(got[ids["stream"]]).choices[0]
    assert tool.reasoning and tool.tool_calls[0]["function"]["name"] == "get_weather"


def test_n2_and_two_prompt_completions(pipeline: Pipeline) -> None:
    n2 = recording(N2_CASE)
    two = two_prompt_recording()
    n2_id, two_id = new_id("n2"), new_id("two")
    records = [envelope(n2_id, "chat", request_of(n2)), envelope(two_id, "completion", request_of(two))]
    reader_ids = [n2_id, f"{two_id}-0", f"{two_id}-1"]

    async def go() -> dict[str, Any]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        try:
            await pipeline.send(records)
            return await pipeline.outputs(reader, reader_ids)
        finally:
            await reader.stop()

    got = run_sync(go())
    want_n2 = reference_outputs(n2, request_of(n2))
    await_count = len(want_n2)
    assert comparable(got[n2_id][:await_count]) == comparable(want_n2)
    assert sorted(assemble(got[n2_id]).choices) == [0, 1]
    for i in (0, 1):  # each prompt streams under its own id, as vLLM's render names them
        assert comparable(got[f"{two_id}-{i}"]) == comparable(reference_outputs(two, request_of(two), i))


@pytest.mark.parametrize(
    ("fault", "code", "records_before"),
    [
        ("render-400", 400, 0),
        ("generate-500", 500, 0),
        ("generate-503", 503, 0),
        ("error-event", 500, 3),
        ("cut", 502, 4),
    ],
)
def test_vllm_errors_end_the_request_with_an_error_record(
    pipeline: Pipeline, fault: str, code: int, records_before: int
) -> None:
    stream = recording(STREAM_CASE)
    rid = new_id(fault)
    got = run_sync(_read(pipeline, [envelope(rid, "chat", request_of(stream, user=f"fault:{fault}"))]))[rid]
    errors = [o for o in got if o.get("error") is not None]
    assert [e["error"]["code"] for e in errors] == [code], errors
    # The chunks before the failure were derendered as usual; the error record's seq says how many.
    assert errors[0]["seq"] == records_before
    chunks = sorted((o for o in got if o.get("error") is None), key=lambda o: o["seq"])
    assert comparable(chunks) == comparable(case(STREAM_CASE).expected[:records_before])


def test_cancel_aborts_the_generation_upstream(pipeline: Pipeline) -> None:
    stream = recording(STREAM_CASE)
    rid = new_id("cancel")

    async def go() -> list[dict[str, Any]]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        try:
            await pipeline.send([envelope(rid, "chat", request_of(stream, user="fault:stall"))])
            await reader.wait_for(2, 30, "the first chunks", pipeline.logs)
            await pipeline.send([{"request_id": rid, "cancel": True}])
            return (await pipeline.outputs(reader, [rid]))[rid]
        finally:
            await reader.stop()

    got = run_sync(go())
    assert f"generate-tokens-chatcmpl-{rid}" in pipeline.fake.aborted
    # vLLM ends an aborted stream with finish_reason "abort"; the worker closes the request with it.
    assert got[-1]["body"]["chunk"]["choices"][0]["finish_reason"] == "abort"
    assert [o["seq"] for o in got] == list(range(len(got)))


def test_backpressure_holds_generations_at_max_inflight(pipeline: Pipeline) -> None:
    stream = recording(STREAM_CASE)
    records = [envelope(new_id("load"), "chat", request_of(stream, user="fault:slow")) for _ in range(10)]
    pipeline.fake.max_streams_open = 0
    got = run_sync(_read(pipeline, records, timeout=90))
    # The requests partitions paused at --max-inflight (4) and resumed: never more, and all of them ran.
    assert pipeline.fake.max_streams_open == pipeline.max_inflight
    for outputs in got.values():
        assert comparable(outputs) == comparable(case(STREAM_CASE).expected)


def test_sigkill_of_ingest_mid_stream_never_mixes_generations(pipeline: Pipeline) -> None:
    stream = recording(STREAM_CASE)
    retry = Recording(
        "retry",
        "chat",
        stream.request,
        stream.prompt_token_ids,
        recording(COMPLETION_CASE).chunks,
    )
    pipeline.fake.retry_chunks = retry.chunks[0]  # a second generation of a request looks different
    records = [envelope(new_id("kill"), "chat", request_of(stream, user="fault:slower")) for _ in range(8)]
    ids = [r["request_id"] for r in records]
    first = comparable(case(STREAM_CASE).expected)
    second = comparable(reference_outputs(retry, request_of(stream, user="fault:slower")))

    async def go() -> tuple[dict[str, list[dict[str, Any]]], set[str]]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        inputs = await TopicReader(pipeline.bootstrap, pipeline.topics.input).start()
        try:
            await pipeline.send(records)
            await pipeline.wait_for_count(reader, ids, 12)
            victim = next(p for p in pipeline.ingests if p.alive)
            victim.kill()
            pipeline.start_ingest()
            got = await pipeline.outputs(reader, ids, timeout=90)
            await asyncio.sleep(2)  # the closes commit with the errors; the reader may lag a little
            closed = {
                r.key.decode()
                for r in inputs.records
                if r.value == b'{"request_id":"' + r.key + b'","close":true}'
            }
            return got, closed
        finally:
            await reader.stop()
            await inputs.stop()

    try:
        got, closed = run_sync(go())
    finally:
        pipeline.fake.retry_chunks = None
    outcomes = {"complete": 0, "cut off": 0, "regenerated": 0}
    for rid, outputs in got.items():
        chunks = sorted((o for o in outputs if o.get("error") is None), key=lambda o: o["seq"])
        errors = [o["error"] for o in outputs if o.get("error") is not None]
        assert len({o["seq"] for o in chunks}) == len(chunks), f"{rid}: a seq twice"
        if errors:  # cut off: a prefix of the one generation shown, then the error saying so
            assert [e["code"] for e in errors] == [503] and "cut off" in errors[0]["message"]
            assert comparable(chunks) == first[: len(chunks)], f"{rid}: not a prefix of one generation"
            assert rid in closed, f"{rid}: cut off, but its worker state was not closed"
            outcomes["cut off"] += 1
        elif comparable(chunks) == first:
            outcomes["complete"] += 1
        else:  # nothing of the first attempt became visible, so the second is shown whole
            assert comparable(chunks) == second, f"{rid}: tokens of two generations mixed"
            outcomes["regenerated"] += 1
    assert outcomes["complete"] >= 1 and outcomes["cut off"] >= 1, outcomes


def test_sigterm_of_ingest_hands_unfinished_requests_on(pipeline: Pipeline) -> None:
    stream = recording(STREAM_CASE)
    for process in pipeline.ingests:
        if process.alive:
            process.kill()
    quick = pipeline.start_ingest("--shutdown-timeout-s", "1")
    records = [envelope(new_id("term"), "chat", request_of(stream, user="fault:slower")) for _ in range(4)]
    ids = [r["request_id"] for r in records]
    first = comparable(case(STREAM_CASE).expected)

    async def go() -> dict[str, list[dict[str, Any]]]:
        reader = await TopicReader(pipeline.bootstrap, pipeline.topics.output).start()
        try:
            await pipeline.send(records)
            await pipeline.wait_for_count(reader, ids, 8)
            assert quick.terminate() == 0  # running generations are cut after 1 s, then it commits
            pipeline.start_ingest()
            return await pipeline.outputs(reader, ids, timeout=90)
        finally:
            await reader.stop()

    got = run_sync(go())
    for rid, outputs in got.items():  # every request ends: whole, or a prefix and the cut-off error
        chunks = sorted((o for o in outputs if o.get("error") is None), key=lambda o: o["seq"])
        errors = [o["error"] for o in outputs if o.get("error") is not None]
        assert comparable(chunks) == first[: len(chunks)], rid
        assert (errors == [] and len(chunks) == len(first)) or [e["code"] for e in errors] == [503], rid


def test_kafka_only_with_the_produce_and_consume_commands(pipeline: Pipeline, tmp_path: Path) -> None:
    """A user with only a broker: `produce` request envelopes, `consume` the OpenAI chunks."""
    golden = case(STREAM_CASE)
    rid = new_id("cli")
    requests = tmp_path / "requests.jsonl"
    requests.write_text(json.dumps(envelope(rid, "chat", recording(STREAM_CASE).request)) + "\n")
    produced = cli(pipeline.bootstrap, "produce", str(requests), "--topic", pipeline.requests_topic)
    assert produced.returncode == 0, produced.stderr
    deadline = time.monotonic() + 60
    while True:
        consumed = cli(
            pipeline.bootstrap, "consume", "--topic", pipeline.topics.output, "--from-beginning", "--assemble"
        )
        assert consumed.returncode == 0, consumed.stderr
        mine = [o for o in map(json.loads, consumed.stdout.splitlines()) if o["request_id"] == rid]
        if len(mine) == len(golden.expected) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert comparable(mine) == comparable(golden.expected)
    assembled = consumed.stderr.decode()
    assert f"== {rid} (chat, {len(golden.expected)} records)" in assembled
    assert "tool call: get_weather(" in assembled


def _huge(recorded: Recording, max_tokens: int, **changes: Any) -> dict[str, Any]:
    """A request whose answer is larger than a record: many tokens, 20 logprob candidates each."""
    return request_of(
        recorded, user="fault:bulk", max_tokens=max_tokens, logprobs=True, top_logprobs=20, **changes
    )


@pytest.mark.parametrize(("case_id", "max_tokens"), [(ONE_SHOT_CASE, 20_000), (STREAM_CASE, 12_000)])
def test_an_answer_too_large_for_a_record_is_a_413_and_ingest_stays_up(
    pipeline: Pipeline, case_id: str, max_tokens: int
) -> None:
    """A one-shot of 20000 tokens with top_logprobs 20 (~19 MB), or a streamed first event of ~12 MB:
    the request ends with a 413 error record, and ingest serves the next request."""
    rid, after = new_id("huge"), new_id("after")
    got = run_sync(_read(pipeline, [envelope(rid, "chat", _huge(recording(case_id), max_tokens))], 90))[rid]
    errors = [o["error"] for o in got if o.get("error") is not None]
    assert [e["code"] for e in errors] == [413], got
    assert all(p.alive for p in pipeline.ingests[-1:]), pipeline.logs()
    again = run_sync(_read(pipeline, [envelope(after, "chat", recording(STREAM_CASE).request)]))[after]
    assert comparable(again) == comparable(case(STREAM_CASE).expected)


def test_a_full_backlog_pauses_and_loses_no_request(pipeline: Pipeline) -> None:
    """--max-backlog-bytes 1: each request fills the backlog alone; the records read past it in the
    same fetch are read again once it drains, none is skipped."""
    for process in pipeline.ingests:
        if process.alive:
            process.kill()
    pipeline.start_ingest("--max-backlog-bytes", "1")
    records = [envelope(new_id("one-by-one"), "chat", recording(STREAM_CASE).request) for _ in range(5)]
    got = run_sync(_read(pipeline, records, timeout=120))
    for outputs in got.values():
        assert comparable(outputs) == comparable(case(STREAM_CASE).expected)
