"""A gateway replica stopped with SIGTERM (a rolling update) mid-run: it exits promptly and hands its
background response and its batch over; another replica claims both at once (their leases released, not
waited out) and completes them, with the real ``openai`` SDK, on the real broker. Nothing the first replica
had in flight is failed or cancelled: the response completes with continuous events, each generated once;
every batch line is answered exactly once, in input order, none of them an error line."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.pipeline.test_gateway_takeover import (
    Replicas,
    both_end_completed_once,
    mid_run_on_the_first,
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
    pipeline = replicas.pipeline
    batch_id, job_id = mid_run_on_the_first(replicas)
    started = time.monotonic()
    status = replicas.first.terminate(timeout=SHUTDOWN_S + 5)  # SIGTERM, as a rolling update sends
    assert status == 0, replicas.first.log_tail()
    assert time.monotonic() - started < SHUTDOWN_S + 5
    log = log_of(pipeline)
    assert f"batch {batch_id}: handed over" in log and f"background response {job_id}: handed over" in log

    # Claimed at once: well before a lease waited out could have expired.
    for taken in (f"batch:{batch_id}: taken over", f"background response {job_id}: taken over"):
        until(taken, lambda t=taken: t in log_of(pipeline), CLAIMED_WITHIN_S)

    both_end_completed_once(pipeline, replicas.second_url, batch_id, job_id)
    assert "line(s) sent before the takeover are read back" in log_of(pipeline)
