"""``derender-worker audit``: the command line of the audit (``worker.audit``), over files here and
over Kafka topics through ``worker.runtime.audit_source``."""

from __future__ import annotations

import argparse
import sys

from worker.audit import EXIT_USAGE, audit_files, check_args, needs_kafka
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.errors import AuditUsageError, ConfigurationError
from worker.runtime.audit_source import add_kafka_arguments, audit_with_kafka
from worker.settings import ModelSettings, add_arguments, load

# --- the command --------------------------------------------------------------------------------

DESCRIPTION = """\
Re-derender recorded inputs with this worker's core and configuration and compare the result,
record for record, with the recorded outputs. Exit status: 0 everything compared is identical,
1 a difference was found, 2 usage or connection error, or an empty or inverted range, 3 no difference
but some requests could not be compared (status "error" in the report).
"""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = commands.add_parser(
        "audit",
        help="re-derender an input range and compare it with the recorded outputs",
        description=DESCRIPTION,
    )
    files = audit.add_argument_group("files (instead of topics)")
    files.add_argument("--input-file", default=None, help="input envelopes, JSON Lines")
    files.add_argument(
        "--output-file",
        default=None,
        help="recorded output envelopes, JSON Lines (e.g. a dump of the output topic)",
    )
    result = audit.add_argument_group("results")
    result.add_argument("--report", default=None, help="write one JSON line per non-identical request here")
    result.add_argument(
        "--emit-file",
        default=None,
        help="write the re-derendered outputs here, as output envelopes (JSON Lines)",
    )
    add_kafka_arguments(audit)
    add_arguments(audit, ModelSettings)
    audit.set_defaults(handler=_audit)


def _audit(args: argparse.Namespace) -> int:
    err = sys.stderr
    try:
        check_args(args)
        model = load(ModelSettings, args)
        loaded: list[Derenderer] = []

        def factory() -> EnvelopeProcessor:
            # Loaded at the first record, after Kafka answered: a bad address fails in seconds.
            if not loaded:
                loaded.append(model.build_derenderer())
            processor = model.processor_for(loaded[0])
            # Records read from the input topic follow the worker's placement rule (keyed by
            # request_id); JSON Lines files have no keys, as for replay.
            processor.require_key = args.input_file is None
            return processor

        if not needs_kafka(args):
            return audit_files(args, factory, err)
        return audit_with_kafka(args, factory, err)
    except (AuditUsageError, ConfigurationError, OSError) as exc:
        print(f"derender-worker audit: {exc}", file=err)
        return EXIT_USAGE
