"""``derender-worker replay``: the offline twin of the Kafka worker.

Reads input envelopes as JSON Lines, writes one output envelope per input line
to stdout in input order. Records that are not envelopes are reported on stderr
and make the exit status 1, after every good line ran. No line can stop it:
each gets its one outcome from the processor's boundary.

Output is flushed whenever the input has nothing more ready (a line typed or
piped in gets its answer at once; a file is written in large blocks), and the
objects built at start-up are moved out of the garbage collector's sight, so a
record costs what the core costs (see docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO, TextIO

from worker.assembly import Assembler, render_text
from worker.core.cycle_collection import freeze_startup_objects
from worker.core.envelope_processor import EnvelopeProcessor

log = logging.getLogger(__name__)

# The most a single read takes from the input: lines ready within it are answered together.
_READ_BYTES = 1 << 16


def line_batches(source: BinaryIO) -> Iterator[list[bytes]]:
    """The input's lines, in batches of those that were ready together.

    A batch ends where reading more would wait for the input (one ``read1`` per batch), so a
    caller that flushes after each batch answers every line as soon as it could be read.
    """
    read = getattr(source, "read1", source.read)
    pending = b""
    while True:
        data = read(_READ_BYTES)
        if not data:
            if pending:
                yield [pending]
            return
        lines = (pending + data).split(b"\n")
        pending = lines.pop()
        if lines:
            yield lines


def replay_batches(
    batches: Iterable[Sequence[bytes]],
    processor: EnvelopeProcessor,
    out: BinaryIO,
    err: TextIO,
    *,
    assemble: bool = False,
) -> int:
    """Run every line through ``processor``, flushing after each batch; return the exit status."""
    dead_letters = 0
    number = 0
    assembler = Assembler() if assemble else None
    write = out.write
    process = processor.process
    for batch in batches:
        for line in batch:
            number += 1
            value = line.strip()
            if not value:
                continue
            result = process(value)
            if result.internal_error is not None:  # a bug of ours: its record says 500, this says where
                log.error("line %d: processing failed", number, exc_info=result.internal_error)
            payload = result.payload
            if result.output is not None and payload is not None:
                write(payload)
                write(b"\n")
                if assembler is not None:
                    assembler.add(result.output)
            elif result.dead_letter is not None:
                dead_letters += 1
                print(f"dead-letter: line {number}: {result.dead_letter.reason}", file=err, flush=True)
            else:
                rid = result.request_id
                print(f"duplicate: line {number}: request {rid!r} seq already processed", file=err)
        out.flush()
    if assembler is not None:
        for response in assembler.responses.values():
            print(render_text(response), file=err)
    if dead_letters:
        print(f"replay: {dead_letters} record(s) were not valid envelopes", file=err)
        return 1
    return 0


def replay_lines(
    lines: Iterable[bytes],
    processor: EnvelopeProcessor,
    out: BinaryIO,
    err: TextIO,
    *,
    assemble: bool = False,
) -> int:
    """``replay_batches`` with every line its own batch (flushed after each)."""
    return replay_batches(([line] for line in lines), processor, out, err, assemble=assemble)


def replay_file(
    path: str,
    processor: EnvelopeProcessor,
    *,
    assemble: bool = False,
    out: BinaryIO | None = None,
    err: TextIO | None = None,
) -> int:
    """The ``replay`` command after start-up: ``path`` (``-``: stdin) to ``out`` (stdout)."""
    freeze_startup_objects()
    source = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115 - closed below
    try:
        batches = line_batches(source)
        return replay_batches(
            batches, processor, out or sys.stdout.buffer, err or sys.stderr, assemble=assemble
        )
    finally:
        if source is not sys.stdin.buffer:
            source.close()
