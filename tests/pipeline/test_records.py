"""``produce`` and ``consume``: JSON Lines in and out of a topic through the real CLI and broker."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tests.golden_cases import load_cases
from tests.kafka_broker import TopicFactory, run_sync
from tests.kafka_helpers import fetched_bytes
from tests.pipeline_helpers import cli

pytestmark = pytest.mark.kafka


def test_produce_then_consume_keeps_each_request_in_order(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic_factory("records", partitions=3)
    lines = [{"request_id": f"r{i % 4}", "n": i} for i in range(20)]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n\nnot json\n")

    produced = cli(kafka_bootstrap, "produce", str(source), "--topic", topic)
    assert produced.returncode == 1, produced.stderr  # the bad line, after every good one was sent
    assert b"line 22: not JSON" in produced.stderr

    consumed = cli(kafka_bootstrap, "consume", "--topic", topic, "--from-beginning")
    assert consumed.returncode == 0, consumed.stderr
    values = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert sorted(v["n"] for v in values) == list(range(20))
    for request_id in {v["request_id"] for v in values}:  # keyed by request_id: one partition, in order
        ns = [v["n"] for v in values if v["request_id"] == request_id]
        assert ns == sorted(ns)

    from_end = cli(kafka_bootstrap, "consume", "--topic", topic)
    assert from_end.returncode == 0 and from_end.stdout == b""


def test_produce_compresses_its_batches(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic_factory("records-gzip")
    # Golden input envelopes: the JSON the pipeline really sends, which compresses several-fold.
    lines = [record for case in load_cases()[:20] for record in case.input]
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))

    produced = cli(kafka_bootstrap, "produce", str(source), "--topic", topic, "--compression-type", "gzip")
    assert produced.returncode == 0, produced.stderr
    wire, payload = fetched_bytes(kafka_bootstrap, topic, len(lines))
    assert wire < payload * 0.6, f"{wire} bytes fetched for {payload} bytes of records: not compressed"


def test_consume_reads_committed_records_only(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory("records")

    async def write() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic}-tx")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, b'{"request_id": "kept"}', key=b"kept")
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b'{"request_id": "aborted"}', key=b"aborted")
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send_and_wait(topic, b'{"request_id": "kept-too"}', key=b"kept-too")
        finally:
            await producer.stop()

    run_sync(write())
    consumed = cli(kafka_bootstrap, "consume", "--topic", topic, "--from-beginning")
    assert consumed.returncode == 0, consumed.stderr
    assert [json.loads(line)["request_id"] for line in consumed.stdout.splitlines()] == ["kept", "kept-too"]


def test_consume_assembles_output_envelopes(kafka_bootstrap: str, kafka_topic_factory: TopicFactory) -> None:
    case = next(c for c in load_cases() if c.id == "qwen3+hermes-stream-reasoning-then-tool")
    topic = kafka_topic_factory("outputs")
    stdin = b"".join(json.dumps(e).encode() + b"\n" for e in case.expected)
    assert cli(kafka_bootstrap, "produce", "-", "--topic", topic, stdin=stdin).returncode == 0

    consumed = cli(kafka_bootstrap, "consume", "--topic", topic, "--from-beginning", "--assemble")
    assert consumed.returncode == 0, consumed.stderr
    assert len(consumed.stdout.splitlines()) == len(case.expected)
    text = consumed.stderr.decode()
    assert "reasoning: " in text and "tool call: get_weather(" in text and "finish_reason: tool_calls" in text


def test_missing_topic_is_a_configuration_error(kafka_bootstrap: str) -> None:
    result = cli(kafka_bootstrap, "consume", "--topic", "derender-no-such-topic-h5")
    assert result.returncode == 2
    assert b"topic 'derender-no-such-topic-h5' does not exist" in result.stderr


def test_ingest_creates_the_requests_topic_for_whole_prompts(kafka_bootstrap: str) -> None:
    """A requests topic that ingest creates takes records as large as its producers send (16 MiB),
    not the broker's 1 MiB default: a long prompt must not be refused."""
    import argparse
    import uuid

    from aiokafka.admin import AIOKafkaAdminClient

    from worker.pipeline.connection import MAX_REQUEST_BYTES, Connection, add_connection_arguments
    from worker.runtime.topics import max_message_bytes

    parser = argparse.ArgumentParser()
    add_connection_arguments(parser)
    connection = Connection.from_args(parser.parse_args(["--bootstrap-servers", kafka_bootstrap]), "test")
    name = f"requests-{uuid.uuid4().hex[:10]}"

    async def body() -> dict[str, int | None]:
        assert await connection.ensure_topic(name, 1)
        try:
            return await max_message_bytes(kafka_bootstrap, [name])
        finally:
            admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
            await admin.start()
            try:
                await admin.delete_topics([name])
            finally:
                await admin.close()

    assert run_sync(body())[name] == MAX_REQUEST_BYTES


def test_produce_reports_each_line_too_large_for_a_record_and_goes_on(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """A line over 16 MiB (the producer's limit) and one the topic refuses (over its 1 MiB
    ``max.message.bytes``) are each reported by number; the lines around them are sent."""
    topic = kafka_topic_factory("records-large", config={"max.message.bytes": str(1 << 20)})
    huge = json.dumps({"request_id": "huge", "pad": "x" * (17 << 20)}).encode()
    # Random, so that no compression brings it under the topic's limit.
    refused = json.dumps({"request_id": "refused", "pad": base64.b64encode(os.urandom(2 << 20)).decode()})
    source = tmp_path / "in.jsonl"
    lines = [b'{"request_id": "first"}', huge, refused.encode(), b'{"request_id": "last"}']
    source.write_bytes(b"\n".join(lines))

    produced = cli(kafka_bootstrap, "produce", str(source), "--topic", topic)
    stderr = produced.stderr.decode()
    assert produced.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert f"line 2: longer than {16 << 20} bytes, not sent" in stderr
    assert "line 3: not sent (" in stderr and "TooLarge" in stderr
    assert "produce: 2 record(s)" in stderr

    consumed = cli(kafka_bootstrap, "consume", "--topic", topic, "--from-beginning")
    assert consumed.returncode == 0, consumed.stderr
    assert [json.loads(line)["request_id"] for line in consumed.stdout.splitlines()] == ["first", "last"]
