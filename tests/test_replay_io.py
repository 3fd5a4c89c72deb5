"""``replay``'s reading and writing: same bytes as one line at a time, every line answered as soon as read.

Lines that are ready together are answered together and flushed once; a line that arrives alone
(typed, or piped by a slow producer) is flushed before the next read, so nobody waits on a buffer.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from tests.golden_cases import MODELS_DIR
from tests.paths import REPO_ROOT
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.replay import line_batches, replay_batches, replay_file, replay_lines
from worker.runtime.composition import load_derenderer
from worker.settings import ModelSettings

SAMPLE = REPO_ROOT / "samples" / "streams" / "qwen3-sample.jsonl"


def _processor() -> EnvelopeProcessor:
    settings = ModelSettings(tokenizer=str(MODELS_DIR / "qwen3"), served_model_names=("test-model",))
    built = load_derenderer(settings)
    fixed = Derenderer(built.tokenizer, built.options, built.parsing, clock=lambda: 0.0)
    return EnvelopeProcessor(fixed)


class _Trickle(io.RawIOBase):
    """An input that hands out one line per read, recording what the output held at each read."""

    def __init__(self, lines: list[bytes], out: _Recorder) -> None:
        self._lines = list(lines)
        self._out = out
        self.flushed_at_read: list[int] = []

    def readable(self) -> bool:
        return True

    def read1(self, size: int = -1) -> bytes:
        self.flushed_at_read.append(self._out.flushed_lines)
        return self._lines.pop(0) if self._lines else b""


class _Recorder(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushed_lines = 0

    def flush(self) -> None:
        self.flushed_lines = self.getvalue().count(b"\n")


def test_replay_file_writes_the_bytes_of_line_by_line_replay(tmp_path: Path) -> None:
    data = SAMPLE.read_bytes()
    # Blank lines, CRLF and a last line without a newline are read as line iteration reads them.
    lines = data.splitlines(keepends=True)
    mixed = b"\n" + lines[0].rstrip(b"\n") + b"\r\n" + b"".join(lines[1:]).rstrip(b"\n")
    path = tmp_path / "in.jsonl"
    path.write_bytes(mixed)
    expected, got = io.BytesIO(), io.BytesIO()
    assert replay_lines(io.BytesIO(mixed), _processor(), expected, io.StringIO()) == 0
    assert replay_file(str(path), _processor(), out=got, err=io.StringIO()) == 0
    assert got.getvalue() == expected.getvalue()
    assert got.getvalue().count(b"\n") == len(lines)


def _reads(chunks: list[bytes]) -> Callable[[int], bytes]:
    def read1(_size: int = -1) -> bytes:
        return chunks.pop(0) if chunks else b""

    return read1


def test_line_batches_cut_lines_split_across_reads() -> None:
    data = b'{"a": 1}\n{"b": 2}\n{"c": 3}'
    for size in range(1, len(data) + 1):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        source = io.BufferedReader(io.BytesIO(b""))
        source.read1 = _reads(chunks)  # type: ignore[method-assign, assignment]  # a reader that returns these pieces
        assert [line for batch in line_batches(source) for line in batch] == data.split(b"\n")


def test_a_line_that_arrives_alone_is_flushed_before_the_next_read() -> None:
    lines = SAMPLE.read_bytes().splitlines(keepends=True)[:5]
    out = _Recorder()
    source = _Trickle(lines, out)
    assert replay_batches(line_batches(source), _processor(), out, io.StringIO()) == 0  # type: ignore[arg-type]
    # Before the k-th read, the answers to the k-1 lines read so far were all flushed.
    assert source.flushed_at_read == list(range(len(lines) + 1))
