"""The ``topics create`` and ``run`` sub-commands of ``derender-worker``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from worker.runtime.config import KafkaSettings, add_run_arguments, add_topic_arguments
from worker.settings import ModelSettings, add_model_arguments, env_default

log = logging.getLogger(__name__)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = commands.add_parser("topics", help="manage the worker's Kafka topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True)
    create = topic_commands.add_parser(
        "create", help="create the input, output, state (compacted) and dead-letter topics (idempotent)"
    )
    add_topic_arguments(create)
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
    run.set_defaults(handler=_run)


def _topics_create(args: argparse.Namespace) -> int:
    from worker.runtime.topics import create_topics

    settings = KafkaSettings.from_args(args)
    result = asyncio.run(
        create_topics(settings.bootstrap_servers, settings.topics, args.partitions, args.replication_factor)
    )
    for name in result.created:
        print(f"created {name}")
    for name in result.existing:
        print(f"exists  {name}")
    return 0


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s [{os.getpid()}] %(name)s: %(message)s",
    )
    # aiokafka logs every retry of a broker outage at ERROR/WARNING; keep its INFO chatter out.
    if os.environ.get("DERENDER_AIOKAFKA_DEBUG") != "1":
        logging.getLogger("aiokafka").setLevel(max(logging.WARNING, logging.getLogger().level))


def _run(args: argparse.Namespace) -> int:
    from worker.runtime.worker import Worker

    _configure_logging(args.log_level)
    settings = KafkaSettings.from_args(args)
    model = ModelSettings.from_args(args)
    derenderer = model.build_derenderer()  # before joining: loading a tokenizer takes seconds

    async def main() -> int:
        worker = Worker(settings, derenderer, max_record_bytes=model.max_record_bytes)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.request_stop)
        return await worker.run()

    return asyncio.run(main())
