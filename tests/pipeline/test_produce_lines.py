"""``produce``'s line reader: a line longer than a record can be is skipped without being held."""

from __future__ import annotations

import io
import tracemalloc

from worker.pipeline.records import bounded_lines


def test_lines_within_the_limit_come_whole_and_longer_ones_as_none() -> None:
    source = io.BytesIO(b"12345\n" + b"x" * 11 + b"\n" + b"1234567890\n" + b"y" * 25 + b"\nlast")
    assert list(bounded_lines(source, max_bytes=10)) == [b"12345\n", None, b"1234567890\n", None, b"last"]


def test_an_oversized_last_line_without_a_newline_is_one_none() -> None:
    assert list(bounded_lines(io.BytesIO(b"ok\n" + b"z" * 50), max_bytes=10)) == [b"ok\n", None]


def test_an_oversized_line_is_not_held_in_memory() -> None:
    limit = 1 << 20
    source = io.BytesIO(b"a" * (64 << 20) + b"\n{}\n")
    tracemalloc.start()
    try:
        lines = list(bounded_lines(source, max_bytes=limit))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == [None, b"{}\n"]
    assert peak < 4 * limit, f"peak {peak} bytes while skipping a 64 MiB line"
