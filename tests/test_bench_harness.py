"""The Kafka benchmark's harness keeps its own collector out of the latencies it times."""

from __future__ import annotations

import gc

import pytest

from benchmarks.kafka_throughput import collector_held_off


def test_the_collector_is_held_off_and_what_lives_is_frozen_for_the_phase() -> None:
    alive = [object() for _ in range(1_000)]
    with collector_held_off():
        assert not gc.isenabled()
        assert gc.get_freeze_count() >= len(alive)
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_failing_phase_hands_the_collector_back() -> None:
    with pytest.raises(RuntimeError), collector_held_off():
        raise RuntimeError("send failed")
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
