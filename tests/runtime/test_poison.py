"""Broker-free tests of bounded resets (``poison``) and the start-up refusals (``preflight``)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from tests.golden_cases import derenderer_for
from tests.kafka_helpers import QWEN3_CONFIG, generate_sequences
from tests.partition_fakes import (
    TOPICS,
    FakeRecord,
    PollingConsumer,
    RecordingSink,
    StubConsumer,
    owned_partition,
    run_settings,
)
from tests.runtime.worker_fakes import new_worker
from worker.core.envelope_processor import ProcessResult
from worker.errors import ConfigurationError, DeliveryFailedError, KafkaClientError, RecordTooLargeError
from worker.runtime.dead_letters.poison import ResetTracker
from worker.runtime.dead_letters.policy import DeadLetterLimits
from worker.runtime.kafka_client.aiokafka_backend import parse_max_message_bytes
from worker.runtime.kafka_client.base import OutgoingRecord, TopicPartition
from worker.runtime.kafka_client.limits import MAX_RECORD_BYTES
from worker.runtime.observability.observer import RecordObserver
from worker.runtime.observability.tracing import Headers
from worker.runtime.partition import OwnedPartition
from worker.runtime.preflight import check_record_limits
from worker.runtime.worker import Worker
from worker.settings import ModelSettings


def test_a_record_is_skipped_after_its_retries_and_counts_are_per_record() -> None:
    resets = ResetTracker(max_retries=3)
    assert resets.skip(0, 7) is None
    assert [resets.record_failed(0, 7, "TypeError('x')") for _ in range(2)] == [1, 2]
    # Another poison record in the same uncommitted range keeps its own count: the two cannot
    # take turns resetting each other's count (the partition reopens before both each time).
    assert resets.record_failed(0, 9, "boom") == 1
    assert resets.skip(0, 7) is None and not resets.is_poison(0, 7)
    assert resets.record_failed(0, 7, "TypeError('x')") == 3
    skip = resets.skip(0, 7)
    assert skip is not None and not skip.cut and "3 times in a row" in skip.reason
    assert "TypeError('x')" in skip.reason and resets.is_poison(0, 7)
    assert resets.skip(1, 7) is None  # per partition
    # The dead letter with the original failed too: the next one cuts the original.
    resets.record_failed(0, 7, "MessageSizeTooLargeError()")
    skip = resets.skip(0, 7)
    assert skip is not None and skip.cut
    # Committing past an offset forgets its count; later offsets keep theirs.
    resets.committed(0, 8)
    assert resets.resets(0, 7) == 0 and resets.resets(0, 9) == 1


def test_a_failed_commit_isolates_its_range() -> None:
    resets = ResetTracker()
    resets.commit_failed(2, committed=10, attempted=14)
    assert [resets.isolating(2, o) for o in (10, 11, 13)] == [True, True, True]
    assert not resets.isolating(2, 14) and not resets.isolating(2, 11)  # done: back to batches
    resets.commit_failed(2, committed=5, attempted=5)  # nothing was in it
    assert not resets.isolating(2, 5)
    with pytest.raises(ConfigurationError, match="max-record-retries"):
        ResetTracker(0)


def test_the_owned_partition_dead_letters_a_poison_record() -> None:
    derenderer = derenderer_for(QWEN3_CONFIG)
    (seq,) = generate_sequences(1, seed=2, prefix="poison")
    sink = RecordingSink()
    resets = ResetTracker(max_retries=1)
    task = owned_partition(derenderer, sink)
    task.resets = resets
    resets.record_failed(2, 0, "TypeError('Integer exceeds 64-bit range')")

    async def body() -> None:
        await task.handle(FakeRecord(0, seq.envelopes[0]))
        await task.handle(FakeRecord(1, seq.envelopes[1]))

    asyncio.run(body())
    letter, second = sink.sent
    assert letter.topic == TOPICS.dlq and letter.key == b"poison-00000"
    assert letter.value is not None and second.value is not None
    record = orjson.loads(letter.value)
    assert "poison record" in record["reason"] and "64-bit" in record["reason"]
    assert orjson.loads(record["original"]) == seq.envelopes[0]
    # The skipped first record opened nothing: the second is a sequence gap for its request.
    assert second.topic == TOPICS.output and orjson.loads(second.value)["error"]["code"] == 409
    counters = task.metrics.snapshot()["counters"]
    assert counters["derender.records.poison_skipped"] == 1 and counters["derender.records.gaps"] == 1


def test_a_poison_dead_letter_that_failed_is_cut_and_still_describes_the_whole_record() -> None:
    derenderer = derenderer_for(QWEN3_CONFIG)
    (seq,) = generate_sequences(1, seed=3, prefix="poison")
    sink = RecordingSink()
    resets = ResetTracker(max_retries=1)
    task = owned_partition(derenderer, sink)
    task.resets = resets
    big = {**seq.envelopes[0], "pad": "x" * (400 * 1024)}  # over the cut's 256 KiB
    for _ in range(2):  # its first dead letter failed to send as well
        resets.record_failed(2, 0, "MessageSizeTooLargeError()")
    record = FakeRecord(0, big)
    asyncio.run(task.handle(record))
    (letter,) = sink.sent
    assert letter.topic == TOPICS.dlq and letter.key == b"poison-00000"
    assert letter.value is not None and len(letter.value) <= 256 * 1024
    dead = orjson.loads(letter.value)
    assert dead["truncated"] and dead["key"] == "poison-00000"
    assert dead["original_size"] == len(record.value)
    assert dead["original_sha256"] == hashlib.sha256(record.value).hexdigest()


def test_settings_that_cannot_work_are_refused() -> None:
    run_settings()  # the defaults work
    with pytest.raises(ConfigurationError, match="transaction timeout"):
        run_settings("--commit-interval-ms", "60000")
    with pytest.raises(ConfigurationError, match="transaction timeout"):
        run_settings("--commit-interval-ms", "55000")  # no room left for the commit itself
    run_settings("--commit-interval-ms", "60000", "--mode", "at-least-once")  # no transactions
    with pytest.raises(ConfigurationError, match="rebalance-timeout-ms 8000 is shorter"):
        run_settings("--rebalance-timeout-ms", "8000")
    with pytest.raises(ConfigurationError, match="max-poll-records 5000"):
        run_settings("--max-poll-records", "5000")
    run_settings("--max-poll-records", "5000", "--rebalance-timeout-ms", "90000")


def test_topics_must_accept_what_the_producers_send() -> None:
    def response(**limits: int | None) -> SimpleNamespace:
        rows = []
        for name, value in limits.items():
            entries: list[tuple[str, str, bool, int, bool, list[Any]]] = []
            if value is not None:
                entries = [("max.message.bytes", str(value), False, 5, False, [])]
            rows.append((0 if value is not None else 3, "", 2, name, entries))
        return SimpleNamespace(resources=rows)

    ok = parse_max_message_bytes(
        [response(out=MAX_RECORD_BYTES, state=MAX_RECORD_BYTES, dlq=2 * MAX_RECORD_BYTES)]
    )
    check_record_limits(TOPICS, ok)
    check_record_limits(TOPICS, parse_max_message_bytes([response(out=None)]))  # unreadable: skipped
    small = parse_max_message_bytes([response(out=MAX_RECORD_BYTES, state=1048588, dlq=MAX_RECORD_BYTES)])
    assert small["state"] == 1048588
    with pytest.raises(ConfigurationError, match=r"topic 'state' has max\.message\.bytes=1048588"):
        check_record_limits(TOPICS, small)
    # The input topic is not written by the worker: its limit is the producers' business.
    check_record_limits(TOPICS, {"in": 1, "out": MAX_RECORD_BYTES, "state": MAX_RECORD_BYTES})


def test_resets_feed_the_breaker_and_both_survive_a_revocation() -> None:
    limits = DeadLetterLimits(max_ratio=None, max_consecutive=3)
    worker = new_worker(
        run_settings(),
        ModelSettings(tokenizer="x", max_record_bytes=1024),
        dead_letters=limits,
        resets=ResetTracker(max_retries=5),
    )
    tp = TopicPartition("derender-requests", 3)
    consumer = StubConsumer({tp})
    worker._consumer = consumer

    async def body() -> None:
        for _ in range(2):
            await worker._reset_partition(tp, 40, TypeError("Integer exceeds 64-bit range"))
        assert not worker.dead_letters.is_tripped(3) and worker.resets.resets(3, 40) == 2
        await worker.partitions_revoked({tp})  # a rebalance: nothing is forgotten
        assert worker.resets.resets(3, 40) == 2
        await worker._reset_partition(tp, 40, TypeError("Integer exceeds 64-bit range"))
        assert worker.dead_letters.is_tripped(3)  # three resets in a row
        assert tp in consumer.paused_tps
        report = worker.readiness.check()
        assert not report.ready and "partition reset" in " ".join(report.reasons)
        await worker.partitions_revoked({tp})
        assert worker.dead_letters.is_tripped(3)

    asyncio.run(body())
    assert worker.metrics.counters["derender.partitions.resets_by_record"] == 3


def test_run_passes_the_parser_cap_and_retries_to_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run` once built the worker without --max-live-parsers: the cap never applied."""
    import worker.commands.run as commands_module
    import worker.runtime.worker as worker_module
    from tests.golden_cases import MODELS_DIR
    from worker.cli import main

    made: list[Worker] = []

    class Recorded(Worker):
        async def run(self) -> int:
            made.append(self)
            return 0

    async def reachable(settings: object) -> None:
        pass

    monkeypatch.setattr(worker_module, "Worker", Recorded)
    monkeypatch.setattr(commands_module, "check_reachable", reachable)  # no broker here
    argv = ["run", "--tokenizer", str(MODELS_DIR / "qwen3"), "--bootstrap-servers", "k:1"]
    argv += ["--max-live-parsers", "7", "--max-record-retries", "4", "--metrics-port", "0"]
    assert main(argv) == 0
    (worker,) = made
    assert worker.parsers.capacity == 7 and worker.resets.max_retries == 4


