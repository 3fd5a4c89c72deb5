"""A stop request ends the process even when a thread stays blocked (a Kafka call that never returns)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.paths import REPO_ROOT

BLOCKED = textwrap.dedent(
    """
    import threading
    from worker.commands.run import ExitDeadline

    # A non-daemon thread the interpreter would join at exit forever, as it joins an executor
    # thread stuck in a client call.
    threading.Thread(target=threading.Event().wait).start()
    ExitDeadline(0.2).start()
    """
)


def test_the_deadline_exits_a_process_whose_threads_never_finish() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert "exiting" in done.stderr


def test_the_deadline_is_started_once() -> None:
    # SIGTERM twice must not start a second timer (whose own countdown would begin later).
    script = BLOCKED.replace(
        "ExitDeadline(0.2).start()",
        "d = ExitDeadline(0.2)\nd.start()\nfirst = d._timer\nd.start()\n"
        "print('same' if d._timer is first else 'another', flush=True)",
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "same" and done.returncode == 1, done.stderr


STUCK_CALL = textwrap.dedent(
    """
    import asyncio
    import threading
    from worker.runtime.kafka_client.confluent_backend import _Thread

    async def main() -> None:
        thread = _Thread("stuck")
        call = asyncio.ensure_future(thread.run(threading.Event().wait))  # never returns
        await asyncio.sleep(0.1)
        call.cancel()  # given up, as a timed-out transactional call is

    asyncio.run(main())
    """
)


def test_a_client_call_given_up_does_not_keep_the_process_alive() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STUCK_CALL], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
