"""``derender-worker replay``: the offline twin of the Kafka worker.

Reads input envelopes as JSON Lines, writes one output envelope per input line
to stdout in input order (flushed per line). Records that are not envelopes are
reported on stderr and make the exit status 1, after every good line ran. No
line can stop it: each gets its one outcome from the processor's boundary.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import BinaryIO, TextIO

from worker.assembly import Assembler, render_text
from worker.core.envelope_processor import EnvelopeProcessor


def replay_lines(
    lines: Iterable[bytes],
    processor: EnvelopeProcessor,
    out: BinaryIO,
    err: TextIO,
    *,
    assemble: bool = False,
) -> int:
    """Run every line through ``processor``; return the exit status."""
    dead_letters = 0
    assembler = Assembler() if assemble else None
    for number, line in enumerate(lines, start=1):
        value = line.strip()
        if not value:
            continue
        result = processor.process(value)
        if result.dead_letter is not None:
            dead_letters += 1
            print(f"dead-letter: line {number}: {result.dead_letter.reason}", file=err, flush=True)
            continue
        if result.duplicate:
            print(f"duplicate: line {number}: request {result.request_id!r} seq already processed", file=err)
            continue
        assert result.output is not None and result.payload is not None
        out.write(result.payload + b"\n")
        out.flush()
        if assembler is not None:
            assembler.add(result.output)
    if assembler is not None:
        for response in assembler.responses.values():
            print(render_text(response), file=err)
    if dead_letters:
        print(f"replay: {dead_letters} record(s) were not valid envelopes", file=err)
        return 1
    return 0


def open_input(path: str) -> BinaryIO:
    if path == "-":
        return sys.stdin.buffer
    return open(path, "rb")
