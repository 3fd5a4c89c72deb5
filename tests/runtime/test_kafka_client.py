"""Broker-free tests of the Kafka client layer: error mapping, librdkafka settings, the modes.

The data path itself (both backends, both transactional-id modes) runs against the real broker
in ``tests/kafka/test_worker.py`` and ``tests/kafka/test_poison.py``; here only what needs no broker.
"""

from __future__ import annotations

import asyncio
import threading

import aiokafka.errors as aioerrors
import confluent_kafka
import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import KafkaError as LibKafkaError
from confluent_kafka import KafkaException

from tests.async_helpers import run_bounded
from tests.kafka_helpers import generate_sequences
from tests.partition_fakes import TOPICS, run_settings
from tests.runtime.worker_fakes import FakeTransactionalProducer, handle_record, per_worker_tasks
from worker.cli import build_parser, main
from worker.errors import (
    ConfigurationError,
    DeliveryFailedError,
    DerenderWorkerError,
    GroupRejectedError,
    KafkaClientError,
    KafkaUnreachableError,
    PartitionNotAssignedError,
    ProducerFencedError,
    RecordTooLargeError,
)
from worker.pipeline.connection import Connection
from worker.runtime import worker as worker_module
from worker.runtime.dead_letters.replay import ReplayOptions
from worker.runtime.delivery import producer_config
from worker.runtime.kafka_client import aiokafka_backend, confluent_backend
from worker.runtime.kafka_client.base import (
    CompressionType,
    OutgoingRecord,
    ProducerConfig,
    TopicPartition,
)
from worker.runtime.security.kafka_oauth import OidcClientCredentials
from worker.runtime.security.kafka_security import KafkaSecurity, SaslMechanism, Secret, SecurityProtocol
from worker.runtime.state.changelog import StateChangelog, StateKeys
from worker.runtime.worker import refused_as_too_large
from worker.settings import ProducerSettings

# --- errors: both libraries into the one hierarchy ---------------------------------------------


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (aioerrors.KafkaConnectionError("no broker"), KafkaUnreachableError),
        (aioerrors.ProducerFenced(), ProducerFencedError),
        (aioerrors.MessageSizeTooLargeError(), RecordTooLargeError),
        (aioerrors.RecordListTooLargeError(), RecordTooLargeError),
        (aioerrors.IllegalStateError(), PartitionNotAssignedError),
        (aioerrors.InvalidSessionTimeoutError(), GroupRejectedError),
        (aioerrors.KafkaTimeoutError(), KafkaClientError),
    ],
)
def test_aiokafka_errors_map_into_the_hierarchy(error: aioerrors.KafkaError, expected: type) -> None:
    mapped = aiokafka_backend.translate(error)
    assert type(mapped) is expected and isinstance(mapped, DerenderWorkerError)
    with pytest.raises(expected) as raised, aiokafka_backend.mapped_errors():
        raise error
    assert raised.value.__cause__ is error


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (LibKafkaError._TRANSPORT, KafkaUnreachableError),
        (LibKafkaError._FENCED, ProducerFencedError),
        (LibKafkaError.PRODUCER_FENCED, ProducerFencedError),
        (LibKafkaError.MSG_SIZE_TOO_LARGE, RecordTooLargeError),
        (LibKafkaError._STATE, PartitionNotAssignedError),
        (LibKafkaError.GROUP_AUTHORIZATION_FAILED, GroupRejectedError),
        (LibKafkaError._TIMED_OUT, KafkaClientError),
    ],
)
def test_librdkafka_errors_map_into_the_hierarchy(code: int, expected: type) -> None:
    mapped = confluent_backend.translate(LibKafkaError(code))
    assert type(mapped) is expected and isinstance(mapped, DerenderWorkerError)


