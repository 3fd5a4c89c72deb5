"""The cycle collector is held off for one record's work and always handed back as it was."""

from __future__ import annotations

import gc

import pytest

from worker.core.cycle_collection import cycle_collection_paused


def test_paused_inside_and_restored_after_nested_pauses_and_errors() -> None:
    assert gc.isenabled()
    with cycle_collection_paused():
        assert not gc.isenabled()
        with pytest.raises(ValueError, match="a record's failure"), cycle_collection_paused():
            raise ValueError("a record's failure")
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    try:
        with cycle_collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
