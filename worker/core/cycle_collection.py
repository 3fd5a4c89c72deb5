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
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_resume = False  # whether the collector was enabled when the outermost pause began


@contextmanager
def cycle_collection_paused() -> Iterator[None]:
    """Hold off automatic cycle collection for the block (nests, and across threads)."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
