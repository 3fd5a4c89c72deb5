"""The ``derender-worker`` command line.

Each sub-command lives with the code it drives and registers itself here:
``replay`` (offline, ``worker.replay``), the Kafka commands
(``worker.commands.run``) and the pipeline's ``produce``, ``consume``, ``ingest`` and
``gateway`` (``worker.commands.pipeline``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from worker import stop_signals

# Nothing slow at module level: the stop signals are caught (``main``'s first step) only after these
# imports, and a process stopped before that dies by the signal.

Handler = Callable[[argparse.Namespace], int]

# The module that registers each command, imported only when that command runs (all of them for
# --help or an unknown name): the pipeline's aiohttp and the runtime's aiokafka would otherwise
# be imported by every command, and more than double ``replay``'s start-up.
_REGISTRARS = {
    "demo": "worker.demo",
    "audit": "worker.commands.audit",
    "run": "worker.commands.run",
    "topics": "worker.commands.run",
    "dlq": "worker.commands.run",
    "produce": "worker.commands.pipeline",
    "consume": "worker.commands.pipeline",
    "ingest": "worker.commands.pipeline",
    "gateway": "worker.commands.pipeline",
}


def _replay(args: argparse.Namespace) -> int:
    from worker.replay import replay_file
    from worker.runtime.composition import load_processor
    from worker.settings import ModelSettings, ReplayFileOptions, load

    assemble = load(ReplayFileOptions, args).assemble
    return replay_file(args.file, load_processor(load(ModelSettings, args)), assemble=assemble)


def _register_replay(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from worker.settings import ModelSettings, ReplayFileOptions, add_arguments

    replay = commands.add_parser("replay", help="derender a JSON Lines file of input envelopes to stdout")
    replay.add_argument("file", nargs="?", default="-", help="input envelopes, one per line ('-': stdin)")
    add_arguments(replay, ReplayFileOptions, ModelSettings)
    replay.set_defaults(handler=_replay)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with ``command`` alone when it is a known one."""
    parser = argparse.ArgumentParser(
        prog="derender-worker",
        description="Turn vLLM generate token streams into OpenAI responses (vLLM 0.33.0 derender parity).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    if command == "replay":
        _register_replay(commands)
        return parser
    if command in _REGISTRARS:
        importlib.import_module(_REGISTRARS[command]).register(commands)
        return parser
    _register_replay(commands)
    for module in dict.fromkeys(_REGISTRARS.values()):
        importlib.import_module(module).register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # A long-running command stopped while it imports or loads its tokenizer exits 0 (see
    # ``stop_signals``); the commands registered with ``graceful_stop=True`` take the signals over.
    stop_signals.catch_early()
    graceful = False  # whether a command that answers the stop signals ran
    try:
        from worker.errors import ConfigurationError, DerenderWorkerError

        arguments = list(sys.argv[1:] if argv is None else argv)
        args = build_parser(arguments[0] if arguments else None).parse_args(arguments)
        graceful = bool(getattr(args, "graceful_stop", False))
        if not graceful:
            stop_signals.release()
        handler: Handler = args.handler
        try:
            return handler(args)
        except ConfigurationError as exc:
            print(f"derender-worker: configuration error: {exc}", file=sys.stderr)
            return 2
        except (DerenderWorkerError, OSError) as exc:
            print(f"derender-worker: {exc}", file=sys.stderr)
            return 1
    finally:
        # A graceful command answered what it was sent; otherwise (``--help``, a bad flag) the
        # process ends as the signal would have ended it.
        stop_signals.release(redeliver=not graceful)


if __name__ == "__main__":
    sys.exit(main())