def test_group_rejections_name_their_flag_with_either_backend() -> None:
    from worker.runtime.worker import configuration_error

    settings = run_settings("--session-timeout-ms", "3000")
    for error in (
        aiokafka_backend.translate(aioerrors.InvalidSessionTimeoutError()),
        confluent_backend.translate(LibKafkaError(LibKafkaError.INVALID_SESSION_TIMEOUT)),
    ):
        message = str(configuration_error(error, settings))
        assert "--session-timeout-ms 3000" in message
    too_large = RecordTooLargeError("refused")
    wrapped = KafkaClientError("commit failed")
    wrapped.__cause__ = too_large
    assert refused_as_too_large(wrapped) and not refused_as_too_large(KafkaClientError("x"))


# --- librdkafka's security settings ------------------------------------------------------------


def test_security_maps_to_librdkafka_settings() -> None:
    scram = KafkaSecurity(
        protocol=SecurityProtocol.SASL_SSL,
        sasl_mechanism=SaslMechanism.SCRAM_SHA_512,
        sasl_username="svc",
        sasl_password=Secret("pw"),
        ssl_cafile="ca.pem",
        ssl_check_hostname=False,
    )
    assert confluent_backend.security_config(scram) == {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": "ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "svc",
        "sasl.password": "pw",
    }
    oidc = KafkaSecurity(
        protocol=SecurityProtocol.SASL_SSL,
        sasl_mechanism=SaslMechanism.OAUTHBEARER,
        oauth=OidcClientCredentials("https://idp/token", "cid", Secret("s3"), "kafka"),
    )
    config = confluent_backend.security_config(oidc)
    # Our token provider through oauth_cb (test_kafka_oauth.py fetches through it); no secret in the config.
    assert config["sasl.mechanism"] == "OAUTHBEARER" and callable(config["oauth_cb"])
    assert not any(key.startswith("sasl.oauthbearer") for key in config)
    assert config["ssl.endpoint.identification.algorithm"] == "https"
    msk = KafkaSecurity(
        protocol=SecurityProtocol.SASL_SSL, sasl_mechanism=SaslMechanism.AWS_MSK_IAM, aws_region="eu-west-1"
    )
    config = confluent_backend.security_config(msk)
    assert config["sasl.mechanism"] == "OAUTHBEARER" and callable(config["oauth_cb"])
    assert confluent_backend.security_config(KafkaSecurity()) == {"security.protocol": "PLAINTEXT"}


# --- compression: --compression-type reaches both libraries' producers ----------------------------


@pytest.mark.parametrize("codec", list(CompressionType), ids=lambda c: c.value)
def test_compression_type_reaches_both_backends(codec: CompressionType) -> None:
    config = producer_config(run_settings("--compression-type", codec.value), "c")
    assert config.compression is codec
    aio = aiokafka_backend.producer_options(config, {})
    assert aio["compression_type"] == (None if codec is CompressionType.NONE else codec.value)
    librdkafka = confluent_backend.producer_config(config)
    assert librdkafka["compression.type"] == codec.value

    # Each library takes the codec (aiokafka refuses one whose codec library is missing, librdkafka
    # an unknown name) when the producer is built; neither connects here.
    async def build() -> None:
        await AIOKafkaProducer(**aio).stop()

    asyncio.run(build())
    confluent_kafka.Producer(librdkafka).flush(0)


def test_librdkafka_hashes_keys_as_java_clients_and_aiokafka() -> None:
    """murmur2, not librdkafka's CRC32 default (``tests/kafka/test_placement.py`` checks the
    partitions on a broker)."""
    config = confluent_backend.producer_config(producer_config(run_settings(), "c"))
    assert config["partitioner"] == "murmur2_random"


def test_dlq_replay_produces_with_the_compression_type() -> None:
    argv = ["dlq", "replay", "--bootstrap-servers", "k:9092", "--compression-type", "zstd"]
    options = ReplayOptions.from_args(build_parser().parse_args(argv))
    assert options.producer.compression is CompressionType.ZSTD


