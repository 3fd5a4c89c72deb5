"""SIGTERM while a command starts: the long-running ones exit 0, the others die by the signal.

Seen in CI: a replacement worker still importing when the test stopped its group died by SIGTERM
(status -15), because its graceful handling began only once logging was configured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.golden_cases import MODELS_DIR
from tests.paths import REPO_ROOT
from worker import cli, stop_signals

QWEN3 = str(MODELS_DIR / "qwen3")


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (``SigCgt`` in ``/proc/PID/status``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (sig - 1) & 1)


def _stop_while_starting(
    command: list[str], sig: signal.Signals, *, after: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Start ``command``, send ``sig`` once it catches SIGTERM (and, with ``after``, once that text is in
    its log), and wait for the end.

    SIGTERM, whatever ``sig`` is: the interpreter catches SIGINT from its first instant."""
    with tempfile.TemporaryFile("w+") as log:  # read while it runs: a pipe would need a reader thread
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", *command],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )

        def logged() -> str:
            log.seek(0)
            return log.read()

        deadline = time.monotonic() + 60
        while not _catches(proc.pid, signal.SIGTERM) or (after is not None and after not in logged()):
            assert proc.poll() is None, logged()
            assert time.monotonic() < deadline, f"never ready for the signal:\n{logged()}"
            time.sleep(0.005)
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"still running 60 s after the signal:\n{logged()}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, "", logged())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_stopped_while_it_imports_exits_0(sig: signal.Signals) -> None:
    # Nothing listens on port 1: a worker that went on past the stop would fail to reach Kafka.
    done = _stop_while_starting(["run", "--bootstrap-servers", "127.0.0.1:1", "--tokenizer", QWEN3], sig)
    assert done.returncode == 0, done.stderr
    assert "stopped before joining the group" in done.stderr
    assert "cannot reach Kafka" not in done.stderr


def test_a_short_command_stopped_while_it_imports_dies_by_the_signal() -> None:
    # ``replay`` has no graceful stop: the signal it got while starting is delivered again.
    done = _stop_while_starting(["replay", "-"], signal.SIGTERM)
    assert done.returncode == -signal.SIGTERM, done.stderr


def test_the_command_line_catches_the_signals_before_anything_slow_is_imported() -> None:
    # The window in which a stop kills instead of stopping: everything imported before ``main``.
    slow = ("pydantic", "aiokafka", "transformers", "tokenizers", "confluent_kafka")
    light = ("worker", "worker.cli", "worker.stop_signals")
    probe = (
        "import sys, worker.cli; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {slow!r} "
        f"or m.split('.')[0] == 'worker' and m not in {light!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def _missing_topics() -> dict[str, str]:
    return {name: f"never-created-{name}-{uuid.uuid4().hex[:8]}" for name in ("in", "out", "requests")}


def _pipeline_end(name: str, bootstrap: str, topics: dict[str, str]) -> list[str]:
    if name == "gateway":
        return [
            "gateway",
            "--bootstrap-servers",
            bootstrap,
            "--port",
            "0",
            "--allow-no-api-key",
            "--requests-topic",
            topics["requests"],
            "--output-topic",
            topics["out"],
        ]
    return [
        "ingest",
        "--bootstrap-servers",
        bootstrap,
        "--metrics-port",
        "0",
        "--render-url",
        "http://127.0.0.1:1",
        "--input-topic",
        topics["in"],
        "--output-topic",
        topics["out"],
        "--requests-topic",
        topics["requests"],
    ]


@pytest.mark.kafka
@pytest.mark.parametrize("end", ["gateway", "ingest"])
@pytest.mark.parametrize("when", ["importing", "waiting for its topics"])
def test_a_pipeline_end_stopped_while_it_starts_exits_0(kafka_bootstrap: str, end: str, when: str) -> None:
    # Its topics never exist: start-up would wait for them without end (it used to ignore the stop
    # there, or die by the signal while importing).
    command = _pipeline_end(end, kafka_bootstrap, _missing_topics())
    after = "waiting for topic(s)" if when == "waiting for its topics" else None
    done = _stop_while_starting(command, signal.SIGTERM, after=after)
    assert done.returncode == 0, done.stderr
    assert "stopped before" in done.stderr


# --- the contract in one process ------------------------------------------------------------------


class Seen:
    """A SIGTERM handler that counts, installed before the command line runs (as a host process's)."""

    def __init__(self) -> None:
        self.count = 0
        self.before = signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum: int, frame: object) -> None:
        self.count += 1

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self.before)


def test_a_recorded_signal_is_delivered_again_on_release_to_the_handler_from_before() -> None:
    seen = Seen()
    try:
        stop_signals.catch_early()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop_signals.requested() and seen.count == 0
        stop_signals.release()
        assert seen.count == 1 and not stop_signals.requested()
        assert signal.getsignal(signal.SIGTERM) == seen.handle
    finally:
        seen.restore()


def test_a_graceful_loop_is_stopped_at_once_and_the_handler_from_before_comes_back() -> None:
    seen = Seen()
    try:
        stop_signals.catch_early()
        os.kill(os.getpid(), signal.SIGTERM)  # while "importing"

        async def command() -> bool:
            stop = asyncio.Event()
            stop_signals.hand_over(asyncio.get_running_loop(), stop.set)
            forever = asyncio.ensure_future(asyncio.Event().wait())  # topics that never come
            return await stop_signals.finished_before(forever, stop)

        assert asyncio.run(command()) is False
        stop_signals.release(redeliver=False)
        assert seen.count == 0
        assert signal.getsignal(signal.SIGTERM) == seen.handle
    finally:
        seen.restore()


def test_a_signal_while_the_arguments_are_read_is_delivered_when_no_command_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = Seen()
    real = cli.build_parser

    def signalled_parser(command: str | None = None) -> argparse.ArgumentParser:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(command)

    monkeypatch.setattr(cli, "build_parser", signalled_parser)
    try:
        with pytest.raises(SystemExit):
            cli.main(["replay", "--no-such-flag"])
        assert seen.count == 1
    finally:
        seen.restore()


def test_finished_before_returns_the_step_or_its_error_when_it_ends_first() -> None:
    async def scenario() -> None:
        stop = asyncio.Event()

        async def fails() -> None:
            raise ValueError("no such topic")

        assert await stop_signals.finished_before(asyncio.ensure_future(asyncio.sleep(0)), stop)
        with pytest.raises(ValueError, match="no such topic"):
            await stop_signals.finished_before(asyncio.ensure_future(fails()), stop)

    asyncio.run(scenario())


def test_the_command_line_run_off_the_main_thread_leaves_the_signals_alone() -> None:
    before = signal.getsignal(signal.SIGTERM)
    outcome: list[int] = []
    thread = threading.Thread(
        target=lambda: outcome.append(cli.main(["replay", "/dev/null", "--tokenizer", QWEN3]))
    )
    thread.start()
    thread.join(60)
    assert outcome == [0]
    assert signal.getsignal(signal.SIGTERM) is before
