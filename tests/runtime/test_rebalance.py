"""Broker-free tests of group membership: the settings, each backend's consumer configuration,
the librdkafka rebalance callbacks (against a fake of its consumer) and the worker's partial
revocation. The broker tests are in ``tests/kafka/test_rebalance.py``."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from confluent_kafka import OFFSET_END, Consumer
from confluent_kafka import TopicPartition as LibTopicPartition

from tests.kafka_helpers import generate_sequences
from tests.partition_fakes import StubConsumer, changelog_for, run_settings
from tests.runtime.worker_fakes import FakeTransactionalProducer, handle_record, new_worker, per_worker_tasks
from worker.cli import main
from worker.errors import ConfigurationError
from worker.runtime.composition import new_processor
from worker.runtime.delivery import COMMIT_LINGER_MS, PRODUCER_LINGER_MS, TransactionalSink
from worker.runtime.kafka_client import aiokafka_backend, confluent_backend
from worker.runtime.kafka_client.base import (
    AssignmentStrategy,
    ConsumerConfig,
    GroupProtocol,
    Partitions,
    RebalanceCallbacks,
    TopicPartition,
)
from worker.runtime.lifecycle import WorkerState
from worker.runtime.observability.metrics import Metrics
from worker.runtime.partition import OwnedPartition
from worker.runtime.worker import FETCH_BATCH_BYTES, FETCH_BATCH_WAIT_MS, Worker
from worker.settings import ModelSettings, pod_name

TOPIC = "in"


def _config(**changes: Any) -> ConsumerConfig:
    base: dict[str, Any] = {
        "bootstrap_servers": "k:9092",
        "client_id": "c",
        "group_id": "g",
        "session_timeout_ms": 10_000,
        "rebalance_timeout_ms": 30_000,
        "heartbeat_interval_ms": 2_500,
        "max_poll_records": 500,
        "metadata_max_age_ms": 10_000,
    }
    return ConsumerConfig(**{**base, **changes})


# --- settings -----------------------------------------------------------------------------------


def test_defaults_are_incremental_classic_and_not_static(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("POD_NAME", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(env, raising=False)
    settings = run_settings()
    assert settings.partition_assignment_strategy is AssignmentStrategy.COOPERATIVE_STICKY
    assert settings.group_protocol is GroupProtocol.CLASSIC
    assert settings.group_instance_id is None


def test_the_instance_id_defaults_to_the_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("POD_NAME", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("HOSTNAME", "laptop")
    assert pod_name() is None  # outside Kubernetes a host name is no worker's identity
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert pod_name() == "laptop"  # in a pod, HOSTNAME is the pod name
    monkeypatch.setenv("POD_NAME", "derender-worker-3")
    assert pod_name() == "derender-worker-3"
    assert run_settings().group_instance_id == "derender-worker-3"
    assert run_settings("--group-instance-id", "off").group_instance_id is None
    assert run_settings("--group-instance-id", "w-1").group_instance_id == "w-1"


def test_the_kip848_protocol_is_refused_where_it_cannot_work() -> None:
    with pytest.raises(ConfigurationError, match="needs --kafka-client confluent"):
        run_settings("--group-protocol", "consumer", "--kafka-client", "aiokafka")
    with pytest.raises(ConfigurationError, match="assigns on the broker"):
        run_settings("--group-protocol", "consumer", "--partition-assignment-strategy", "range")
    assert run_settings("--group-protocol", "consumer").group_protocol is GroupProtocol.CONSUMER
    argv = ["run", "--tokenizer", "x", "--bootstrap-servers", "k:1", "--group-protocol", "consumer"]
    assert main([*argv, "--kafka-client", "aiokafka"]) == 2  # a configuration error


# --- each backend's consumer configuration ------------------------------------------------------


def test_librdkafka_classic_protocol_takes_the_client_side_settings() -> None:
    settings = confluent_backend.consumer_settings(_config(group_instance_id="pod-1"))
    assert settings["partition.assignment.strategy"] == "cooperative-sticky"
    assert (settings["session.timeout.ms"], settings["heartbeat.interval.ms"]) == (10_000, 2_500)
    assert settings["group.instance.id"] == "pod-1" and "group.protocol" not in settings
    eager = confluent_backend.consumer_settings(_config(assignment_strategy=AssignmentStrategy.ROUNDROBIN))
    assert eager["partition.assignment.strategy"] == "roundrobin" and "group.instance.id" not in eager
    assert confluent_backend.incremental(_config()) and not confluent_backend.incremental(
        _config(assignment_strategy=AssignmentStrategy.RANGE)
    )


def test_librdkafka_kip848_leaves_assignment_and_session_to_the_broker() -> None:
    config = _config(group_protocol=GroupProtocol.CONSUMER)
    settings = confluent_backend.consumer_settings(config)
    assert settings["group.protocol"] == "consumer"
    for refused in ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms"):
        assert refused not in settings
    assert confluent_backend.incremental(config)
    Consumer(settings).close()  # librdkafka accepts the configuration (it connects lazily)


def test_aiokafka_falls_back_to_its_eager_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        options = aiokafka_backend.consumer_options(_config(group_instance_id="pod-1"), {})
    assert options["partition_assignment_strategy"] == (RoundRobinPartitionAssignor,)
    assert "no cooperative-sticky" in caplog.text
    assert options["group_instance_id"] == "pod-1"  # aiokafka has static membership (KIP-345)
    ranged = aiokafka_backend.consumer_options(_config(assignment_strategy=AssignmentStrategy.RANGE), {})
    assert ranged["partition_assignment_strategy"] == (RangePartitionAssignor,)


def test_both_backends_map_the_fetch_settings() -> None:
    held = _config(fetch_min_bytes=FETCH_BATCH_BYTES, fetch_max_wait_ms=FETCH_BATCH_WAIT_MS)
    librdkafka = confluent_backend.consumer_settings(held)
    assert librdkafka["fetch.min.bytes"] == FETCH_BATCH_BYTES
    assert librdkafka["fetch.wait.max.ms"] == FETCH_BATCH_WAIT_MS
    Consumer(librdkafka).close()  # accepted (it connects lazily)
    aio = aiokafka_backend.consumer_options(held, {})
    assert (aio["fetch_min_bytes"], aio["fetch_max_wait_ms"]) == (FETCH_BATCH_BYTES, FETCH_BATCH_WAIT_MS)
    assert aiokafka_backend.consumer_options(_config(), {})["fetch_max_wait_ms"] == 500  # the default


def test_only_librdkafka_exactly_once_workers_batch_under_the_commit() -> None:
    """``Worker._batches_under_commit``: held fetches and a long linger for transactional sends."""
    model = ModelSettings(tokenizer="x", max_record_bytes=1024)

    def worker(*argv: str) -> Worker:
        return new_worker(run_settings(*argv), model)

    batching = worker()  # confluent, exactly-once, 100 ms commits
    config = batching._consumer_config()
    assert (config.fetch_min_bytes, config.fetch_max_wait_ms) == (FETCH_BATCH_BYTES, FETCH_BATCH_WAIT_MS)
    assert batching._producer_config("c", transactional=True).linger_ms == COMMIT_LINGER_MS
    assert batching._producer_config("c").linger_ms == PRODUCER_LINGER_MS
    # At most a tenth of the commit interval.
    assert worker("--commit-interval-ms", "40")._consumer_config().fetch_max_wait_ms == 4
    # Outputs visible on send; aiokafka's flush before a commit waits a linger out.
    for others in (worker("--mode", "at-least-once"), worker("--kafka-client", "aiokafka")):
        config = others._consumer_config()
        assert (config.fetch_min_bytes, config.fetch_max_wait_ms) == (1, 500)
        assert others._producer_config("c", transactional=True).linger_ms == PRODUCER_LINGER_MS


# --- librdkafka's rebalance callbacks -----------------------------------------------------------


class FakeLibConsumer:
    """The calls the callbacks make on librdkafka's consumer."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    def _record(self, name: str, partitions: list[LibTopicPartition] | None = None) -> None:
        self.calls.append((name, sorted(tp.partition for tp in partitions or [])))

    def assign(self, partitions: list[LibTopicPartition]) -> None:
        self._record("assign", partitions)

    def incremental_assign(self, partitions: list[LibTopicPartition]) -> None:
        self._record("incremental_assign", partitions)

    def unassign(self) -> None:
        self._record("unassign")

    def incremental_unassign(self, partitions: list[LibTopicPartition]) -> None:
        self._record("incremental_unassign", partitions)

    def pause(self, partitions: list[LibTopicPartition]) -> None:
        self._record("pause", partitions)

    def resume(self, partitions: list[LibTopicPartition]) -> None:
        self._record("resume", partitions)

    def offsets_for_times(self, partitions: list[LibTopicPartition], timeout: float) -> None:
        # The wake-up asks for the partitions' ends (a timestamp of -1).
        assert {tp.offset for tp in partitions} == {OFFSET_END}
        self._record("wake", partitions)


