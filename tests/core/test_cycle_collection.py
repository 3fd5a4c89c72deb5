"""The cycle collector is held off for one record's work and always handed back as it was."""

from __future__ import annotations

import gc
import threading

from tests.golden_cases import derenderer_for, sample_config
from worker.core.cycle_collection import pause_cycle_collection, resume_cycle_collection
from worker.core.envelope_processor import EnvelopeProcessor, JsonDict, ProcessResult


def test_paused_inside_and_restored_after_nested_pauses() -> None:
    assert gc.isenabled()
    pause_cycle_collection()
    assert not gc.isenabled()
    pause_cycle_collection()
    resume_cycle_collection()
    assert not gc.isenabled()  # the outer pause still holds
    resume_cycle_collection()
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    try:
        pause_cycle_collection()
        resume_cycle_collection()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_pauses_overlapping_in_threads_leave_the_collector_on() -> None:
    threads_count = 4
    barrier = threading.Barrier(threads_count)

    def records() -> None:
        barrier.wait()
        for _ in range(2_000):
            pause_cycle_collection()
            resume_cycle_collection()

    threads = [threading.Thread(target=records) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert gc.isenabled()


class _Failing(EnvelopeProcessor):
    def _process(self, value: bytes, key: bytes | None, source: JsonDict | None) -> ProcessResult:
        assert not gc.isenabled()  # the record runs paused
        raise RuntimeError("a bug of ours")


def test_a_record_whose_processing_raises_hands_the_collector_back() -> None:
    processor = _Failing(derenderer_for(sample_config()))
    result = processor.process(b"{}")
    assert result.dead_letter is not None and isinstance(result.internal_error, RuntimeError)
    assert gc.isenabled()
