"""SIGTERM and SIGINT from the moment the process starts, for the commands that stop gracefully.

An orchestrator may stop a process at any time, also while it is still importing or loading a
tokenizer (seconds; tens on a loaded node): a scale-in, a rolling update, a replacement that is no
longer needed. A long-running command (``run``, ``ingest``, ``gateway``) treats that as a stop
request and exits 0, not as a death by signal. Every other command keeps the default behaviour.

The contract, in the order a process goes through it:

- ``catch_early()``: the command line's first step; a signal is recorded instead of acted on.
- ``hand_over(loop, stop)``: a graceful command's event loop takes both signals; a signal already
  recorded calls ``stop`` at once.
- ``release()``: any other command, before it starts; the default handlers come back and a signal
  already recorded is delivered again, so the process ends as it would have without ``catch_early``.
  ``release(redeliver=False)`` after a graceful command returned: it answered what it was sent.

Stdlib only: it is imported before anything slow.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []  # the signals seen while recording (the first one is re-delivered)
_previous: dict[int, signal._HANDLER] = {}


def _record(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)


def catch_early() -> None:
    """Record SIGTERM / SIGINT from now on (idempotent)."""
    if _previous:
        return
    for sig in STOP_SIGNALS:
        _previous[sig] = signal.signal(sig, _record)


def requested() -> bool:
    """Whether a stop signal arrived while recording."""
    return bool(_received)


def hand_over(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    """``loop`` calls ``stop`` on SIGTERM / SIGINT from now on, and at once for one already received."""
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
    _previous.clear()  # the loop owns the signals now; it restores the defaults when it closes
    if _received:
        _received.clear()
        loop.call_soon(stop)


def release(*, redeliver: bool = True) -> None:
    """The handlers from before ``catch_early``; a signal received meanwhile is delivered again."""
    for sig, handler in _previous.items():
        signal.signal(sig, handler)
    _previous.clear()
    first = _received[0] if _received else None
    _received.clear()
    if first is not None and redeliver:
        signal.raise_signal(first)
