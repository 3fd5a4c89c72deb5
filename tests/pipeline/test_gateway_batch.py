"""The Batch API with the real ``openai`` SDK: files and batches in a compacted topic, each line a chat
request through the pipeline, the output file one line per input line in input order."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

from tests.kafka_broker import TopicFactory
from tests.pipeline_helpers import ONE_SHOT_CASE, Pipeline, case, comparable, recording, request_of

pytestmark = pytest.mark.kafka
LINES = 1000


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str) -> Iterator[Pipeline]:
    factory = TopicFactory(kafka_bootstrap)
    pipeline = Pipeline(kafka_bootstrap, factory, max_inflight=32)
    pipeline.start(workers=2)
    batches = factory("batches", 3, config={"cleanup.policy": "compact"})
    pipeline.start_gateway("--batch-topic", batches)
    with pipeline.serving() as ready:
        yield ready


def sdk(pipeline: Pipeline) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{pipeline.gateway_url}/v1", api_key="unused", max_retries=0, timeout=120)


def input_file(lines: int) -> bytes:
    body = request_of(recording(ONE_SHOT_CASE))
    rows = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(lines)
    ]
    return b"\n".join(orjson.dumps(r) for r in rows) + b"\n"


def wait_for(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(0.5)


def test_a_batch_is_answered_once_per_line_in_order_across_a_worker_sigkill(pipeline: Pipeline) -> None:
    client = sdk(pipeline)
    uploaded = client.files.create(file=("input.jsonl", io.BytesIO(input_file(LINES))), purpose="batch")
    assert uploaded.bytes == len(input_file(LINES))
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert (
        batch.status == "in_progress"
        and batch.request_counts is not None
        and batch.request_counts.total == LINES
    )
    deadline = time.monotonic() + 120
    while (
        counts := client.batches.retrieve(batch.id).request_counts
    ) is None or counts.completed < LINES // 5:
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.2)
    assert counts.completed < LINES  # mid-batch:
    pipeline.workers.alive[0].kill()  # its partitions move to the other worker
    done = wait_for(client, batch.id, ("completed", "failed", "expired", "cancelled"))
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
    assert done.output_file_id is not None and done.error_file_id is None
    lines = client.files.content(done.output_file_id).content.splitlines()
    rows = [orjson.loads(line) for line in lines]
    assert [r["custom_id"] for r in rows] == [f"line-{i}" for i in range(LINES)]  # every line once, in order
    want = comparable(case(ONE_SHOT_CASE).expected)
    for row in rows:  # each equal to the chat answer for the same request
        assert row["response"]["status_code"] == 200
        assert comparable([{"seq": 0, "endpoint": "chat", "body": row["response"]["body"]}]) == want


def test_cancel_stops_a_running_batch(pipeline: Pipeline) -> None:
    client = sdk(pipeline)
    uploaded = client.files.create(file=("input.jsonl", io.BytesIO(input_file(LINES))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = wait_for(client, batch.id, ("cancelled", "completed"))
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert done.request_counts is not None and done.request_counts.completed < LINES
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)
