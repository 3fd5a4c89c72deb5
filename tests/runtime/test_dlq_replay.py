"""``derender-worker dlq replay``: decoding (pure) and a real round trip through a broker."""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.kafka_broker import TopicFactory
from worker.cli import main as cli_main
from worker.core.envelope_processor import DEFAULT_MAX_OUTPUT_BYTES, DeadLetter
from worker.errors import ConfigurationError
from worker.runtime.dead_letters import record as dead_letter_record
from worker.runtime.dead_letters.replay import (
    ReplayOptions,
    decode_dead_letter,
    register_dlq,
    replay_dead_letters,
)
from worker.settings import epoch_ms

BINARY = b"\xff\xfe\x00not utf-8\x80"
LETTERS: list[tuple[bytes | None, bytes, str, list[tuple[str, str]]]] = [
    # (original key, original value, reason, original headers)
    (b"req-a", b'{"request_id": "req-a", "seq": 0', "malformed JSON: unexpected end", [("trace", "t-1")]),
    (b"req-b", BINARY, "malformed JSON: invalid utf-8", []),
    (None, b"[1, 2, 3]", "an envelope must be a JSON object, got list", [("a", "1"), ("b", "2")]),
]


def _dead_letter_value(key: bytes | None, value: bytes, reason: str, headers: list[tuple[str, str]]) -> bytes:
    # Exactly what the worker writes (the core's dead-letter encoding).
    encoded = [(name, text.encode()) for name, text in headers]
    source = {"topic": "in", "partition": 0, "offset": 1}
    return dead_letter_record.encode(
        DeadLetter(reason, value, key), encoded, source, max_bytes=DEFAULT_MAX_OUTPUT_BYTES
    )


# --- pure -------------------------------------------------------------------------------------


def test_decode_utf8_and_base64() -> None:
    item = decode_dead_letter(_dead_letter_value(*LETTERS[0]), b"req-a")
    assert (item.value, item.key, item.headers) == (LETTERS[0][1], b"req-a", [("trace", b"t-1")])
    raw = _dead_letter_value(*LETTERS[1])
    assert json.loads(raw)["original_encoding"] == "base64"
    item = decode_dead_letter(raw, b"req-b")
    assert item.value == BINARY and item.reason == LETTERS[1][2]


def test_decode_key_falls_back_to_the_json_key() -> None:
    raw = _dead_letter_value(b"req-z", b"x", "r", [])
    assert decode_dead_letter(raw, None).key == b"req-z"
    assert decode_dead_letter(_dead_letter_value(None, b"x", "r", []), None).key is None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (None, "empty dead-letter record"),
        (b"not json", "not a DeadLetterRecord"),
        (b'{"reason": "r"}', "not a DeadLetterRecord"),
        (b'{"reason": "r", "original": "***", "original_encoding": "base64"}', "not valid base64"),
    ],
)
def test_decode_rejects_what_is_not_a_dead_letter(value: bytes | None, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        decode_dead_letter(value, None)


def test_a_truncated_dead_letter_is_not_re_driven() -> None:
    value = b"x" * 10_000
    raw = dead_letter_record.encode(DeadLetter("r", value, b"k"), None, None, max_bytes=2_000)
    assert json.loads(raw)["truncated"] is True
    with pytest.raises(ValueError, match="truncated"):
        decode_dead_letter(raw, b"k")


def test_a_time_flag_takes_epoch_ms_or_iso_8601() -> None:
    assert epoch_ms("1700000000000") == 1_700_000_000_000
    assert epoch_ms("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert epoch_ms("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    assert epoch_ms("2023-11-14T22:13:20") == 1_700_000_000_000  # naive: UTC
    with pytest.raises(ValueError, match="epoch milliseconds or an ISO 8601 time"):
        epoch_ms("yesterday")


def _options(argv: list[str]) -> ReplayOptions:
    parser = argparse.ArgumentParser()
    register_dlq(parser.add_subparsers(dest="command"))
    return ReplayOptions.from_args(parser.parse_args(["dlq", "replay", *argv]))


def test_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DERENDER_SECURITY_PROTOCOL", raising=False)
    options = _options(
        ["--bootstrap-servers", "k:9092", "--dlq-topic", "dl", "--input-topic", "in", "--dry-run"]
    )
    assert (options.dlq_topic, options.to_topic, options.dry_run, options.from_offset) == (
        "dl",
        "in",
        True,
        None,
    )
    options = _options(["--bootstrap-servers", "k:9092", "--to-topic", "elsewhere", "--since", "1000"])
    assert (options.to_topic, options.since_ms) == ("elsewhere", 1000)
    with pytest.raises(ConfigurationError, match="--from-offset"):
        _options(["--bootstrap-servers", "k:9092", "--from-offset", "-1"])
    with pytest.raises(ConfigurationError, match="exclude each other"):  # one start position at most
        _options(["--bootstrap-servers", "k:9092", "--from-offset", "1", "--since", "1000"])


# --- against a broker -------------------------------------------------------------------------


async def _produce_letters(bootstrap: str, dlq: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for letter in LETTERS:
            # The worker keys a dead letter by the original record's key.
            await producer.send_and_wait(dlq, _dead_letter_value(*letter), key=letter[0], partition=0)
        await producer.send_and_wait(dlq, b"garbage, not a dead letter", partition=0)
    finally:
        await producer.stop()


async def _read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)  # the tests' target topics have one partition
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        # An explicit seek: seek_to_beginning can lose to the "latest" reset that assign() started.
        consumer.seek(tp, (await consumer.beginning_offsets([tp]))[tp])
        out: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]] = []
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out.extend((r.key, r.value, list(r.headers)) for r in records)
        return out
    finally:
        await consumer.stop()


