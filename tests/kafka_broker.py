"""pytest plugin: a real Kafka broker for the tests marked ``kafka``.

Register it with ``pytest_plugins = ["tests.kafka_broker"]`` (or ``-p tests.kafka_broker``).

Fixtures
--------
``kafka_broker`` (session)
    A :class:`KafkaBroker`. Where it comes from, first match wins:

    1. ``KAFKA_BOOTSTRAP_SERVERS`` is set: that broker is used as-is and never stopped.
    2. A Docker engine answers: a testcontainers ``KafkaContainer`` in KRaft mode
       (image from ``KAFKA_TEST_IMAGE``, default :data:`DEFAULT_IMAGE`), removed at session end.
    3. Otherwise ``deploy/local/kafka start`` (Kafka's jars from Maven Central, needs Java 17+
       and Maven). It is stopped at session end only if this session started it.

    ``KAFKA_TEST_BROKER=docker|local`` skips the detection and forces 2 or 3.
``kafka_bootstrap`` (session)
    ``kafka_broker.bootstrap``, the ``"host:port"`` string to hand to clients.
``kafka_topic_factory`` (function)
    A :class:`TopicFactory`: ``kafka_topic_factory("requests", partitions=3)`` creates a topic
    with a unique name (uuid suffix), waits until it has leaders, returns the name and deletes the
    topic after the test.

Restarting the broker
---------------------
Only the local-script broker can be stopped/restarted from a test (``kafka_broker.restart()``,
``.stop()``/``.start()`` or :func:`restart_local_broker`). Check ``kafka_broker.restartable``
first (and ``pytest.skip`` if false); the methods raise :class:`BrokerNotRestartableError`
for an external or container broker. The data dir survives restarts, so topics and committed
offsets do too. The bootstrap address stays the same.

Tests that restart the broker carry the ``broker_restart`` mark: ``./run tests`` runs them in a
serial pytest after the parallel one, since a restart would cut off every other test on the broker.

pytest-xdist
------------
Each xdist worker is its own session, so each asks for the broker. An env broker is shared by all
workers; each worker starts its own container. The local-script broker is one per ``KAFKA_HOME_DIR``:
the first worker that needs it starts it, and the controller (not a worker) stops it when the
whole run ends, so no worker stops it under the others. Under more than one worker it is not
restartable (the restart tests skip, saying why): run them serially, ``-m broker_restart -p no:xdist``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest

from tests.paths import REPO_ROOT

log = logging.getLogger(__name__)

LOCAL_KAFKA_SCRIPT = REPO_ROOT / "deploy" / "local" / "kafka"

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
# Set by the xdist controller for its workers: a directory where a worker that started the local
# broker leaves a mark, so the controller stops it after the last worker ends.
XDIST_RUN_DIR_ENV = "DERENDER_TEST_KAFKA_RUN_DIR"
_STARTED_MARK = "local-broker-started"
_RUN_DIR_KEY = pytest.StashKey[Path]()
MODE_ENV = "KAFKA_TEST_BROKER"
IMAGE_ENV = "KAFKA_TEST_IMAGE"
# Confluent Platform 8.1 ships Apache Kafka 4.1, the version deploy/local/kafka runs.
# testcontainers' KafkaContainer drives the Confluent image's scripts, so it must be a cp-kafka image.
DEFAULT_IMAGE = "confluentinc/cp-kafka:8.1.1"

# The first start may download ~50 jars with Maven; later starts take a few seconds.
SCRIPT_START_TIMEOUT_S = 600.0
RESTART_READY_TIMEOUT_S = 300
READY_TIMEOUT_S = 60.0
TOPIC_READY_TIMEOUT_S = 30.0

BrokerSource = Literal["env", "testcontainers", "local"]

# Broker settings a one-node cluster needs for consumer groups and transactions (the Confluent
# image only lowers the offsets topic's replication factor by itself).
_CONTAINER_ENV: dict[str, str] = {
    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
    "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
    "KAFKA_MIN_INSYNC_REPLICAS": "1",
    "KAFKA_DEFAULT_REPLICATION_FACTOR": "1",
    "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
    "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
    "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
}

# Kafka error codes handled specially when deleting topics.
_UNKNOWN_TOPIC_OR_PARTITION = 3

T = TypeVar("T")


class BrokerNotRestartableError(RuntimeError):
    """The broker under test is not run by deploy/local/kafka, so tests cannot stop/restart it."""


# --- running coroutines from sync code ---------------------------------------------------------


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from sync code, even if this thread already runs a loop.

    Fixtures are sync so they work with or without an async pytest plugin; a test that is itself
    inside ``asyncio.run`` still gets a working call (the coroutine runs on a helper thread).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


# --- the broker ---------------------------------------------------------------------------------


def _run_script(
    command: str, timeout: float = SCRIPT_START_TIMEOUT_S, start_timeout_s: int | None = None
) -> str:
    """Run ``deploy/local/kafka COMMAND`` and return its last stdout line; ``start_timeout_s``: how
    long it waits for the broker to become ready (the script's own default otherwise)."""
    env = None
    if start_timeout_s is not None:
        env = {**os.environ, "KAFKA_START_TIMEOUT": str(start_timeout_s)}
    try:
        proc = subprocess.run(
            [str(LOCAL_KAFKA_SCRIPT), command],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{LOCAL_KAFKA_SCRIPT} {command} timed out after {timeout:.0f}s") from exc
    if proc.returncode != 0:
        raise RuntimeError(
            f"{LOCAL_KAFKA_SCRIPT} {command} failed with exit code {proc.returncode}:\n{proc.stderr.strip()}"
        )
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def second_broker_home(home: Path) -> Path:
    """``home`` made ready for a second ``deploy/local/kafka`` broker (its ``KAFKA_HOME_DIR``): skips
    the test without Java; reuses the default broker's jars (same version), else the script fetches
    them."""
    java = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java and Path(java, "bin", "java").exists()):
        pytest.skip("no Java: deploy/local/kafka cannot start a second broker")
    home.mkdir(parents=True, exist_ok=True)
    version = os.environ.get("KAFKA_VERSION", "4.1.2")
    # The session broker's home: KAFKA_HOME_DIR when set, else the script's default.
    default_home = os.environ.get("KAFKA_HOME_DIR") or REPO_ROOT / "deploy" / "local" / ".kafka"
    jars = Path(default_home, f"jars-{version}")
    if (jars / ".complete").is_file():
        (home / f"jars-{version}").symlink_to(jars)
    return home


def local_broker_running() -> bool:
    """Whether deploy/local/kafka reports a running broker (``status`` exits 0)."""
    proc = subprocess.run(
        [str(LOCAL_KAFKA_SCRIPT), "status"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return proc.returncode == 0


def start_local_broker() -> str:
    """``deploy/local/kafka start`` (a no-op if it runs); returns the bootstrap address."""
    bootstrap = _run_script("start")
    if not bootstrap:
        raise RuntimeError(f"{LOCAL_KAFKA_SCRIPT} start printed no bootstrap address")
    return bootstrap


def stop_local_broker() -> None:
    """``deploy/local/kafka stop`` (SIGTERM, then SIGKILL after 30 s); no error if stopped."""
    _run_script("stop", timeout=120)


def restart_local_broker() -> str:
    """Stop and start the local-script broker, keeping its data; returns the bootstrap address.

    Waits until the broker answers metadata requests again. Only meaningful when the session
    uses the local broker (see ``KafkaBroker.restartable``).
    """
    # A restart reloads every partition the session has created so far, on a machine the tests
    # keep busy: it can take minutes where a fresh start takes seconds.
    bootstrap = _run_script("restart", start_timeout_s=RESTART_READY_TIMEOUT_S)
    wait_until_ready(bootstrap)
    return bootstrap


async def _broker_answers(bootstrap: str) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        return bool(cluster.get("brokers"))
    except Exception:  # noqa: BLE001 - any connection/protocol error just means "not yet"
        return False
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


def wait_until_ready(bootstrap: str, timeout: float = READY_TIMEOUT_S) -> None:
    """Block until a client can bootstrap from ``bootstrap`` and sees at least one broker."""
    deadline = time.monotonic() + timeout
    while not run_sync(_broker_answers(bootstrap)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kafka at {bootstrap} did not answer within {timeout:.0f}s")
        time.sleep(0.5)


def docker_available(timeout: float = 3.0) -> bool:
    """Whether a Docker engine answers a ping; fast (about 0.1 s) when there is none."""
    try:
        import docker  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=timeout)
    except Exception:  # noqa: BLE001 - no socket, bad DOCKER_HOST, ...: "no Docker"
        return False
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - docker's or requests' errors alike: "no Docker"
        return False
    finally:
        client.close()


def _start_container() -> tuple[str, Any]:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # testcontainers < 4.14 kept it at testcontainers.kafka
        from testcontainers.kafka import KafkaContainer

    image = os.environ.get(IMAGE_ENV, DEFAULT_IMAGE)
    container = KafkaContainer(image).with_kraft()
    for key, value in _CONTAINER_ENV.items():
        container.with_env(key, value)
    container.start(timeout=180)
    return str(container.get_bootstrap_server()), container


@dataclass
class KafkaBroker:
    """The broker the session's tests talk to."""

    bootstrap: str
    source: BrokerSource
    owned: bool  # started by this session, so stopped/removed by it at the end
    _container: Any = field(default=None, repr=False)
    _stopped_by_test: bool = field(default=False, repr=False)

    @property
    def restartable(self) -> bool:
        """Whether tests may ``stop``/``start``/``restart`` it (only the local-script broker, and
        only when no other xdist worker shares it)."""
        return self.source == "local" and _xdist_worker_count() <= 1

    @property
    def not_restartable_reason(self) -> str:
        """Why ``restartable`` is false, for the skip message."""
        if self.source != "local":
            return (
                f"the {self.source} broker cannot be restarted by tests: only the one run by "
                f"deploy/local/kafka can (unset {BOOTSTRAP_ENV}, {MODE_ENV}=local)"
            )
        return (
            f"{_xdist_worker_count()} xdist workers share the local broker: restart tests run "
            "serially (-m broker_restart -p no:xdist; ./run tests does)"
        )

    def _require_restartable(self, what: str) -> None:
        if not self.restartable:
            raise BrokerNotRestartableError(
                f"cannot {what} the broker at {self.bootstrap}: {self.not_restartable_reason} "
                "(check KafkaBroker.restartable and skip otherwise)"
            )

    def stop(self) -> None:
        """Stop the broker (clean shutdown); ``start()`` brings it back with the same data."""
        self._require_restartable("stop")
        stop_local_broker()
        self._stopped_by_test = True

    def start(self) -> None:
        """Start the broker again after ``stop()`` and wait until it answers."""
        self._require_restartable("start")
        bootstrap = start_local_broker()
        if bootstrap != self.bootstrap:
            raise RuntimeError(f"broker came back at {bootstrap}, expected {self.bootstrap}")
        wait_until_ready(bootstrap)
        self._stopped_by_test = False

    def restart(self) -> None:
        """Stop and start the broker (data kept, same address); returns once it answers."""
        self._require_restartable("restart")
        self._stopped_by_test = True
        bootstrap = restart_local_broker()
        if bootstrap != self.bootstrap:
            raise RuntimeError(f"broker came back at {bootstrap}, expected {self.bootstrap}")
        self._stopped_by_test = False

    def close(self) -> None:
        """Session teardown: stop what this session started, restore what a test stopped."""
        if self.source == "testcontainers" and self._container is not None:
            self._container.stop()
        elif self.source == "local":
            if self.owned:
                stop_local_broker()
            elif self._stopped_by_test:
                start_local_broker()  # it ran before the session; leave it running


def acquire_broker() -> KafkaBroker:
    """Find or start a broker: env address, then Docker, then deploy/local/kafka."""
    external = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if external:
        wait_until_ready(external)
        return KafkaBroker(bootstrap=external, source="env", owned=False)

    mode = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "docker", "local"):
        raise pytest.UsageError(f"{MODE_ENV} must be auto, docker or local, not {mode!r}")

    if mode == "docker" or (mode == "auto" and docker_available()):
        bootstrap, container = _start_container()
        try:
            wait_until_ready(bootstrap)
        except Exception:
            container.stop()
            raise
        return KafkaBroker(bootstrap=bootstrap, source="testcontainers", owned=True, _container=container)

    was_running = local_broker_running()
    bootstrap = start_local_broker()
    run_dir = os.environ.get(XDIST_RUN_DIR_ENV) if _xdist_worker_count() else None
    if run_dir and not was_running:
        # The controller stops it after the run; this worker ending must not.
        Path(run_dir, _STARTED_MARK).touch()
    broker = KafkaBroker(bootstrap=bootstrap, source="local", owned=not was_running and not run_dir)
    try:
        wait_until_ready(bootstrap)
    except Exception:
        broker.close()
        raise
    return broker


# --- pytest-xdist -------------------------------------------------------------------------------


def _xdist_worker_count() -> int:
    """How many xdist workers this run has, seen from a worker; 0 outside a worker."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return 0
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def pytest_configure(config: pytest.Config) -> None:
    # In the xdist controller only (a worker has workerinput): the workers, started after this,
    # inherit the directory through the environment.
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    run_dir = Path(tempfile.mkdtemp(prefix="derender-kafka-run-"))
    config.stash[_RUN_DIR_KEY] = run_dir
    os.environ[XDIST_RUN_DIR_ENV] = str(run_dir)


def pytest_unconfigure(config: pytest.Config) -> None:
    run_dir = config.stash.get(_RUN_DIR_KEY, None)
    if run_dir is None:
        return
    os.environ.pop(XDIST_RUN_DIR_ENV, None)
    try:
        if (run_dir / _STARTED_MARK).exists():
            stop_local_broker()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """The session's Kafka broker (see the module docstring for where it comes from)."""
    broker = acquire_broker()
    log.info("Kafka for tests: %s (%s, owned=%s)", broker.bootstrap, broker.source, broker.owned)
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """``"host:port"`` of the session's Kafka broker."""
    return kafka_broker.bootstrap


# --- topics -------------------------------------------------------------------------------------


def unique_topic_name(base: str) -> str:
    """``base`` plus a random suffix, so tests (and reruns against a kept broker) never collide."""
    return f"{base}-{uuid.uuid4().hex[:12]}"


def _raise_for_topic_errors(topic_errors: Sequence[Any], ignore: frozenset[int] = frozenset()) -> None:
    from aiokafka.errors import for_code

    for entry in topic_errors:
        topic, code = entry[0], entry[1]
        if code and code not in ignore:
            message = entry[2] if len(entry) > 2 and entry[2] else ""
            raise for_code(code)(f"topic {topic!r}: {message}".rstrip(": "))


async def create_topics(
    bootstrap: str,
    names: Sequence[str],
    partitions: int = 1,
    *,
    config: Mapping[str, str] | None = None,
    timeout: float = TOPIC_READY_TIMEOUT_S,
) -> None:
    """Create topics with exactly these names (replication factor 1) and wait for their leaders."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, partitions, 1, topic_configs=dict(config or {})) for name in names],
            timeout_ms=int(timeout * 1000),
        )
        _raise_for_topic_errors(response.topic_errors)
        # CreateTopics returns once the controller committed the topic; producers and consumers
        # should not start before the broker's metadata has a leader for every partition.
        deadline = time.monotonic() + timeout
        pending = set(names)
        while pending:
            for topic in await admin.describe_topics(sorted(pending)):
                parts = topic.get("partitions", [])
                if (
                    topic.get("error_code") == 0
                    and len(parts) == partitions
                    and all(p.get("leader", -1) >= 0 for p in parts)
                ):
                    pending.discard(topic["topic"])
            if pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"topics without leaders after {timeout:.0f}s: {sorted(pending)}")
                await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, names: Sequence[str], timeout: float = 30.0) -> None:
    """Delete topics; already-missing ones are fine."""
    from aiokafka.admin import AIOKafkaAdminClient

    if not names:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.delete_topics(list(names), timeout_ms=int(timeout * 1000))
        _raise_for_topic_errors(response.topic_error_codes, ignore=frozenset({_UNKNOWN_TOPIC_OR_PARTITION}))
    finally:
        await admin.close()


class TopicFactory:
    """Creates uniquely named topics for one test and deletes them afterwards."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.created: list[str] = []

    def __call__(
        self, base: str = "test", partitions: int = 1, *, config: Mapping[str, str] | None = None
    ) -> str:
        """Create ``<base>-<uuid>`` with ``partitions`` partitions; returns its name."""
        return self.many([base], partitions, config=config)[0]

    def many(
        self, bases: Sequence[str], partitions: int = 1, *, config: Mapping[str, str] | None = None
    ) -> list[str]:
        """Create one unique topic per base name (same partition count); returns their names."""
        topics = [unique_topic_name(base) for base in bases]
        # Registered before creating, so a half-failed create is still cleaned up.
        self.created.extend(topics)
        run_sync(create_topics(self.bootstrap, topics, partitions, config=config))
        return topics

    def cleanup(self) -> None:
        """Delete every topic made so far; a failure (e.g. the broker was stopped) only warns."""
        topics, self.created = self.created, []
        try:
            run_sync(delete_topics(self.bootstrap, topics))
        except Exception as exc:  # noqa: BLE001 - cleanup only warns (e.g. the broker was stopped)
            log.warning("could not delete test topics %s: %r", topics, exc)


@pytest.fixture
def kafka_topic_factory(kafka_bootstrap: str) -> Iterator[TopicFactory]:
    """Make unique topics for this test: ``kafka_topic_factory("events", partitions=3)``."""
    factory = TopicFactory(kafka_bootstrap)
    try:
        yield factory
    finally:
        factory.cleanup()
