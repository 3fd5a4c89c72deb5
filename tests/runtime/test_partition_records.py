"""The partition's per-record path: what the core decides for a record is what the partition sends,
outputs and dead letters alike, with the record's source and headers."""

from __future__ import annotations

import asyncio

import orjson
from aiokafka import TopicPartition

from schemas.envelope import DeadLetterRecord
from tests.golden_cases import derenderer_for, sample_config
from tests.partition_fakes import FakeRecord, RecordingSink, changelog_for
from tests.stream_builders import chat_stream
from worker.core.envelope_processor import EnvelopeProcessor
from worker.runtime.observability.metrics import Metrics
from worker.runtime.partition import OwnedPartition
from worker.runtime.topics import TopicNames

PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
CONFIG = sample_config(max_model_len=64)


def test_the_partition_sends_the_core_bytes() -> None:
    topics = TopicNames("in", "out", "state", "dlq")
    sink = RecordingSink()
    task = OwnedPartition(
        TopicPartition("in", 0),
        EnvelopeProcessor(derenderer_for(CONFIG), max_record_bytes=8 * 1024 * 1024, require_key=True),
        sink,
        topics,
        Metrics(),
        position=0,
        changelog=changelog_for(TopicPartition("in", 0), topics),
    )
    poison = b'{"request_id": "' + b"\x00" * 600_000 + b'"}'
    good = [orjson.dumps(r) for r in chat_stream("good", [[9707], [0], [151645]], prompt_token_ids=PROMPT)]
    big_seq = orjson.loads(good[0])
    big_seq["seq"] = "18446744073709551616"  # 2**64: no 64-bit integer holds it
    records = [(record, b"good") for record in good]
    records.insert(1, (poison, b"p"))
    records.insert(2, (orjson.dumps(big_seq), b"bad"))

    async def body() -> None:
        for offset, (value, key) in enumerate(records):
            record = FakeRecord(offset, value=value, key=key, partition=0)
            record.headers = [("trace", b"t")]
            await task.handle(record)

    asyncio.run(body())
    assert task.position == len(records)
    outputs = [orjson.loads(r.value) for r in sink.sent if r.topic == "out" and r.value]
    assert [o["seq"] for o in outputs] == [0, 1, 2]
    assert all(o["source"]["topic"] == "in" for o in outputs)
    letters = [
        DeadLetterRecord.model_validate_json(r.value) for r in sink.sent if r.topic == "dlq" and r.value
    ]
    assert len(letters) == 2
    assert letters[0].original_size == len(poison) and letters[0].headers == [("trace", "t")]
    assert not letters[0].truncated  # the whole original: only the core's output limit cuts
    assert letters[1].source is not None and letters[1].source.offset == 2