@pytest.mark.kafka
def test_replay_round_trip(kafka_bootstrap: str, kafka_topic_factory: TopicFactory) -> None:
    dlq = kafka_topic_factory("dlq", partitions=2)
    target = kafka_topic_factory("in", partitions=1)
    asyncio.run(_produce_letters(kafka_bootstrap, dlq))
    base = ["--bootstrap-servers", kafka_bootstrap, "--dlq-topic", dlq, "--input-topic", target]

    # --dry-run: prints what it would send, produces nothing.
    out = io.StringIO()
    report = asyncio.run(replay_dead_letters(_options([*base, "--dry-run"]), out))
    assert (report.read, report.replayed, report.undecodable, report.filtered) == (4, 3, 1, 0)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    would = [line for line in lines if "would_send" in line]
    assert [line["key"] for line in would] == ["req-a", "req-b", None]
    assert [line["bytes"] for line in would] == [len(v) for _, v, _, _ in LETTERS]
    assert asyncio.run(_read_all(kafka_bootstrap, target)) == []

    # --reason-contains: only the matching dead letters.
    assert cli_main(["dlq", "replay", *base, "--reason-contains", "invalid utf-8"]) == 0
    assert asyncio.run(_read_all(kafka_bootstrap, target)) == [(b"req-b", BINARY, [])]

    # Everything from offset 2 (in every partition of the DLQ): the third letter and the garbage.
    report = asyncio.run(replay_dead_letters(_options([*base, "--from-offset", "2"]), io.StringIO()))
    assert (report.read, report.replayed, report.undecodable) == (2, 1, 1)

    # Then all of it: exact bytes, keys and headers come back, in order.
    report = asyncio.run(replay_dead_letters(_options(base), io.StringIO()))
    assert (report.read, report.replayed, report.undecodable) == (4, 3, 1)
    replayed = asyncio.run(_read_all(kafka_bootstrap, target))
    assert replayed[2:] == [
        (key, value, [(name, text.encode()) for name, text in headers]) for key, value, _, headers in LETTERS
    ]
    assert replayed[:2] == [(b"req-b", BINARY, []), (None, b"[1, 2, 3]", [("a", b"1"), ("b", b"2")])]
    assert base64.b64encode(replayed[3][1]) == base64.b64encode(BINARY)


@pytest.mark.kafka
def test_replay_since_and_missing_topic(kafka_bootstrap: str, kafka_topic_factory: TopicFactory) -> None:
    dlq = kafka_topic_factory("dlq", partitions=1)
    target = kafka_topic_factory("in", partitions=1)
    asyncio.run(_produce_letters(kafka_bootstrap, dlq))
    base = ["--bootstrap-servers", kafka_bootstrap, "--dlq-topic", dlq, "--input-topic", target, "--dry-run"]
    report = asyncio.run(replay_dead_letters(_options([*base, "--since", "4102444800000"]), io.StringIO()))
    assert report.read == 0  # 2100-01-01: nothing that late
    report = asyncio.run(
        replay_dead_letters(_options([*base, "--since", "0", "--limit", "2"]), io.StringIO())
    )
    assert report.replayed == 2
    missing = [
        "--bootstrap-servers",
        kafka_bootstrap,
        "--dlq-topic",
        f"{dlq}-missing",
        "--input-topic",
        target,
    ]
    with pytest.raises(ConfigurationError, match="does not exist"):
        asyncio.run(replay_dead_letters(_options(missing), io.StringIO()))


@pytest.mark.kafka
def test_replay_sends_each_record_back_to_its_partition(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """Keys are hashed as the clients that write the input hash them (murmur2), so a re-driven
    record lands on the partition its request's other records are on."""
    dlq = kafka_topic_factory("dlq", partitions=1)
    target = kafka_topic_factory("in", partitions=4)
    keys = [f"req-{i}".encode() for i in range(24)]
    letters: list[tuple[bytes | None, bytes, str, list[tuple[str, str]]]] = [
        (key, b"{}", "malformed", []) for key in keys
    ]

    async def write() -> dict[bytes, int]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for letter in letters:
                await producer.send_and_wait(dlq, _dead_letter_value(*letter), key=letter[0])
            # Where the original records of these requests went (aiokafka: as Java clients).
            sent = [await producer.send_and_wait(target, b"original", key=key) for key in keys]
            return {key: meta.partition for key, meta in zip(keys, sent, strict=True)}
        finally:
            await producer.stop()

    async def read() -> list[tuple[bytes, int]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, isolation_level="read_committed")
        await consumer.start()
        try:
            tps = [TopicPartition(target, p) for p in range(4)]
            consumer.assign(tps)
            for tp, offset in (await consumer.beginning_offsets(tps)).items():
                consumer.seek(tp, offset)
            ends = await consumer.end_offsets(tps)
            out: list[tuple[bytes, int]] = []
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    out.extend((r.key, r.partition) for r in records if r.value == b"{}")
            return out
        finally:
            await consumer.stop()

    originals = asyncio.run(write())
    argv = ["--bootstrap-servers", kafka_bootstrap, "--dlq-topic", dlq, "--input-topic", target]
    assert cli_main(["dlq", "replay", *argv]) == 0
    replayed = asyncio.run(read())
    assert sorted(key for key, _ in replayed) == sorted(keys)
    assert {key: partition for key, partition in replayed} == originals