class _FlakySink(RecordingSink):
    """A sink whose sends raise ``errors`` in turn (``None``: that send goes through)."""

    def __init__(self, *errors: BaseException | None) -> None:
        super().__init__()
        self.errors = list(errors)

    async def send(self, record: OutgoingRecord) -> None:
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error
        await super().send(record)


def test_a_poison_skip_is_counted_once_it_is_sent() -> None:
    derenderer = derenderer_for(QWEN3_CONFIG)
    (seq,) = generate_sequences(1, seed=4, prefix="poison")
    resets = ResetTracker(max_retries=1)
    resets.record_failed(2, 0, "TypeError('x')")
    first = owned_partition(derenderer, _FlakySink(RuntimeError("the dead-letter topic refused it")))
    first.resets = resets
    with pytest.raises(RuntimeError):
        asyncio.run(first.handle(FakeRecord(0, seq.envelopes[0])))
    assert first.metrics.counters.get("derender.records.poison_skipped", 0) == 0
    resets.record_failed(2, 0, "RuntimeError('the dead-letter topic refused it')")
    second = owned_partition(derenderer, RecordingSink())
    second.resets, second.metrics = resets, first.metrics  # the worker's, across the reset
    asyncio.run(second.handle(FakeRecord(0, seq.envelopes[0])))
    assert second.metrics.counters["derender.records.poison_skipped"] == 1


