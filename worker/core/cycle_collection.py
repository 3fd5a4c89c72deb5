"""The cyclic garbage collector held off while one record is processed.

A record's work allocates objects that all stay live until its outcome is
written (the validated envelope, the output dicts): a collection in between
frees nothing, yet walks them, and on a record of many small objects (an
8 MiB logprob record holds ~190,000 entries) those walks cost as much as the
work itself. Collection resumes when the record is done, so cyclic garbage
waits for one record at most. Reference counting is untouched.
"""

from __future__ import annotations

import gc
import threading
from contextlib import AbstractContextManager
from types import TracebackType

_lock = threading.Lock()
_depth = 0
_resume = False  # whether the collector was enabled when the outermost pause began


class _Paused(AbstractContextManager[None]):
    """A plain context manager: entered once per record, where ``@contextmanager``'s generator
    cost several µs (a tenth of a record)."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _depth, _resume
        with _lock:
            if _depth == 0:
                _resume = gc.isenabled()
                gc.disable()
            _depth += 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()


_PAUSED = _Paused()


def freeze_startup_objects() -> None:
    """Once start-up is done: what is alive now (schemas, tokenizer tables, parser vocabularies,
    modules) lives until exit, so the collector stops re-scanning it while records come and go."""
    gc.collect()
    gc.freeze()


def cycle_collection_paused() -> AbstractContextManager[None]:
    """Hold off automatic cycle collection for the block (nests, and across threads)."""
    return _PAUSED