def _lib(*partitions: int) -> list[LibTopicPartition]:
    return [LibTopicPartition(TOPIC, p) for p in partitions]


def _tps(*partitions: int) -> set[TopicPartition]:
    return {TopicPartition(TOPIC, p) for p in partitions}


def _callbacks(config: ConsumerConfig) -> tuple[list[tuple[str, Partitions]], FakeLibConsumer, list[str]]:
    """Assign 0-3, then revoke 0 and 1, then assign 1 back, as librdkafka would on its thread."""
    consumer = confluent_backend.ConfluentConsumer(config)
    seen: list[tuple[str, Partitions]] = []

    def recorder(name: str) -> Any:
        async def callback(partitions: Partitions) -> None:
            seen.append((name, set(partitions)))

        return callback

    consumer.subscribe([TOPIC], RebalanceCallbacks(recorder("assign"), recorder("revoke"), recorder("lost")))
    lib = FakeLibConsumer()
    assignments: list[str] = []

    async def callback(call: Any, partitions: list[LibTopicPartition]) -> None:
        await asyncio.to_thread(call, lib, partitions)
        await consumer._wake_thread.run(lambda: None)  # the wake-ups it submitted have run

    async def rebalance() -> None:
        consumer._loop = asyncio.get_running_loop()
        await callback(consumer._assigned_cb, _lib(0, 1, 2, 3))
        assignments.append(f"{sorted(consumer.assignment())} opening {sorted(consumer._opening)}")
        consumer._opening = set()  # as poll's open would
        await callback(consumer._revoked_cb, _lib(0, 1))
        assignments.append(f"{sorted(consumer.assignment())}")
        await callback(consumer._assigned_cb, _lib(1))
        assignments.append(f"{sorted(consumer.assignment())} opening {sorted(consumer._opening)}")

    try:
        asyncio.run(rebalance())
    finally:
        consumer._consumer.close()
    return seen, lib, assignments


