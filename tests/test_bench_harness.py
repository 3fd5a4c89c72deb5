"""The Kafka benchmark's harness keeps its own collector out of the latencies it times."""

from __future__ import annotations

import asyncio
import gc

import pytest

from benchmarks.kafka_harness import collector_held_off, raise_failed_send


def test_the_collector_is_held_off_for_the_phase_and_handed_back() -> None:
    assert gc.isenabled()
    with collector_held_off():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_failing_phase_hands_the_collector_back() -> None:
    with pytest.raises(RuntimeError), collector_held_off():
        raise RuntimeError("send failed")
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled_and_frozen_objects_stay_frozen() -> None:
    kept: list[list[int]] = [[] for _ in range(1_000)]  # lists are tracked by the collector, so they freeze
    gc.freeze()
    gc.disable()
    try:
        with collector_held_off():
            pass
        assert not gc.isenabled()
        # Not equal to the count at the freeze: frozen objects that die leave the permanent generation.
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_failed_send_is_raised_from_the_settled_futures() -> None:
    loop = asyncio.new_event_loop()
    try:
        ok, failed = loop.create_future(), loop.create_future()
        ok.set_result(None)
        failed.set_exception(ConnectionError("broker gone"))
        raise_failed_send([ok])
        with pytest.raises(ConnectionError, match="broker gone"):
            raise_failed_send([ok, failed])
    finally:
        loop.close()
