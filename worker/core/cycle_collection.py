"""The cyclic garbage collector held off while one record is processed.

A record's work allocates objects that all stay live until its outcome is
written (the validated envelope, the output dicts): a collection in between
frees nothing, yet walks them, and on a record of many small objects (an
8 MiB logprob record holds ~190,000 entries) those walks cost as much as the
work itself. Collection resumes when the record is done, so cyclic garbage
waits for one record at most. Reference counting is untouched.

A pause is a pair of calls around a ``try``/``finally``, not a context manager:
it runs once per record, where a ``with`` block's calls cost most of a µs.
Pauses nest and may overlap across threads: the collector is back as it was
once the last one ends.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_depth = 0
_resume = False  # whether the collector was enabled when the outermost pause began


def pause_cycle_collection() -> None:
    """Hold off automatic cycle collection until the matching ``resume_cycle_collection``."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1


def resume_cycle_collection() -> None:
    """End one pause (call it in a ``finally``)."""
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0 and _resume:
            gc.enable()


def freeze_startup_objects() -> None:
    """Once start-up is done: what is alive now (schemas, tokenizer tables, parser vocabularies,
    modules) lives until exit, so the collector stops re-scanning it while records come and go."""
    gc.collect()
    gc.freeze()
