"""SIGTERM while a command starts: the long-running ones exit 0, the others die by the signal.

Seen in CI: a replacement worker still importing when the test stopped its group died by SIGTERM
(status -15), because its graceful handling began only once logging was configured.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.golden_cases import MODELS_DIR
from tests.paths import REPO_ROOT


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (``SigCgt`` in ``/proc/PID/status``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (sig - 1) & 1)


def _stop_while_starting(command: list[str], sig: signal.Signals) -> subprocess.CompletedProcess[str]:
    """Start ``command``, send ``sig`` once it catches SIGTERM, and wait for the end.

    SIGTERM, whatever ``sig`` is: the interpreter catches SIGINT from its first instant."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *command],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not _catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the process never caught the signal"
        time.sleep(0.005)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_stopped_while_it_imports_exits_0(sig: signal.Signals) -> None:
    # Nothing listens on port 1: a worker that went on past the stop would fail to reach Kafka.
    done = _stop_while_starting(
        ["run", "--bootstrap-servers", "127.0.0.1:1", "--tokenizer", str(MODELS_DIR / "qwen3")], sig
    )
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
