"""The ``derender-worker`` command line.

Each sub-command lives with the code it drives and registers itself here:
``replay`` (offline, ``worker.replay``), the Kafka commands
(``worker.runtime.commands``) and the pipeline's ``produce``, ``consume``, ``ingest`` and
``gateway`` (``worker.pipeline.commands``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from worker.audit import register as register_audit
from worker.demo import register as register_demo
from worker.errors import ConfigurationError, DerenderWorkerError
from worker.pipeline.commands import register as register_pipeline
from worker.runtime.commands import register as register_runtime
from worker.settings import ModelSettings, add_model_arguments

Handler = Callable[[argparse.Namespace], int]


def _replay(args: argparse.Namespace) -> int:
    from worker.replay import open_input, replay_lines

    processor = ModelSettings.from_args(args).build_processor()
    source = open_input(args.file)
    try:
        return replay_lines(source, processor, sys.stdout.buffer, sys.stderr, assemble=args.assemble)
    finally:
        if source is not sys.stdin.buffer:
            source.close()


def _register_replay(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = commands.add_parser("replay", help="derender a JSON Lines file of input envelopes to stdout")
    replay.add_argument("file", nargs="?", default="-", help="input envelopes, one per line ('-': stdin)")
    replay.add_argument(
        "--assemble", action="store_true", help="also print each assembled response to stderr at the end"
    )
    add_model_arguments(replay)
    replay.set_defaults(handler=_replay)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="derender-worker",
        description="Turn vLLM generate token streams into OpenAI responses (vLLM 0.33.0 derender parity).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _register_replay(commands)
    register_demo(commands)
    register_audit(commands)  # `audit`: files here, topics through worker.runtime.audit_source
    register_runtime(commands)
    register_pipeline(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except ConfigurationError as exc:
        print(f"derender-worker: configuration error: {exc}", file=sys.stderr)
        return 2
    except (DerenderWorkerError, OSError) as exc:
        print(f"derender-worker: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
