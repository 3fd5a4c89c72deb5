"""The stored responses' in-memory bound and the cancel that wins its race (no Kafka: the reader's logic)."""

from __future__ import annotations

from worker.pipeline.apis.responses_store import ResponsesStore
from worker.pipeline.connection import Connection
from worker.runtime.security.kafka_security import KafkaSecurity


def store(max_bytes: int) -> ResponsesStore:
    return ResponsesStore(Connection("127.0.0.1:1", "test", KafkaSecurity()), "unused", max_bytes)


def record(status: str) -> dict[str, object]:
    return {"response": {"status": status}, "messages": [], "events": None}


def test_the_oldest_records_go_first_past_the_byte_bound() -> None:
    kept = store(250)
    for n in range(10):
        kept._keep(f"resp_{n}", record("completed"), 100)
    assert list(kept.records) == ["resp_8", "resp_9"] and kept.held_bytes == 200
    kept._keep("resp_8", record("completed"), 100)  # rewritten: the newest now, counted once
    assert list(kept.records) == ["resp_9", "resp_8"] and kept.held_bytes == 200
    kept._drop("resp_9")
    assert list(kept.records) == ["resp_8"] and kept.held_bytes == 100


def test_a_cancel_is_not_undone_by_the_generations_later_writes() -> None:
    kept = store(10_000)
    kept._keep("resp_1", record("in_progress"), 10)
    kept._keep("resp_1", record("cancelled"), 10)
    kept._keep("resp_1", record("completed"), 10)
    assert kept.records["resp_1"]["response"] == {"status": "cancelled"}
