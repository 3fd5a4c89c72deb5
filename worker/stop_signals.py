"""SIGTERM and SIGINT from the moment the process starts, for the commands that stop gracefully.

An orchestrator may stop a process at any time, also while it is still importing or loading a
tokenizer (seconds; tens on a loaded node): a scale-in, a rolling update, a replacement that is no
longer needed. A long-running command (``run``, ``ingest``, ``gateway``) treats that as a stop
request and exits 0, not as a death by signal. Every other command keeps the default behaviour.

The contract, in the order a process goes through it:

- ``catch_early()``: the command line's first step; a signal is recorded instead of acted on.
- ``hand_over(loop, stop)``: a graceful command's event loop takes both signals; a signal already
  recorded calls ``stop`` at once. Its start-up steps that can wait without end (topics that do not
  exist yet) run under ``finished_before(step, stop_event)``, so a stop does not wait for them.
- ``release()``: any other command, before it starts; the handlers from before ``catch_early`` come
  back and a signal already recorded is delivered again, so the process ends as it would have
  without ``catch_early``. ``release(redeliver=False)`` after a graceful command returned: it
  answered what it was sent.

Stdlib only: it is imported before anything slow.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

# SIGINT first: once SIGTERM is caught, both are (what a test waits for).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_received: list[int] = []  # the signals seen while recording (the first one is re-delivered)
_previous: dict[int, signal._HANDLER] = {}


def _record(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)


def catch_early() -> None:
    """Record SIGTERM / SIGINT from now on (idempotent)."""
    if _previous or threading.current_thread() is not threading.main_thread():
        return  # off the main thread (an in-process caller's): the signals are its host's business
    for sig in STOP_SIGNALS:
        _previous[sig] = signal.signal(sig, _record)


def requested() -> bool:
    """Whether a stop signal arrived while recording."""
    return bool(_received)


def hand_over(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    """``loop`` calls ``stop`` on SIGTERM / SIGINT from now on, and at once for one already received."""
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
    # ``_previous`` is kept: the closing loop puts the defaults back, ``release`` what was there before.
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


async def finished_before(step: asyncio.Future[T], stop: asyncio.Event) -> bool:
    """Wait for ``step`` or ``stop``, whichever comes first; ``step`` is cancelled on a stop.

    True when ``step`` finished (its error, if any, is raised), False when the stop came first."""
    stopped = asyncio.ensure_future(stop.wait())
    either: set[asyncio.Future[Any]] = {step, stopped}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        step.cancel()
        raise
    finally:
        stopped.cancel()
    if step.done():
        step.result()
        return True
    step.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await step
    return False
