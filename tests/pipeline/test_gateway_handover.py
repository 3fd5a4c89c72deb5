"""A gateway replica stopped with SIGTERM (a rolling update) mid-run: it exits promptly and hands its
background response and its batch over; another replica claims both at once (their leases released, not
waited out) and completes them, with the real ``openai`` SDK, on the real broker. Nothing the first replica
had in flight is failed or cancelled: the response completes with continuous events, each generated once;
every batch line is answered exactly once, in input order, none of them an error line."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import pytest

from tests.api_cases import QUESTION, RESPONSES_TOOLS
from tests.pipeline.test_gateway_takeover import (
    LINES,
    WINDOW,
    Replicas,
    both_end_completed_once,
    input_file,
    sdk,
    two_replicas,
    until,
)
from tests.pipeline_helpers import Pipeline

pytestmark = pytest.mark.kafka
# Long enough that a lease waited out (at least 2/3 of it after the stop) is told from one released
# (claimed in the next round, at most a third of it).
LEASE_S = 45
CLAIMED_WITHIN_S = 25
SHUTDOWN_S = 10


@pytest.fixture(scope="module")
def replicas(kafka_bootstrap: str) -> Iterator[Replicas]:
    flags = ("--takeover-lease-s", str(LEASE_S), "--shutdown-timeout-s", str(SHUTDOWN_S))
    with two_replicas(kafka_bootstrap, *flags) as both:
        yield both


def log_of(pipeline: Pipeline) -> str:
    assert pipeline.gateway is not None
    return pipeline.gateway.log_tail(100_000)  # both replicas append to the one gateway log


def test_a_stopped_replicas_background_response_and_batch_are_handed_over(replicas: Replicas) -> None:
    pipeline, first = replicas.pipeline, sdk(replicas.first_url)
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

    until("the batch and the response mid-run on the first replica", mid_run, 60)
    started = time.monotonic()
    status = replicas.first.terminate(timeout=SHUTDOWN_S + 5)  # SIGTERM, as a rolling update sends
    assert status == 0, replicas.first.log_tail()
    assert time.monotonic() - started < SHUTDOWN_S + 5
    log = log_of(pipeline)
    assert f"batch {batch.id}: handed over" in log and f"background response {job.id}: handed over" in log

    # Claimed at once: well before a lease waited out could have expired.
    for taken in (f"batch:{batch.id}: taken over", f"background response {job.id}: taken over"):
        until(taken, lambda t=taken: t in log_of(pipeline), CLAIMED_WITHIN_S)

    both_end_completed_once(pipeline, replicas.second_url, batch.id, job.id)
    assert "line(s) sent before the takeover are read back" in log_of(pipeline)