def test_cooperative_callbacks_touch_only_the_moved_partitions() -> None:
    seen, lib, assignments = _callbacks(_config())
    assert lib.calls == [
        ("incremental_assign", [0, 1, 2, 3]),
        ("pause", [0, 1, 2, 3]),  # until poll has opened them
        ("incremental_unassign", [0, 1]),  # 2 and 3 go on being fetched
        ("wake", [2, 3]),  # librdkafka resumed them: fetch them now, not up to a second later
        ("incremental_assign", [1]),
        ("pause", [1]),
        ("wake", [2, 3]),  # paused again during this callback, and resumed
    ]
    assert seen == [("revoke", _tps(0, 1))]  # assign's worker callback runs in poll
    kept = [TopicPartition(TOPIC, p) for p in (2, 3)]
    every = [TopicPartition(TOPIC, p) for p in (0, 1, 2, 3)]
    assert assignments == [
        f"{every} opening {every}",
        f"{kept}",
        f"{sorted(_tps(1, 2, 3))} opening {sorted(_tps(1))}",
    ]


def test_eager_callbacks_replace_the_whole_assignment() -> None:
    seen, lib, assignments = _callbacks(_config(assignment_strategy=AssignmentStrategy.RANGE))
    assert seen == [("revoke", _tps(0, 1))]
    # Nothing is kept, so nothing to wake here (poll wakes new partitions once it has opened them).
    assert [name for name, _ in lib.calls] == ["assign", "pause", "unassign", "assign", "pause"]
    assert assignments[1] == "[]" and assignments[2].startswith(f"{sorted(_tps(1))} opening")