@pytest.mark.parametrize(
    "argv",
    [["produce", "-", "--topic", "t"], ["ingest"], ["gateway"]],
    ids=lambda argv: argv[0],
)
def test_pipeline_commands_produce_with_the_compression_type(argv: list[str]) -> None:
    """The pipeline's producers take --compression-type as the worker's do, with the same default."""
    base = [*argv, "--bootstrap-servers", "k:9092"]
    default = Connection.from_args(build_parser().parse_args(base), "t")
    assert default.compression is ProducerSettings().compression_type
    chosen = Connection.from_args(build_parser().parse_args([*base, "--compression-type", "gzip"]), "t")
    assert chosen.compression is CompressionType.GZIP

    async def build() -> None:
        producer = chosen.producer()  # built, never started: no connection
        try:
            assert producer._compression_type == "gzip"
        finally:
            await producer.stop()

    asyncio.run(build())
    consume = build_parser().parse_args(["consume", "--topic", "t", "--bootstrap-servers", "k:9092"])
    assert "compression_type" not in vars(consume)
    assert (
        Connection.from_args(consume, "t").compression is ProducerSettings().compression_type
    )  # read, never used: consume sends nothing


# --- modes: refused where they cannot work ------------------------------------------------------


def test_per_worker_transactions_need_kip447() -> None:
    with pytest.raises(ConfigurationError, match="per-worker needs KIP-447"):
        run_settings("--transactional-id-mode", "per-worker", "--kafka-client", "aiokafka")
    settings = run_settings("--transactional-id-mode", "per-worker", "--kafka-client", "confluent")
    assert settings.per_worker_transactions
    # The shorter per-worker transaction timeout bounds the commit interval.
    with pytest.raises(ConfigurationError, match="transaction timeout of 15000 ms"):
        run_settings(
            "--transactional-id-mode",
            "per-worker",
            "--kafka-client",
            "confluent",
            "--commit-interval-ms",
            "6000",
        )
    argv = ["run", "--tokenizer", "x", "--bootstrap-servers", "k:1", "--transactional-id-mode", "per-worker"]
    assert main([*argv, "--kafka-client", "aiokafka"]) == 2


# --- per-worker transactions: one commit for every partition -----------------------------------


def test_per_worker_mode_commits_every_partition_in_one_transaction() -> None:
    a, b = generate_sequences(2, seed=3, prefix="shared")
    producer = FakeTransactionalProducer()
    worker, (one, two) = per_worker_tasks(producer)
    handle_record(one, 0, a.envelopes[0])
    handle_record(two, 0, b.envelopes[0])
    handle_record(two, 1, b.envelopes[1])
    asyncio.run(worker._commit_all())
    assert producer.calls == ["begin", "commit"]  # one transaction for both partitions
    offsets, group = producer.commits[0]
    assert offsets == {one.tp: 1, two.tp: 2} and group == "group-metadata"
    state = [r for r in producer.sent if r.topic == TOPICS.state]
    assert {r.partition for r in state} == {1, 2}  # each partition's state in its own state partition
    assert not one.needs_commit and not two.needs_commit


def test_per_worker_reset_takes_every_partition_with_uncommitted_work() -> None:
    a, b = generate_sequences(2, seed=4, prefix="shared")
    producer = FakeTransactionalProducer()
    worker, (one, two) = per_worker_tasks(producer)
    handle_record(one, 0, a.envelopes[0])
    handle_record(two, 0, b.envelopes[0])
    asyncio.run(worker._reset_partition(one.tp, 0, TypeError("a bug")))
    # The abort discarded partition 2's outputs too: both reopen from committed state.
    assert producer.calls == ["begin", "abort"] and worker.tasks == {}
    assert worker.resets.resets(1, 0) == 1 and worker.resets.resets(2, 0) == 0  # only 1 is blamed
    # A failed shared commit resets both, blaming neither record.
    producer = FakeTransactionalProducer(fail_commit=KafkaClientError("coordinator moved"))
    worker, (one, two) = per_worker_tasks(producer)
    handle_record(one, 0, a.envelopes[0])
    handle_record(two, 0, b.envelopes[0])
    asyncio.run(worker._commit_all())
    assert worker.tasks == {} and producer.calls == ["begin", "commit", "abort"]
    assert worker.resets.resets(1, 0) == 0 and worker.resets.resets(2, 0) == 0


