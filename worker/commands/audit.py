"""``derender-worker audit``: the command line of the audit (``worker.audit``), over files here and
over Kafka topics through ``worker.runtime.audit_source``."""

from __future__ import annotations

import argparse
import sys

from worker.audit import EXIT_USAGE, audit_files, check_files
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.errors import AuditUsageError, ConfigurationError
from worker.runtime.audit_source import add_kafka_arguments, audit_with_kafka
from worker.runtime.composition import load_derenderer, new_processor
from worker.runtime.security.from_settings import load_kafka
from worker.settings import AuditOptions, ModelSettings, ProducingTopics, add_arguments, load

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
    add_arguments(audit, AuditOptions)
    add_kafka_arguments(audit)
    add_arguments(audit, ModelSettings)
    audit.set_defaults(handler=_audit)


def _audit(args: argparse.Namespace) -> int:
    err = sys.stderr
    try:
        options = load(AuditOptions, args)
        check_files(options)
        model = load(ModelSettings, args)
        # Checked now (a missing address is a usage error); the model loads at the first record.
        kafka = load_kafka(ProducingTopics, args) if options.needs_kafka else None
        loaded: list[Derenderer] = []

        def factory() -> EnvelopeProcessor:
            # Loaded at the first record, after Kafka answered: a bad address fails in seconds.
            if not loaded:
                loaded.append(load_derenderer(model))
            # Records read from the input topic follow the worker's placement rule (keyed by
            # request_id); JSON Lines files have no keys, as for replay.
            return new_processor(model, loaded[0], require_key=options.input_file is None)

        if kafka is None:
            return audit_files(options, factory, err)
        return audit_with_kafka(options, kafka, factory, err)
    except (AuditUsageError, ConfigurationError, OSError) as exc:
        print(f"derender-worker audit: {exc}", file=err)
        return EXIT_USAGE
