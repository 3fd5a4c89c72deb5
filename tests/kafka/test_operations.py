"""Operating the worker against a real broker: metrics and probes, the dead-letter breaker,
memory caps, fatal configuration. Workers are real ``derender-worker run`` processes.

SIGTERM under load (nothing lost, nothing duplicated) is ``tests/kafka/test_worker.py::
test_rebalance_under_load``: it SIGTERMs a worker while records are being produced and checks
the read_committed output against replay (no duplicates, nothing missing) and exit status 0.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Coroutine
from typing import Any

import orjson
import pytest

from tests.async_helpers import run_bounded
from tests.golden_cases import derenderer_for
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import (
    QWEN3_CONFIG,
    Record,
    TopicReader,
    WorkerGroup,
    assert_identical,
    free_port,
    generate_sequences,
    http_get,
    interleave,
    make_worker_topics,
    metric,
    model_args,
    produce,
    replay,
    wait_for_http,
)
from tests.paths import REPO_ROOT

pytestmark = pytest.mark.kafka


def run(coro: Coroutine[Any, Any, Any], timeout: float = 180.0) -> Any:
    return run_bounded(coro, timeout)


def _records(sequences: list[Any]) -> list[Record]:
    return [(e["request_id"].encode(), orjson.dumps(e)) for s in sequences for e in s.envelopes]


def test_metrics_and_probes(kafka_bootstrap: str, kafka_topic_factory: TopicFactory) -> None:
    records = interleave(generate_sequences(40, seed=51, prefix="metrics"), window=10)
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=2)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG)
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        worker = group.start(["--metrics-port", str(port)])
        try:
            await wait_for_http(url + "/readyz", 200, 60, group, "after start")
            assert http_get(url + "/healthz")[0] == 200
            await produce(kafka_bootstrap, topics.input, records)
            await reader.wait_for(reference.output_count, 60, "outputs", group.logs)
            await asyncio.sleep(0.5)  # the last commit's counters
            status, body = http_get(url + "/metrics")
            ready, ready_body = http_get(url + "/readyz")
        finally:
            assert worker.terminate() == 0, group.logs()
            await reader.stop()
        assert status == 200
        text = body.decode()
        assert metric(text, "derender_records_consumed_total") == len(records), text
        assert metric(text, "derender_outputs_produced_total") == reference.output_count
        assert metric(text, "derender_records_produced_total", topic=topics.output) == reference.output_count
        assert (metric(text, "derender_commits_total") or 0) > 0
        assert (metric(text, "derender_rebalances_total") or 0) >= 1
        for partition in ("0", "1"):
            assert metric(text, "derender_consumer_lag", partition=partition) is not None, text
        assert (metric(text, "derender_derender_seconds_count") or 0) == len(records)
        assert metric(text, "derender_commit_seconds_bucket", le="+Inf") is not None
        assert metric(text, "process_resident_memory_bytes") is not None
        assert ready == 200, ready_body
        assert orjson.loads(ready_body)["partitions"]["restored"] == [0, 1]

    run(body())


def test_breaker_pauses_only_the_bad_partition_until_restart(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """A burst of invalid records trips partition 1's breaker: it is paused and /readyz is 503.

    Partition 0 goes on. After the bad producer stopped and the worker restarted, /readyz is 200,
    the good records held back in partition 1 are processed and the dead letters are not re-read.
    """
    limit = 5
    sequences = generate_sequences(24, seed=61, prefix="breaker")
    before_0, before_1, after_0, after_1 = (sequences[i::4] for i in range(4))
    bad: list[Record] = [(b"bad", b"{not json %d" % i) for i in range(limit)]
    reference = replay(derenderer_for(QWEN3_CONFIG), [*_records(sequences), *bad])
    assert len(reference.dead_letters) == limit
    topics = make_worker_topics(kafka_topic_factory, partitions=2)
    flags = ["--dlq-max-consecutive", str(limit), "--dlq-max-ratio", "off"]
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG, extra=flags)
    ports = [free_port(), free_port()]

    def expected(seqs: list[Any]) -> int:
        return sum(len(s.envelopes) for s in seqs)

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        dlq = await TopicReader(kafka_bootstrap, topics.dlq).start()
        url = f"http://127.0.0.1:{ports[0]}"
        first = group.start(["--metrics-port", str(ports[0])])
        try:
            await wait_for_http(url + "/readyz", 200, 60, group, "after start")
            await produce(kafka_bootstrap, topics.input, _records(before_0), partition=0)
            await produce(kafka_bootstrap, topics.input, _records(before_1), partition=1)
            await reader.wait_for(expected(before_0 + before_1), 60, "outputs before the burst", group.logs)
            await produce(kafka_bootstrap, topics.input, bad, partition=1)  # the bad producer
            report = orjson.loads(await wait_for_http(url + "/readyz", 503, 30, group, "after the burst"))
            assert list(report["tripped"]) == ["1"], report
            assert report["tripped"]["1"]["cause"] == "consecutive"
            assert "partition 1 paused" in " ".join(report["reasons"]), report
            # The bad producer stopped; good records keep coming to both partitions.
            await produce(kafka_bootstrap, topics.input, _records(after_1), partition=1)
            await produce(kafka_bootstrap, topics.input, _records(after_0), partition=0)
            await reader.wait_for(
                expected(before_0 + before_1 + after_0),
                60,
                "partition 0's outputs while 1 is paused",
                group.logs,
            )
            await dlq.wait_for(limit, 30, "dead letters", group.logs)
            await reader.settle(1.5)
            held_back = {s.request_id for s in after_1}
            leaked = [r for r in reader.records if r.key.decode() in held_back]
            assert not leaked, f"{len(leaked)} outputs of the paused partition came out"
            assert http_get(url + "/readyz")[0] == 503
            metrics = http_get(url + "/metrics")[1].decode()
            assert metric(metrics, "derender_dead_letters_breaker_trips_total") == 1
            assert metric(metrics, "derender_partitions_paused") == 1
        finally:
            assert first.terminate() == 0, group.logs()
        # "The fix" is deployed: a restarted worker (new process, same group).
        url = f"http://127.0.0.1:{ports[1]}"
        group.start(["--metrics-port", str(ports[1])])
        try:
            await wait_for_http(url + "/readyz", 200, 60, group, "after the restart")
            await reader.wait_for(reference.output_count, 60, "the held-back outputs", group.logs)
            await reader.settle(1.5)
            await dlq.settle(0.5)
        finally:
            statuses = group.stop_all()
            await reader.stop()
            await dlq.stop()
        assert statuses == [0], group.logs()
        assert_identical(reader.records, reference, group.logs())
        assert len(dlq.records) == limit, "dead letters were re-read after the restart"

    run(body())


def test_open_request_cap_answers_503_and_never_drops(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """At --max-open-requests, every record of a new request gets a 503 output; open ones finish."""
    cap = 3
    sequences = generate_sequences(5, seed=71, prefix="cap")
    admitted, refused = sequences[:cap], sequences[cap:]
    # Every first record, then the refused requests' rest, then the admitted ones' rest: the cap
    # holds while the refused requests' records arrive.
    order = [s.envelopes[0] for s in sequences]
    order += [e for s in refused for e in s.envelopes[1:]]
    order += [e for s in admitted for e in s.envelopes[1:]]
    records = [(e["request_id"].encode(), orjson.dumps(e)) for e in order]
    reference = replay(derenderer_for(QWEN3_CONFIG), _records(admitted))
    topics = make_worker_topics(kafka_topic_factory, partitions=1)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG, extra=["--max-open-requests", str(cap)])
    port = free_port()

    async def body() -> None:
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        worker = group.start(["--metrics-port", str(port)])
        try:
            await produce(kafka_bootstrap, topics.input, records)
            await reader.wait_for(len(records), 60, "one output per record", group.logs)
            await reader.settle(1.0)
            metrics = http_get(f"http://127.0.0.1:{port}/metrics")[1].decode()
        finally:
            assert worker.terminate() == 0, group.logs()
            await reader.stop()
        refused_ids = {s.request_id for s in refused}
        mine = [r for r in reader.records if r.key.decode() not in refused_ids]
        assert_identical(mine, reference, group.logs())
        errors = [orjson.loads(r.value) for r in reader.records if r.key.decode() in refused_ids]
        assert len(errors) == sum(len(s.envelopes) for s in refused)
        for out in errors:
            assert out["error"]["code"] == 503 and out["error"]["type"] == "ServiceUnavailableError", out
            assert f"cap of {cap} open requests (--max-open-requests)" in out["error"]["message"]
        assert metric(metrics, "derender_requests_rejected_total", cap="open_requests") == len(errors)

    run(body())


def test_session_timeout_below_the_broker_minimum_is_a_configuration_error(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    topics = make_worker_topics(kafka_topic_factory, partitions=1)
    command = [sys.executable, "-m", "worker.cli", "run", "--bootstrap-servers", kafka_bootstrap]
    command += [*topics.args(), *model_args(QWEN3_CONFIG), "--metrics-port", "0"]
    command += ["--session-timeout-ms", "3000", "--group-id", f"timeout-{topics.input}"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "configuration error: the broker rejected --session-timeout-ms 3000" in done.stderr
    assert "group.min.session.timeout.ms" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_sigterm_while_starting_exits_cleanly(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """A scale-in can SIGTERM a worker that is still loading its tokenizer (seconds, tens of seconds
    on a loaded node): that is a stop request like any other, exit 0, not a death by signal."""
    topics = make_worker_topics(kafka_topic_factory, partitions=1)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG)
    port = free_port()

    async def body() -> None:
        worker = group.start(["--metrics-port", str(port)])
        # /healthz answers from before the tokenizer loads; the worker is not ready for a while.
        await wait_for_http(f"http://127.0.0.1:{port}/healthz", 200, 60, group, "after start")
        status = await asyncio.to_thread(worker.terminate)
        assert status == 0, worker.log_tail()

    run(body())