def _worker(sink: RecordingSink, limits: DeadLetterLimits, retries: int = 3) -> tuple[Worker, OwnedPartition]:
    """A worker owning partition 2 through a task that writes to ``sink`` (no broker)."""
    worker = new_worker(
        run_settings("--commit-interval-ms", "60000", "--mode", "at-least-once"),
        dead_letters=limits,
        resets=ResetTracker(max_retries=retries),
    )
    task = owned_partition(
        worker.derenderer,
        sink,
        dead_letters=worker.dead_letters,
        resets=worker.resets,
        metrics=worker.metrics,
    )
    worker.tasks[task.tp] = task
    return worker, task


def test_a_poison_commit_is_not_an_isolated_commit() -> None:
    (seq,) = generate_sequences(1, seed=5, prefix="poison")
    sink = RecordingSink()
    worker, task = _worker(sink, DeadLetterLimits(max_ratio=None, max_consecutive=None), retries=1)
    worker.resets.record_failed(2, 0, "TypeError('x')")
    worker._consumer = PollingConsumer(task.tp, [FakeRecord(0, seq.envelopes[0])])
    asyncio.run(worker._step())
    assert len(sink.commits) == 1 and sink.sent[0].topic == TOPICS.dlq  # skipped, committed at once
    assert worker.metrics.counters.get("derender.commits.isolated", 0) == 0


