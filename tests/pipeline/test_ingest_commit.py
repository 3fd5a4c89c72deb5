"""ingest's commit when the producer refuses one record: only that record's request ends.

The producer here is a stand-in that refuses one record the way aiokafka's does (``send`` raises
``MessageSizeTooLargeError`` before the record joins the transaction); the whole path on the real
broker is in ``test_ingest.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError

from schemas.pipeline import RequestEnvelope
from worker.pipeline.ingest import Ingest, _Partition, _Request, _Restored
from worker.settings import IngestOptions


class RefusingProducer:
    """Records what a transaction holds; ``send`` refuses values containing ``refuse``."""

    def __init__(self, refuse: bytes) -> None:
        self.refuse = refuse
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.commits = 0

    async def begin_transaction(self) -> None:
        pass

    async def send(self, topic: str, *, value: bytes, key: bytes, **_: Any) -> None:
        if self.refuse in value:
            raise MessageSizeTooLargeError("The message is 17000000 bytes when serialized")
        self.sent.append((topic, key, value))

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
        pass

    async def commit_transaction(self) -> None:
        self.commits += 1

    async def abort_transaction(self) -> None:
        raise AssertionError("a refused record must not abort the others' transaction")


def test_a_refused_record_ends_its_request_only() -> None:
    async def go() -> tuple[RefusingProducer, _Request]:
        settings = IngestOptions(input_topic="in", output_topic="out", requests_topic="req")
        ingest = Ingest(settings, connection=None)  # type: ignore[arg-type]
        producer = RefusingProducer(b"HUGE")
        partition = _Partition(ingest, TopicPartition("req", 0), producer, _Restored())
        a = _Request(partition, 0, RequestEnvelope(request_id="a", endpoint="chat", request={}), (), 10)
        b = _Request(partition, 1, RequestEnvelope(request_id="b", endpoint="chat", request={}), (), 10)
        partition.running = {0: a, 1: b}
        for request, seq, text in [(a, 0, "ok"), (b, 0, "ok"), (b, 1, "HUGE"), (b, 2, "ok"), (a, 1, "ok")]:
            rid = request.envelope.request_id
            value = orjson.dumps({"request_id": rid, "seq": seq, "text": text})
            partition.emit("in", rid, value, request=request, seq=seq)
            request.seqs[rid] = seq + 1
        await partition.commit()
        return producer, b

    producer, b = asyncio.run(go())
    assert producer.commits == 1
    sent = [(topic, key.decode(), orjson.loads(value)) for topic, key, value in producer.sent]
    inputs = [(v["request_id"], v["seq"]) for topic, _, v in sent if topic == "in" and "seq" in v]
    assert inputs == [("a", 0), ("b", 0), ("a", 1)]  # b's later records are dropped, a's go on
    [error] = [v for topic, _, v in sent if topic == "out"]
    assert (error["request_id"], error["seq"], error["error"]["code"], error["terminal"]) == (
        "b",
        1,
        413,
        True,
    )
    assert ("in", "b", {"request_id": "b", "close": True}) in sent  # seq 0 reached the worker
    assert ("req", "b", {"request_id": "b", "ingest": "done"}) in sent
    assert b.failed
