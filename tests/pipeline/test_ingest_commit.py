"""ingest's commit when the producer refuses one record: only that record's request ends.

The producer here is a stand-in for the client layer's ``TransactionalProducer`` that refuses one
record the way both backends do (``send`` raises ``RecordTooLargeError`` before the record joins the
transaction); the whole path on the real broker is in ``test_ingest.py``.
"""

from __future__ import annotations

import asyncio

import orjson

from schemas.pipeline import RequestEnvelope
from worker.errors import RecordTooLargeError
from worker.pipeline.ingest import Ingest, _Partition, _Request, _Restored
from worker.runtime.delivery import Transaction
from worker.runtime.kafka_client.base import CommitTimings, Offsets, OutgoingRecord, TopicPartition
from worker.settings import IngestOptions


class RefusingProducer:
    """Records what a transaction holds; ``send`` refuses values containing ``refuse``."""

    transactional_id = "ingest-req-0"

    def __init__(self, refuse: bytes) -> None:
        self.refuse = refuse
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.commits: list[Offsets] = []

    async def start(self) -> None:
        pass

    async def begin(self) -> None:
        pass

    async def send(self, record: OutgoingRecord) -> None:
        assert record.key is not None and record.value is not None
        if self.refuse in record.value:
            raise RecordTooLargeError("The message is 17000000 bytes when serialized")
        self.sent.append((record.topic, record.key, record.value))

    async def commit(self, offsets: Offsets, group: object) -> CommitTimings:
        self.commits.append(dict(offsets))
        return CommitTimings()

    async def abort(self) -> None:
        raise AssertionError("a refused record must not abort the others' transaction")

    async def stop(self) -> None:
        pass


def test_a_refused_record_ends_its_request_only() -> None:
    async def go() -> tuple[RefusingProducer, _Request]:
        settings = IngestOptions(input_topic="in", output_topic="out", requests_topic="req")
        ingest = Ingest(settings, connection=None)  # type: ignore[arg-type]
        producer = RefusingProducer(b"HUGE")
        transaction = Transaction(producer, lambda: "ingest")
        partition = _Partition(ingest, TopicPartition("req", 0), transaction, _Restored())
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
    assert producer.commits == [{TopicPartition("req", 0): 0}]  # a, the oldest running request
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