class _BrokenObserver(RecordObserver):
    """Tracing or GenAI metrics that raise on every record."""

    def observe(self, record: Any, result: ProcessResult) -> Headers:
        raise ValueError("exporter broke")

    def expired(self, result: ProcessResult) -> Headers:
        raise ValueError("exporter broke")


def test_a_failing_observer_never_stops_a_partition() -> None:
    derenderer = derenderer_for(QWEN3_CONFIG)
    (seq,) = generate_sequences(1, seed=6, prefix="traced")
    sink = RecordingSink()
    resets = ResetTracker(max_retries=1)
    task = owned_partition(derenderer, sink)
    task.resets, task.observer = resets, _BrokenObserver("g")
    parent = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    resets.record_failed(2, 0, "TypeError('x')")  # offset 0 is a poison record: its skip is observed too
    records = [FakeRecord(0, seq.envelopes[0]), FakeRecord(1, seq.envelopes[1])]
    for record in records:
        record.headers = [("traceparent", parent)]

    async def body() -> int:
        for record in records:
            await task.handle(record)
        return await task.expire(0.0)

    assert asyncio.run(body()) == 0  # the skip opened nothing, the gap record closed nothing
    letter, gap = sink.sent
    assert letter.topic == TOPICS.dlq and gap.topic == TOPICS.output
    # Unobserved, the records still carry the input's trace context on.
    assert letter.headers == gap.headers == (("traceparent", parent),)
    assert task.position == 2 and task.metrics.counters["derender.observer.errors"] == 2
    opened = owned_partition(derenderer, sink)
    opened.observer = task.observer
    asyncio.run(opened.handle(FakeRecord(0, seq.envelopes[0])))
    assert asyncio.run(opened.expire(0.0)) == 1  # the 408 of an expired request goes out unobserved
    assert opened.metrics.counters["derender.observer.errors"] == 2


def test_a_kafka_client_error_is_not_blamed_on_the_record_being_handled() -> None:
    (seq,) = generate_sequences(1, seed=7, prefix="innocent")
    limits = DeadLetterLimits(max_ratio=None, max_consecutive=1)
    errors: list[BaseException] = [
        KafkaClientError("KafkaTimeoutError"),
        DeliveryFailedError("a send failed: an earlier batch's transaction was aborted"),
    ]
    for error in errors:
        worker, task = _worker(_FlakySink(error), limits, retries=1)
        worker._consumer = PollingConsumer(task.tp, [FakeRecord(0, seq.envelopes[0])])
        asyncio.run(worker._step())
        assert task.tp not in worker.tasks  # reset: it reopens and retries the record
        assert worker.resets.resets(2, 0) == 0 and not worker.resets.is_poison(2, 0)
        assert not worker.dead_letters.is_tripped(2) and worker.dead_letters.breaker(2).window_size == 0
        assert worker.metrics.counters["derender.partitions.resets"] == 1
        assert "derender.partitions.resets_by_record" not in worker.metrics.counters
    # Any other error is the record's: it counts towards its retries and the breaker.
    worker, task = _worker(_FlakySink(RuntimeError("bug")), limits, retries=1)
    worker._consumer = PollingConsumer(task.tp, [FakeRecord(0, seq.envelopes[0])])
    asyncio.run(worker._step())
    assert worker.resets.is_poison(2, 0) and worker.dead_letters.is_tripped(2)


class _RefusingSink(RecordingSink):
    """Its commits fail like a transaction that a topic refused."""

    async def commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None:
        raise DeliveryFailedError("a send failed: MessageSizeTooLargeError()")


def test_an_isolated_commit_that_fails_names_its_record_whatever_the_error() -> None:
    (seq,) = generate_sequences(1, seed=8, prefix="culprit")
    worker, task = _worker(_RefusingSink(), DeadLetterLimits(max_ratio=None, max_consecutive=None))
    worker.resets.commit_failed(2, committed=0, attempted=2)  # a failed commit of [0, 2): isolating
    worker._consumer = PollingConsumer(task.tp, [FakeRecord(0, seq.envelopes[0])])
    asyncio.run(worker._step())
    assert worker.resets.resets(2, 0) == 1
    assert worker.metrics.counters["derender.commits.isolated"] == 1


