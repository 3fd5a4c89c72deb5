"""``derender-worker topics create`` and the start-up topic check, against a real broker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.kafka_broker import TopicFactory, create_topics, delete_topics, run_sync, unique_topic_name
from tests.kafka_helpers import QWEN3_CONFIG, WorkerProcess, free_port, model_args, wait_for_http
from tests.paths import REPO_ROOT

pytestmark = pytest.mark.kafka


def _cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def _describe(bootstrap: str, topics: list[str]) -> tuple[dict[str, int], dict[str, str]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        counts = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(topics)}
        response = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topics[2])])
        entries = response[0].resources[0][4]
        config = {entry[0]: entry[1] for entry in entries}
        return counts, config
    finally:
        await admin.close()


def test_topics_create_is_idempotent(kafka_bootstrap: str) -> None:
    suffix = uuid.uuid4().hex[:10]
    names = [
        f"tc-in-{suffix}",
        f"tc-out-{suffix}",
        f"tc-state-{suffix}",
        f"tc-dlq-{suffix}",
        f"tc-req-{suffix}",
    ]
    flags = ["--input-topic", names[0], "--output-topic", names[1], "--state-topic", names[2]]
    flags += ["--dlq-topic", names[3], "--requests-topic", names[4]]  # the pipeline's too
    argv = ["topics", "create", "--bootstrap-servers", kafka_bootstrap, *flags]
    try:
        first = _cli(*argv, "--partitions", "4")
        assert first.returncode == 0, first.stderr
        assert first.stdout.count("created") == 5, first.stdout
        assert f"created {names[4]}" in first.stdout
        again = _cli(*argv, "--partitions", "4")
        assert again.returncode == 0, again.stderr
        assert again.stdout.count("exists") == 5, again.stdout
        counts, state_config = run_sync(_describe(kafka_bootstrap, names))
        assert counts == dict.fromkeys(names, 4)
        assert state_config["cleanup.policy"] == "compact"
    finally:
        run_sync(delete_topics(kafka_bootstrap, names))


def test_run_refuses_a_state_topic_with_other_partitions(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    inp, out, dlq = kafka_topic_factory.many(["in", "out", "dlq"], 4)
    state = kafka_topic_factory("state", 2, config={"cleanup.policy": "compact"})
    result = _cli(
        "run",
        "--bootstrap-servers",
        kafka_bootstrap,
        "--input-topic",
        inp,
        "--output-topic",
        out,
        "--state-topic",
        state,
        "--dlq-topic",
        dlq,
        *model_args(QWEN3_CONFIG),
    )
    assert result.returncode == 2, result.stderr
    assert "needs at least as many" in result.stderr, result.stderr


def test_sigterm_while_idle_exits_zero_quickly(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    from tests.kafka_helpers import WorkerGroup, make_worker_topics

    topics = make_worker_topics(kafka_topic_factory, 2)
    group = WorkerGroup(kafka_bootstrap, topics, QWEN3_CONFIG)
    worker = group.start()

    async def wait_opened() -> None:
        for _ in range(300):
            if "opened partitions" in worker.log_path.read_text(errors="replace"):
                return
            group.check_no_unexpected_exit()
            await asyncio.sleep(0.1)
        raise AssertionError(f"worker never opened its partitions\n{worker.log_tail()}")

    asyncio.run(wait_opened())
    assert worker.terminate(timeout=15) == 0, worker.log_tail()
    assert "stopped; metrics" in worker.log_path.read_text()


def test_a_gateway_started_before_its_topics_waits_for_them(kafka_bootstrap: str, tmp_path: Path) -> None:
    """It exited 2 (in Kubernetes: a crash loop until ingest had run once); now it waits, saying so."""
    requests, output = unique_topic_name("gw-req"), unique_topic_name("gw-out")
    port = free_port()
    command = [sys.executable, "-m", "worker.cli", "gateway", "--bootstrap-servers", kafka_bootstrap]
    command += ["--requests-topic", requests, "--output-topic", output, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--api-key", "k"]
    gateway = WorkerProcess("gateway", command, tmp_path / "gateway.log").start()
    try:
        deadline = time.monotonic() + 60
        while "waiting for topic(s)" not in gateway.log_tail():
            assert gateway.alive, gateway.log_tail()
            assert time.monotonic() < deadline, gateway.log_tail()
            time.sleep(0.2)
        assert gateway.log_tail().count("waiting for topic(s)") == 1  # one line, not one per check
        run_sync(create_topics(kafka_bootstrap, [requests, output], 1))
        asyncio.run(wait_for_http(f"http://127.0.0.1:{port}/healthz", 200, 60, what="(gateway)"))
        assert gateway.alive
    finally:
        gateway.terminate()
        run_sync(delete_topics(kafka_bootstrap, [requests, output]))