def test_a_failed_isolating_shared_commit_resets_a_partition_whose_only_work_was_a_checkpoint() -> None:
    """The commit took partition 2's due checkpoint too (its changelog now believes it written), so
    the abort must reset partition 2 as well: kept, its later replay-from marker would skip records
    the lost checkpoint held, and a restore would rebuild the request wrong."""
    a, b = generate_sequences(2, seed=8, prefix="shared")
    producer = FakeTransactionalProducer()
    worker, (one, two) = per_worker_tasks(producer)
    now = [1000.0]
    two.changelog = StateChangelog(
        TOPICS.state, 2, StateKeys("g"), checkpoint_interval_s=10.0, clock=lambda: now[0]
    )
    handle_record(two, 0, b.envelopes[0])
    asyncio.run(worker._commit_all())  # the request's context
    handle_record(two, 1, b.envelopes[1])
    asyncio.run(worker._commit_all())  # its progress deferred to the checkpoint interval
    assert not two.needs_commit
    now[0] += 10.0
    assert two.needs_commit  # the deferred checkpoint is due: nothing else
    handle_record(one, 0, a.envelopes[0])
    producer.fail_commit = RecordTooLargeError("refused as too large")

    async def isolate() -> None:  # as Worker._step's commit of a record alone, and its reset
        with pytest.raises(RecordTooLargeError) as failed:
            await worker._commit_shared([one], raise_errors=True)
        await worker._reset_partition(one.tp, 0, failed.value, too_large=True)

    asyncio.run(isolate())
    assert producer.calls[-2:] == ["commit", "abort"]
    assert worker.tasks == {}  # both reopen from committed state
    assert worker.resets.resets(1, 0) == 1 and worker.resets.resets(2, 1) == 0  # only 1 is blamed


class _Client:
    """Hands out fresh fake producers (the worker's ``KafkaClient``, producers only)."""

    def __init__(self) -> None:
        self.made: list[FakeTransactionalProducer] = []

    def transactional_producer(self, config: object, transactional_id: str) -> FakeTransactionalProducer:
        producer = FakeTransactionalProducer()
        producer.transactional_id = transactional_id
        self.made.append(producer)
        return producer


def test_a_fenced_shared_producer_is_replaced() -> None:
    # Fenced for good (the broker timed the transaction out, or the id was taken over): left as it
    # is, every later send of every partition would fail and the worker stop making progress.
    (a,) = generate_sequences(1, seed=5, prefix="shared")
    fenced = FakeTransactionalProducer(fail_commit=ProducerFencedError("fenced by a newer instance"))
    worker, (one, two) = per_worker_tasks(fenced)
    client = _Client()
    worker._client = client  # type: ignore[assignment]  # producers only
    handle_record(one, 0, a.envelopes[0])
    asyncio.run(worker._commit_all())
    assert worker.tasks == {two.tp: two} and fenced.calls == ["begin", "commit", "stop"]
    assert worker.committer.shared is not None and len(client.made) == 1
    renewed = client.made[0]
    assert worker.committer.shared.producer is renewed and renewed.calls == ["start"]
    assert renewed.transactional_id == worker.settings.worker_transactional_id()
    handle_record(two, 0, a.envelopes[0])  # the partition that stayed sends through the new producer
    asyncio.run(worker._commit_all())
    assert renewed.calls == ["start", "begin", "commit"] and not two.needs_commit