def test_a_range_replayed_after_a_reset_is_observed_by_the_breaker_once() -> None:
    (seq,) = generate_sequences(1, seed=9, prefix="replayed")
    records = [FakeRecord(o, seq.envelopes[o]) for o in range(3)]
    limits = DeadLetterLimits(max_ratio=0.5, window=100, min_records=1, max_consecutive=None)
    worker, task = _worker(_FlakySink(None, None, RuntimeError("bug")), limits)
    worker._consumer = PollingConsumer(task.tp, records)
    asyncio.run(worker._step())  # 0 and 1 go through, 2 resets the partition
    breaker = worker.dead_letters.breaker(2)
    assert task.tp not in worker.tasks and (breaker.window_size, breaker.invalid_in_window) == (3, 1)
    reopened = owned_partition(worker.derenderer, RecordingSink())
    reopened.dead_letters, reopened.resets, reopened.metrics = (
        worker.dead_letters,
        worker.resets,
        worker.metrics,
    )
    worker.tasks[reopened.tp] = reopened
    worker._consumer = PollingConsumer(task.tp, records)
    asyncio.run(worker._step())  # the replay: 0 and 1 again, then 2 goes through
    assert reopened.position == 3
    assert (breaker.window_size, breaker.invalid_in_window) == (4, 1)  # not 6: 0 and 1 count once


class _TopicRefusingSink(RecordingSink):
    """Its output topic refuses ``refused``'s records as too large, at commit (like a broker)."""

    def __init__(self, refused: bytes) -> None:
        super().__init__()
        self.refused = refused
        self.pending: list[OutgoingRecord] = []

    async def send(self, record: OutgoingRecord) -> None:
        self.pending.append(record)

    async def commit(
        self, state_records: Sequence[OutgoingRecord], offsets: dict[TopicPartition, int]
    ) -> None:
        pending, self.pending = self.pending, []
        if any(r.topic == TOPICS.output and r.key == self.refused for r in pending):
            raise RecordTooLargeError("a send failed: MessageSizeTooLargeError()")  # as aiokafka words it
        self.sent += pending
        await super().commit(state_records, offsets)

    async def abort(self) -> None:
        self.pending.clear()


def test_a_record_a_topic_refuses_as_too_large_is_named_by_isolation_and_dead_lettered_cut() -> None:
    fine, refused = generate_sequences(2, seed=10, prefix="sized")
    records = [FakeRecord(0, fine.envelopes[0]), FakeRecord(1, refused.envelopes[0])]
    records.append(FakeRecord(2, fine.envelopes[1]))
    sink = _TopicRefusingSink(refused.request_id.encode())
    worker, task = _worker(sink, DeadLetterLimits(max_ratio=None, max_consecutive=None))

    def step(position: int) -> OwnedPartition:
        current = worker.tasks.get(task.tp)
        if current is None:  # reopen it, as _heal would, at its committed offset
            current = owned_partition(worker.derenderer, sink)
            current.dead_letters, current.resets = worker.dead_letters, worker.resets
            current.metrics = worker.metrics
            current.position = current.committed_position = position
            worker.tasks[task.tp] = current
        worker._consumer = PollingConsumer(task.tp, records[position:])
        asyncio.run(worker._step())
        return current

    step(0)  # the batch's commit fails: its culprit is unknown
    assert sink.commits == [] and worker.resets.resets(2, 1) == 0
    step(0)  # isolating: offset 0 commits alone, offset 1's commit fails the same way
    assert [offsets for _, offsets in sink.commits] == [{task.tp: 1}]
    assert worker.resets.resets(2, 1) == 1 and worker.resets.is_poison(2, 1)
    last = step(1)  # skipped at once (not after --max-record-retries), then isolation goes on
    assert last.position == 3 and [offsets for _, offsets in sink.commits][1:] == [{task.tp: 2}, {task.tp: 3}]
    (letter,) = [r for r in sink.sent if r.topic == TOPICS.dlq]
    assert letter.value is not None and len(letter.value) <= 256 * 1024
    dead = orjson.loads(letter.value)
    assert "too large for its topic" in dead["reason"] and "MessageSizeTooLargeError" in dead["reason"]
    assert letter.key == refused.request_id.encode()
    counters = worker.metrics.counters
    assert counters["derender.records.dead_lettered"] == counters["derender.records.poison_skipped"] == 1
    assert counters["derender.commits.isolated"] == 4  # 0, 1 (failed), 1 (its dead letter), 2
