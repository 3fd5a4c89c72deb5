"""A gateway replica killed mid-run: another replica takes its background response and its batch over
(their leases expire) and completes both, with the real ``openai`` SDK, on the real broker. The batch's
output file holds every line exactly once, in input order, each line generated once; the background
response's events from the new replica carry on the numbering and ids of the ones stored before."""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import orjson
import pytest

from tests.api_cases import QUESTION, RESPONSES_TOOLS, stream_recording
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import WorkerProcess, wait_for_http
from tests.pipeline_helpers import ONE_SHOT_CASE, Pipeline, case, comparable, recording, request_of

pytestmark = pytest.mark.kafka
LINES = 240
LEASE_S = 3
WINDOW = 8


@dataclass
class Replicas:
    pipeline: Pipeline
    first: WorkerProcess
    first_url: str
    second_url: str


@contextlib.contextmanager
def two_replicas(kafka_bootstrap: str, *flags: str) -> Iterator[Replicas]:
    """ingest, a worker and two gateway replicas sharing a batch topic and a stored-responses topic;
    ``flags`` go to both replicas. The pipeline stops the second; the first is killed at the end."""
    factory = TopicFactory(kafka_bootstrap)
    pipeline = Pipeline(kafka_bootstrap, factory, max_inflight=32, extra_recordings=(stream_recording(),))
    pipeline.start(workers=1)
    batches = factory("batches", 3, config={"cleanup.policy": "compact"})
    stored = factory("responses", 3, config={"cleanup.policy": "compact"})
    extra = (*("--batch-topic", batches, "--responses-topic", stored, "--batch-window", str(WINDOW)), *flags)
    first = pipeline.start_gateway(*extra)
    first_url = pipeline.gateway_url
    asyncio.run(wait_for_http(f"{first_url}/healthz", 200, 60, what="(first gateway)"))
    pipeline.start_gateway(*extra)
    with pipeline.serving() as ready:
        try:
            yield Replicas(ready, first, first_url, ready.gateway_url)
        finally:
            if first.alive:
                first.kill()


@pytest.fixture(scope="module")
def replicas(kafka_bootstrap: str) -> Iterator[Replicas]:
    with two_replicas(kafka_bootstrap, "--takeover-lease-s", str(LEASE_S)) as both:
        yield both


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def input_file() -> bytes:
    body = {**request_of(recording(ONE_SHOT_CASE)), "user": "fault:slower"}  # each line takes a while
    rows = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(LINES)
    ]
    return b"\n".join(orjson.dumps(r) for r in rows) + b"\n"


def until(what: str, check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.2)
    return found


def mid_run_on_the_first(replicas: Replicas) -> tuple[str, str]:
    """A batch and a background response started on the first replica, once both are mid-run there:
    their ids."""
    first = sdk(replicas.first_url)
    uploaded = first.files.create(file=("input.jsonl", io.BytesIO(input_file())), purpose="batch")
    batch = first.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    job = first.responses.create(
        model="test-model", input=QUESTION, tools=RESPONSES_TOOLS, background=True, user="fault:crawl"
    )  # 2 s a chunk: it is still running whenever the batch is mid-run

    def mid_run() -> bool:
        counts = first.batches.retrieve(batch.id).request_counts
        running = first.responses.retrieve(job.id).status == "in_progress"
        return running and counts is not None and WINDOW <= counts.completed < LINES // 2

    # A wait, not a measure: with other tests on the machine the first lines can take minutes.
    until("the batch and the response mid-run on the first replica", mid_run, 240)
    return batch.id, job.id


def test_a_killed_replicas_background_response_and_batch_are_completed_by_another(replicas: Replicas) -> None:
    pipeline = replicas.pipeline
    batch_id, job_id = mid_run_on_the_first(replicas)
    replicas.first.kill()  # SIGKILL: no clean shutdown, no cancels

    both_end_completed_once(pipeline, replicas.second_url, batch_id, job_id)

    # The second replica took both over, reading back what the first had sent.
    assert pipeline.gateway is not None
    log = pipeline.gateway.log_tail(100_000)
    assert f"batch:{batch_id}: taken over" in log and f"background response {job_id}: taken over" in log
    assert "line(s) sent before the takeover are read back" in log


def both_end_completed_once(pipeline: Pipeline, second_url: str, batch_id: str, job_id: str) -> None:
    """The batch and the background response, finished by the second replica: every line once, in
    order, equal to the chat answer, and nothing generated twice."""
    second = sdk(second_url)
    final = ("completed", "failed", "expired", "cancelled")
    done = until("the batch's end", lambda: (b := second.batches.retrieve(batch_id)).status in final and b)
    assert done.status == "completed", done
    assert done.request_counts is not None
    errors = second.files.content(done.error_file_id).text[:2000] if done.error_file_id else ""
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0), errors
    assert done.output_file_id is not None and done.error_file_id is None
    rows = [orjson.loads(line) for line in second.files.content(done.output_file_id).content.splitlines()]
    assert [r["custom_id"] for r in rows] == [f"line-{i}" for i in range(LINES)]  # each once, in order
    want = comparable(case(ONE_SHOT_CASE).expected)
    for row in rows:
        assert row["response"]["status_code"] == 200
        assert comparable([{"seq": 0, "endpoint": "chat", "body": row["response"]["body"]}]) == want
    # No line generated twice: ingest saw each request once.
    generated = {k: n for k, n in pipeline.fake.generations_of.items() if batch_id in k}
    assert len(generated) == LINES and set(generated.values()) == {1}, generated

    response = until(
        "the background response's end",
        lambda: (r := second.responses.retrieve(job_id)).status in ("completed", "failed") and r,
    )
    assert response.status == "completed", response
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert [n for k, n in pipeline.fake.generations_of.items() if job_id in k] == [1]
    events: list[Any] = list(second.responses.retrieve(job_id, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    done_items = [e.item.id for e in events if e.type == "response.output_item.done"]
    assert done_items == [item.id for item in response.output]