def test_a_shared_producer_whose_abort_timed_out_is_replaced() -> None:
    # A broker outage: the commit times out, then so does its abort. librdkafka keeps that abort
    # pending and refuses every other call with _CONFLICT; kept, the producer would fail every
    # partition's records, again and again, long after the broker is back.
    (a,) = generate_sequences(1, seed=6, prefix="shared")
    stuck = FakeTransactionalProducer(
        fail_commit=KafkaClientError("_TIMED_OUT: Failed to add offsets to transaction"),
        fail_abort=KafkaClientError(
            "_TIMED_OUT: Timed out waiting for operation to finish, retry call to resume"
        ),
    )
    worker, (one, two) = per_worker_tasks(stuck)
    client = _Client()
    worker._client = client  # type: ignore[assignment]  # producers only
    handle_record(one, 0, a.envelopes[0])
    asyncio.run(worker._commit_all())
    assert stuck.calls == ["begin", "commit", "abort", "stop"] and len(client.made) == 1
    assert worker.committer.shared is not None and worker.committer.shared.producer is client.made[0]
    handle_record(two, 0, a.envelopes[0])
    asyncio.run(worker._commit_all())
    assert client.made[0].calls == ["start", "begin", "commit"] and not two.needs_commit


def test_a_shared_producer_that_cannot_begin_is_replaced() -> None:
    # The conflict can also surface at the next begin (no transaction open, so nothing to abort).
    (a,) = generate_sequences(1, seed=7, prefix="shared")
    stuck = FakeTransactionalProducer(
        fail_begin=KafkaClientError(
            "_CONFLICT: Conflicting abort_transaction API call is already in progress"
        )
    )
    worker, (one, _two) = per_worker_tasks(stuck)
    client = _Client()
    worker._client = client  # type: ignore[assignment]  # producers only
    with pytest.raises(KafkaClientError):
        handle_record(one, 0, a.envelopes[0])
    asyncio.run(worker._reset_partition(one.tp, None, KafkaClientError("_CONFLICT")))
    assert worker.committer.shared is not None and worker.committer.shared.producer is client.made[0]
    assert client.made[0].calls == ["start"]


def test_a_send_gives_up_when_the_queue_stays_full() -> None:
    # librdkafka (no broker to take anything) with room for one record: the second send meets a
    # full queue. Backpressure waits for room, but not forever: the partition resets instead, and a
    # stop request is not kept waiting behind a send that can never finish.
    producer = confluent_backend._ProducerBase(
        {"bootstrap.servers": "127.0.0.1:9", "request.timeout.ms": 300, "queue.buffering.max.messages": 1},
        "test-produce",
    )
    record = OutgoingRecord("t", b"k", b"v")

    async def two_sends() -> None:
        await producer.send(record)
        with pytest.raises(DeliveryFailedError, match="queue stayed full"):
            async with asyncio.timeout(30):
                await producer.send(record)

    try:
        asyncio.run(two_sends())
    finally:
        producer._producer.purge()
        producer._thread.shutdown()


def _offline_transactional_producer() -> confluent_backend.ConfluentTransactionalProducer:
    """A librdkafka transactional producer pointed at no broker (its calls are the test's)."""
    config = ProducerConfig(
        bootstrap_servers="127.0.0.1:9", client_id="c", max_record_bytes=1 << 20, batch_bytes=16384,
        linger_ms=5, request_timeout_ms=1000, retry_backoff_ms=10, transaction_timeout_ms=15000,
        compression=CompressionType.NONE,
    )  # fmt: skip
    return confluent_backend.ConfluentTransactionalProducer(config, "g-in-worker-0")


def test_a_transactional_call_that_never_returns_gives_the_producer_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # librdkafka's send_offsets_to_transaction was seen to block for minutes past its timeout while
    # the group rebalanced; waited for, it held the loop step, the consumer's poll and SIGTERM.
    monkeypatch.setattr(confluent_backend, "STUCK_MARGIN_S", 0.2)
    producer = _offline_transactional_producer()
    release = threading.Event()

    async def stuck_then_more() -> None:
        with pytest.raises(KafkaClientError, match="did not return"):
            await producer._txn_call(0.0, release.wait)
        # Given up: every later call fails at once (no second wait behind the stuck thread).
        with pytest.raises(KafkaClientError, match="never returned"):
            await producer.abort()
        with pytest.raises(KafkaClientError, match="never returned"):
            await producer.begin()

    try:
        asyncio.run(stuck_then_more())
    finally:
        release.set()
        asyncio.run(producer.stop())