def test_partitions_resumed_after_their_open_are_woken_unless_paused() -> None:
    """poll opens new partitions, then resumes them: a resume wakes no fetcher by itself."""
    consumer = confluent_backend.ConfluentConsumer(_config())
    real, lib = consumer._consumer, FakeLibConsumer()
    opened: list[Partitions] = []

    async def on_assign(partitions: Partitions) -> None:
        opened.append(set(partitions))

    async def unused(partitions: Partitions) -> None:
        raise AssertionError("not called")

    async def open_them() -> None:
        consumer._callbacks = (on_assign, unused, unused)
        consumer._consumer = lib  # type: ignore[assignment]  # the calls _open_assigned makes
        consumer._assigned = consumer._opening = _tps(1, 2, 3)
        consumer._paused = _tps(3)  # its breaker tripped: it stays paused
        await consumer._open_assigned()
        await consumer._wake_thread.run(lambda: None)

    try:
        asyncio.run(open_them())
    finally:
        real.close()
    assert opened == [_tps(1, 2, 3)]
    assert lib.calls == [("resume", [1, 2]), ("wake", [1, 2])]


def test_a_resume_fetches_an_open_partition_again_but_not_one_still_opening() -> None:
    """ingest pauses every partition while its backlog is full and resumes them after: a partition
    assigned meanwhile is not yet open and must stay paused until its open resumes it."""
    consumer = confluent_backend.ConfluentConsumer(_config())
    real, lib = consumer._consumer, FakeLibConsumer()

    async def pause_resume() -> None:
        consumer._consumer = lib  # type: ignore[assignment]  # the calls pause and resume make
        consumer._assigned = _tps(1, 2)
        consumer._opening = _tps(2)
        for tp in sorted(_tps(1, 2)):
            consumer.pause(tp)
        for tp in sorted(_tps(1, 2)):
            consumer.resume(tp)
        await consumer._wake_thread.run(lambda: None)

    try:
        asyncio.run(pause_resume())
    finally:
        real.close()
    assert lib.calls == [("pause", [1]), ("pause", [2]), ("resume", [1]), ("wake", [1])]
    assert consumer.paused() == set()  # 2 is resumed by its open (unless paused again by then)


def test_a_wake_up_holds_up_no_callback_and_none_meets_a_closing_consumer() -> None:
    """The wake-ups run on their own thread; stop() lets the one under way end, skips the queued
    ones and only then closes librdkafka's consumer. Partitions the worker paused are not woken."""
    consumer = confluent_backend.ConfluentConsumer(_config())
    release = threading.Event()
    returned: list[str] = []

    class SlowLeader(FakeLibConsumer):
        def offsets_for_times(self, partitions: list[LibTopicPartition], timeout: float) -> None:
            # Released only after both callbacks returned: one that waited for it fails here.
            if not release.wait(2):
                raise AssertionError("a rebalance callback waited for its wake-up")
            super().offsets_for_times(partitions, timeout)

    lib = SlowLeader()

    async def revoked(partitions: Partitions) -> None:
        pass

    async def run() -> None:
        consumer._loop = asyncio.get_running_loop()
        consumer._callbacks = (revoked, revoked, revoked)
        consumer._assigned = _tps(0, 1, 2, 3)
        consumer._paused = _tps(3)  # its breaker tripped: it stays paused
        await asyncio.to_thread(consumer._revoked_cb, lib, _lib(0))  # wakes 1 and 2, then waits
        returned.append("first revocation")
        await asyncio.to_thread(consumer._revoked_cb, lib, _lib(1))  # queued behind it
        returned.append("second revocation")
        stopping = asyncio.ensure_future(consumer.stop())
        await asyncio.sleep(0.05)
        assert not stopping.done()  # waits for the wake-up under way
        release.set()
        await stopping

    asyncio.run(run())
    assert returned == ["first revocation", "second revocation"]  # neither waited for the leader
    assert [call for call in lib.calls if call[0] == "wake"] == [("wake", [1, 2])]


# --- the worker: a partial revocation -----------------------------------------------------------


def _running(worker: Worker) -> None:
    worker.lifecycle.to(WorkerState.STARTING)
    worker.lifecycle.to(WorkerState.RUNNING)


def _state(worker: Worker) -> WorkerState:
    return worker.lifecycle.state


