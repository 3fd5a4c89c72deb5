"""The ``topics create`` and ``run`` sub-commands of ``derender-worker``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from prometheus_client.registry import CollectorRegistry

from worker.errors import ConfigurationError
from worker.runtime.config import KafkaSettings, add_run_arguments, add_topic_arguments
from worker.runtime.dead_letter_policy import DeadLetterLimits, DeadLetterPolicy, add_dead_letter_arguments
from worker.runtime.dlq_replay import register_dlq
from worker.runtime.health_server import (
    DEFAULT_METRICS_PORT,
    HealthServer,
    ReadinessState,
    add_metrics_arguments,
)
from worker.runtime.kafka_security import add_security_arguments
from worker.runtime.poison import ResetTracker, add_poison_arguments
from worker.runtime.structured_logging import add_log_format_argument, configure_logging
from worker.runtime.tracing import add_tracing_arguments
from worker.settings import ModelSettings, add_model_arguments, env_default

log = logging.getLogger(__name__)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = commands.add_parser("topics", help="manage the worker's Kafka topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True)
    create = topic_commands.add_parser(
        "create", help="create the input, output, state (compacted) and dead-letter topics (idempotent)"
    )
    add_topic_arguments(create)
    add_security_arguments(create)
    create.add_argument(
        "--partitions",
        type=int,
        default=int(env_default("partitions", "12") or 12),
        help="partitions of every topic; the state topic must match the input topic, so set it once",
    )
    create.add_argument(
        "--replication-factor", type=int, default=int(env_default("replication-factor", "1") or 1)
    )
    create.set_defaults(handler=_topics_create)

    run = commands.add_parser(
        "run", help="consume input envelopes, produce output envelopes (one process = one group member)"
    )
    add_run_arguments(run)
    add_model_arguments(run)
    run.add_argument(
        "--log-level", default=env_default("log-level", "INFO"), help="DEBUG, INFO, WARNING, ERROR"
    )
    add_metrics_arguments(run)
    if env_default("metrics-port") is None:
        # Not chosen (no flag, no DERENDER_METRICS_PORT, which every deploy/ file sets): 9464, or a
        # free port when 9464 is taken, so several workers can run on one host (`demo`, tests).
        run.set_defaults(metrics_port=None)
    add_security_arguments(run)
    add_dead_letter_arguments(run)
    add_poison_arguments(run)
    add_log_format_argument(run)
    add_tracing_arguments(run)
    run.set_defaults(handler=_run)

    register_dlq(commands)  # `dlq replay` (it adds its own topic and security flags)


def _topics_create(args: argparse.Namespace) -> int:
    from worker.runtime.topics import create_topics

    settings = KafkaSettings.from_args(args)
    result = asyncio.run(
        create_topics(
            settings.bootstrap_servers,
            settings.topics,
            args.partitions,
            args.replication_factor,
            settings.security.client_kwargs(),
        )
    )
    for name in result.created:
        print(f"created {name}")
    for name in result.existing:
        print(f"exists  {name}")
    return 0


def _start_health_server(
    args: argparse.Namespace, registry: CollectorRegistry, readiness: ReadinessState
) -> HealthServer:
    """The started server: on ``--metrics-port``; when no port was chosen, on 9464 or any free one."""
    chosen = args.metrics_port is not None
    port = args.metrics_port if chosen else DEFAULT_METRICS_PORT
    server = HealthServer(registry, readiness, port=port, host=args.metrics_host)
    try:
        server.start()
    except ConfigurationError:
        if chosen:
            raise
        server = HealthServer(registry, readiness, port=0, host=args.metrics_host)
        server.start()
        log.warning(
            "port %d is taken: serving /metrics, /healthz, /readyz on port %d instead "
            "(choose one with --metrics-port / DERENDER_METRICS_PORT)",
            DEFAULT_METRICS_PORT,
            server.port,
        )
    return server


def _run(args: argparse.Namespace) -> int:
    from worker.runtime.observer import RecordObserver
    from worker.runtime.prometheus_export import ExportedMetrics, build_registry
    from worker.runtime.tracing import build_spans
    from worker.runtime.worker import Worker

    configure_logging(args.log_level, json=args.log_format == "json")
    settings = KafkaSettings.from_args(args)
    model = ModelSettings.from_args(args)
    dead_letters = DeadLetterPolicy(DeadLetterLimits.from_args(args))
    resets = ResetTracker(args.max_record_retries)
    spans = build_spans(args.otel_endpoint)  # tracing: NO_SPANS unless asked for
    log.info("kafka %s", settings.security.describe())
    metrics, readiness = ExportedMetrics(), ReadinessState()
    # Before the tokenizer loads (seconds): the startupProbe asks /healthz meanwhile, and /readyz
    # answers 503 "worker is created" until the worker runs with its partitions restored.
    # Loading the tokenizer takes seconds (tens on a loaded node): a SIGTERM meanwhile (a scale-in,
    # a rolling update) is a stop request too, not a death by signal.
    early_stop = _EarlyStop()
    server = _start_health_server(args, build_registry(metrics), readiness)
    try:
        derenderer = model.build_derenderer()  # before joining: loading a tokenizer takes seconds
        if early_stop.requested:
            log.info("stopped before joining the group")
            return 0

        async def main() -> int:
            worker = Worker(
                settings,
                derenderer,
                max_record_bytes=model.max_record_bytes,
                metrics=metrics,
                readiness=readiness,
                dead_letters=dead_letters,
                resets=resets,
                max_live_parsers=model.max_live_parsers,
                observer=RecordObserver(settings.group_id, spans, metrics=metrics),
            )
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, worker.request_stop)
            if early_stop.requested:
                return 0
            return await worker.run()

        return asyncio.run(main())
    finally:
        early_stop.restore()
        server.stop()


class _EarlyStop:
    """Records SIGTERM / SIGINT until the event loop's own handlers take over."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