class _LibTransactions:
    """librdkafka's transactional calls, recorded with the thread each ran on."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.refuse_begin: KafkaException | None = None

    def begin_transaction(self) -> None:
        self.calls.append(("begin", threading.get_ident()))
        if self.refuse_begin is not None:
            raise self.refuse_begin

    def send_offsets_to_transaction(self, offsets: object, group: object, timeout: float) -> None:
        self.calls.append(("offsets", threading.get_ident()))

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append(("commit", threading.get_ident()))

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append(("abort", threading.get_ident()))


def test_confluent_begins_the_next_transaction_on_its_thread_after_a_commit() -> None:
    # begin_transaction waits for librdkafka's thread to answer (0.1-1 ms on a busy host): after a
    # commit it is called on the producer's thread, and the loop's begin() then calls nothing.
    producer = _offline_transactional_producer()
    real, lib = producer._producer, _LibTransactions()
    producer._producer = lib  # type: ignore[assignment]
    loop_thread = threading.get_ident()

    async def transactions() -> None:
        await producer.begin()
        await producer.commit({TopicPartition("in", 0): 5}, "group")
        await producer.begin()  # begun already, on the producer's thread
        await producer.commit({}, "group")
        await producer.abort()  # ends the transaction begun ahead: the next begin() is the loop's
        await producer.begin()
        lib.refuse_begin = KafkaException(LibKafkaError(LibKafkaError._STATE))
        await producer.commit({}, "group")  # its begin-ahead fails: left for begin() to report
        with pytest.raises(KafkaClientError):
            await producer.begin()

    try:
        asyncio.run(transactions())
    finally:
        producer._producer = real
        asyncio.run(producer.stop())
    names = [name for name, _ in lib.calls]
    assert names == [
        *["begin", "offsets", "commit", "begin"],  # a commit, the next transaction begun ahead
        *["commit", "begin", "abort", "begin"],  # another, aborted: begin() calls librdkafka again
        *["commit", "begin", "begin"],  # the begin-ahead refused, and begin() reporting it
    ]
    on_loop = [name for name, thread in lib.calls if thread == loop_thread]
    assert on_loop == ["begin", "begin", "begin"]  # the first, the one after the abort, the failing one


def test_a_stop_request_cancels_a_step_stuck_in_a_client_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # The step waits on a commit whose coordinator does not answer; the stop request waits for it a
    # grace period, then cancels it, and the shutdown then commits nothing (the step may have left a
    # partition half-way through a record): every open transaction is aborted instead.
    monkeypatch.setattr(worker_module, "STEP_GRACE_S", 0.05)
    producer = FakeTransactionalProducer()
    worker, (one, _two) = per_worker_tasks(producer)
    (a,) = generate_sequences(1, seed=8, prefix="shared")
    handle_record(one, 0, a.envelopes[0])
    cancelled = []

    async def stuck_step() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    monkeypatch.setattr(worker, "_step", stuck_step)

    async def stop_while_stuck() -> None:
        asyncio.get_running_loop().call_later(0.05, worker.request_stop)
        await worker._step_unless_stopped()
        await worker._shutdown()

    run_bounded(stop_while_stuck(), 30)
    assert cancelled == [True] and worker._step_cancelled
    assert producer.calls == ["begin", "abort", "stop"]  # aborted, never committed


def test_a_step_that_finishes_is_not_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeTransactionalProducer()
    worker, _tasks = per_worker_tasks(producer)
    steps = []

    async def quick_step() -> None:
        steps.append(1)

    monkeypatch.setattr(worker, "_step", quick_step)
    asyncio.run(worker._step_unless_stopped())
    assert steps == [1] and not worker._step_cancelled