def test_a_partial_revocation_commits_the_shared_transaction_whole() -> None:
    """Per-worker transactions: partition 2 stays with uncommitted work while 1 (idle) is revoked.
    Closing 1's sink must not abort 2's outputs: the revocation commits the transaction whole."""
    (sequence,) = generate_sequences(1, seed=5, prefix="kept")
    producer = FakeTransactionalProducer()
    worker, (one, two) = per_worker_tasks(producer)
    _running(worker)
    handle_record(two, 0, sequence.envelopes[0])
    asyncio.run(worker.partitions_revoked({one.tp}))
    consumer = worker._consumer
    assert isinstance(consumer, StubConsumer)
    consumer.assigned = {two.tp}  # as librdkafka's incremental_unassign leaves it
    assert producer.calls == ["begin", "commit"]  # no abort
    assert producer.commits[0][0] == {two.tp: 1}
    assert set(worker.tasks) == {two.tp} and not two.needs_commit
    assert worker.lifecycle.state is WorkerState.RUNNING  # the kept partition keeps flowing
    asyncio.run(worker.partitions_revoked({two.tp}))
    assert worker.tasks == {} and _state(worker) is WorkerState.REBALANCING  # none left


def test_a_partial_revocation_commits_only_the_revoked_partitions_transactions() -> None:
    a, b = generate_sequences(2, seed=6, prefix="own")
    settings = run_settings("--transactional-id-mode", "per-partition")
    worker = new_worker(settings)
    _running(worker)
    producers = {}
    for partition in (1, 2):
        tp = TopicPartition(TOPIC, partition)
        producers[partition] = FakeTransactionalProducer()
        sink = TransactionalSink(producers[partition], lambda: "group-metadata", Metrics())
        worker.tasks[tp] = OwnedPartition(
            tp,
            new_processor(worker.model, worker.derenderer),
            sink,
            settings.topics,
            Metrics(),
            position=0,
            changelog=changelog_for(tp, settings.topics),
        )
    worker._consumer = StubConsumer(set(worker.tasks))
    one, two = worker.tasks[TopicPartition(TOPIC, 1)], worker.tasks[TopicPartition(TOPIC, 2)]
    handle_record(one, 0, a.envelopes[0])
    handle_record(two, 0, b.envelopes[0])
    asyncio.run(worker.partitions_revoked({one.tp}))
    assert producers[1].commits and producers[1].commits[0][0] == {one.tp: 1}
    assert producers[2].calls == ["begin"] and two.needs_commit  # untouched: commits at its interval
    assert set(worker.tasks) == {two.tp} and worker.lifecycle.state is WorkerState.RUNNING


def test_a_kept_partition_that_is_resetting_keeps_the_worker_running() -> None:
    """A kept partition whose commit failed mid-rebalance has no task until ``_heal`` reopens it;
    revoking every partition with a task must not park the worker in ``rebalancing`` (which stops
    healing) when no new assignment follows, as with cooperative-sticky."""
    worker, (one, two) = per_worker_tasks(FakeTransactionalProducer())
    _running(worker)
    consumer = worker._consumer
    assert isinstance(consumer, StubConsumer)
    consumer.assigned = {one.tp, two.tp, TopicPartition(TOPIC, 3)}  # 3: reset, reopened by _heal
    asyncio.run(worker.partitions_revoked({one.tp, two.tp}))
    assert worker.tasks == {} and _state(worker) is WorkerState.RUNNING


def test_per_partition_offsets_name_the_group_alone() -> None:
    """Per-partition sinks send offsets without a generation (their transactional ids fence), so a
    kept partition's commit cannot race an incremental rebalance's generation bump."""
    consumer = confluent_backend.ConfluentConsumer(_config(group_instance_id="pod-1"))
    try:
        metadata = consumer.group_id_metadata()
    finally:
        consumer._consumer.close()
    # Generation -1, group "g", no member, no instance id (a static member's would be checked).
    assert metadata == b"CGMDv2:\xff\xff\xff\xffg\x00\x00\x01"
    worker = new_worker(run_settings("--transactional-id-mode", "per-partition"))

    class _Group:
        def group_id_metadata(self) -> object:
            return "the group alone"

        def group_metadata(self) -> object:
            return "with a generation"

    worker._consumer = _Group()
    assert worker._group_id_metadata() == "the group alone"
