"""The ``topics create`` and ``run`` sub-commands of ``derender-worker``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import threading

from prometheus_client.registry import CollectorRegistry

from worker import stop_signals
from worker.core.cycle_collection import freeze_startup_objects
from worker.defaults import DEFAULT_METRICS_PORT
from worker.errors import ConfigurationError
from worker.runtime.composition import dead_letter_limits, load_derenderer, worker_parts
from worker.runtime.dead_letters.poison import ResetTracker
from worker.runtime.dead_letters.replay import register_dlq
from worker.runtime.observability.health_server import HealthServer, LivenessCheck, ReadinessState
from worker.runtime.observability.structured_logging import configure
from worker.runtime.preflight import check_reachable
from worker.runtime.security.from_settings import load_kafka, with_security
from worker.settings import (
    RUN_SECTIONS,
    KafkaTopics,
    MetricsServerSettings,
    RequestsTopic,
    RunConfig,
    SecuritySettings,
    TopicsCreateSettings,
    add_arguments,
    load,
)

log = logging.getLogger(__name__)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = commands.add_parser("topics", help="manage the worker's Kafka topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True)
    create = topic_commands.add_parser(
        "create",
        help="create the input, output, state (compacted), dead-letter and requests topics (idempotent)",
    )
    add_arguments(create, KafkaTopics, RequestsTopic, SecuritySettings, TopicsCreateSettings)
    create.set_defaults(handler=_topics_create)

    run = commands.add_parser(
        "run", help="consume input envelopes, produce output envelopes (one process = one group member)"
    )
    add_arguments(run, *RUN_SECTIONS)
    run.set_defaults(handler=_run, graceful_stop=True)

    register_dlq(commands)  # `dlq replay` (it adds its own topic and security flags)


def _topics_create(args: argparse.Namespace) -> int:
    from worker.runtime.topics import create_topics

    settings = load_kafka(KafkaTopics, args)
    layout = load(TopicsCreateSettings, args)
    result = asyncio.run(
        create_topics(
            settings.bootstrap_servers,
            settings.topics,
            layout.partitions,
            layout.replication_factor,
            settings.security.client_kwargs(),
            load(RequestsTopic, args).requests_topic,
        )
    )
    for name in result.created:
        print(f"created {name}")
    for name in result.existing:
        print(f"exists  {name}")
    return 0


def start_health_server(
    settings: MetricsServerSettings,
    registry: CollectorRegistry,
    readiness: ReadinessState,
    liveness: LivenessCheck | None = None,
) -> HealthServer:
    """The started server: on ``--metrics-port``; when no port was chosen, on 9464 or any free one."""
    chosen = settings.metrics_port is not None
    port = settings.metrics_port if settings.metrics_port is not None else DEFAULT_METRICS_PORT
    server = HealthServer(registry, readiness, port=port, host=settings.metrics_host, liveness=liveness)
    try:
        server.start()
    except ConfigurationError:
        if chosen:
            raise
        server = HealthServer(registry, readiness, port=0, host=settings.metrics_host, liveness=liveness)
        server.start()
        log.warning(
            "port %d is taken: serving /metrics, /healthz, /readyz on port %d instead "
            "(choose one with --metrics-port / DERENDER_METRICS_PORT)",
            DEFAULT_METRICS_PORT,
            server.port,
        )
    return server


def _run(args: argparse.Namespace) -> int:
    return run_worker(RunConfig.from_args(args))


def run_worker(config: RunConfig) -> int:
    """A worker process from its one configuration: its parts from ``composition``, in the order
    start-up needs them (logging, the Kafka check, the health server, the tokenizer, the worker)."""
    from worker.runtime.observability.prometheus_export import ExportedMetrics, build_registry
    from worker.runtime.observability.tracing import build_spans
    from worker.runtime.worker import Worker

    configure(config.logging)
    settings, model = with_security(config.kafka, config.security), config.model
    limits = dead_letter_limits(config.dead_letters)
    resets = ResetTracker(config.poison.max_record_retries)
    spans = build_spans(config.observability.otel_endpoint)  # tracing: NO_SPANS unless asked for
    log.info("kafka %s", settings.security.describe())
    if _stopped_while_starting():
        return 0
    try:
        asyncio.run(check_reachable(settings))  # before anything slow: the newcomer's first mistake
    except ConfigurationError:
        if _stopped_while_starting():  # it was told to stop meanwhile: no error to report
            return 0
        raise
    if _stopped_while_starting():
        return 0
    metrics, readiness = ExportedMetrics(), ReadinessState()
    # Before the tokenizer loads (seconds): the startupProbe asks /healthz meanwhile, and /readyz
    # answers 503 "worker is created" until the worker runs with its partitions restored.
    server = start_health_server(config.observability, build_registry(metrics), readiness)
    try:
        derenderer = load_derenderer(model)  # before joining: loading a tokenizer takes seconds
        freeze_startup_objects()
        if _stopped_while_starting():
            return 0

        async def main() -> int:
            parts = worker_parts(
                settings,
                model,
                derenderer,
                metrics=metrics,
                readiness=readiness,
                dead_letters=limits,
                resets=resets,
                spans=spans,
            )
            worker = Worker(settings, parts)
            loop = asyncio.get_running_loop()
            deadline = ExitDeadline(settings.shutdown_timeout_s + EXIT_GRACE_S)

            def stop() -> None:
                worker.request_stop()
                deadline.start()

            if _stopped_while_starting():
                return 0
            stop_signals.hand_over(loop, stop)
            return await worker.run()

        return asyncio.run(main())
    finally:
        server.stop()


def _stopped_while_starting() -> bool:
    """A stop signal came during start-up (``stop_signals``): nothing is joined yet, exit 0."""
    if stop_signals.requested():
        log.info("stopped before joining the group")
        return True
    return False


# Beyond --shutdown-timeout-s: the worker's own timed-out shutdown (exit 1) comes first.
EXIT_GRACE_S = 5.0


class ExitDeadline:
    """A stop request ends the process within ``seconds``, whatever is blocked.

    A Kafka client call can hold a thread for its whole timeout (a coordinator that does not answer),
    and the interpreter joins those threads before it exits; a pod past its grace period is killed
    anyway. Exiting is safe at any point: uncommitted work is aborted with the transaction, and the
    next owner starts from the committed offsets and state.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        log.error("still running %.0f s after the stop request: exiting", self.seconds)
        logging.shutdown()
        os._exit(1)
