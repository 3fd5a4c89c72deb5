"""The per-partition dead-letter circuit breaker (pure)."""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import pytest

from worker.errors import ConfigurationError, IllegalBreakerTransitionError
from worker.runtime.composition import dead_letter_limits
from worker.runtime.dead_letters.policy import (
    TRANSITIONS,
    BreakerState,
    DeadLetterLimits,
    DeadLetterPolicy,
    PartitionBreaker,
    TripCause,
)
from worker.settings import (
    DeadLetterSettings,
    add_arguments,
    load,
)


def _feed(policy: DeadLetterPolicy, partition: int, pattern: str) -> list[int]:
    """Feed ``pattern`` ('x' = dead letter, '.' = valid); the indexes at which a trip was returned."""
    trips = []
    for i, c in enumerate(pattern):
        trip = policy.observe(partition, f"bad {i}" if c == "x" else None, offset=i)
        if trip is not None:
            trips.append(i)
    return trips


def test_transition_table_is_closed_to_tripped_only() -> None:
    assert {
        BreakerState.CLOSED: frozenset({BreakerState.TRIPPED}),
        BreakerState.TRIPPED: frozenset(),
    } == TRANSITIONS
    breaker = PartitionBreaker(0, DeadLetterLimits(max_consecutive=1))
    breaker.observe("bad")
    assert breaker.state is BreakerState.TRIPPED
    with pytest.raises(IllegalBreakerTransitionError):
        breaker._to(BreakerState.CLOSED)


def test_ratio_below_threshold_never_trips() -> None:
    policy = DeadLetterPolicy(
        DeadLetterLimits(max_ratio=0.5, window=100, min_records=20, max_consecutive=None)
    )
    # 2 of every 5 dead-lettered (40 %) for 10,000 records: never above 50 %.
    assert _feed(policy, 0, "xx..." * 2000) == []
    assert not policy.is_tripped(0)
    # Exactly at the ratio is not above it.
    policy = DeadLetterPolicy(
        DeadLetterLimits(max_ratio=0.5, window=10, min_records=10, max_consecutive=None)
    )
    assert _feed(policy, 0, "x." * 1000) == []


def test_ratio_trips_once_the_window_holds_min_records() -> None:
    limits = DeadLetterLimits(max_ratio=0.5, window=100, min_records=20, max_consecutive=None)
    policy = DeadLetterPolicy(limits)
    # 3 of the first 4 are bad (75 %) but the window is too small to judge ...
    assert _feed(policy, 0, "xx.x") == []
    # ... until 20 records: x x . x then 16 more alternating ". x" -> 11 bad of 20 = 55 % at index 19.
    policy = DeadLetterPolicy(limits)
    trips = _feed(policy, 0, "xx.x" + ".x" * 8 + "x" * 5)
    assert trips == [19]
    trip = policy.tripped()[0]
    assert trip.cause is TripCause.RATIO
    assert (trip.invalid_in_window, trip.window_size) == (11, 20)
    assert trip.offset == 19 and trip.last_reason == "bad 19"
    assert (
        "partition 0 paused: 11 of the last 20 records were dead-lettered (at offset 19)" in trip.describe()
    )


def test_sliding_window_forgets_old_dead_letters() -> None:
    limits = DeadLetterLimits(max_ratio=0.5, window=10, min_records=10, max_consecutive=None)
    policy = DeadLetterPolicy(limits)
    # 5 bad then 5 good: 50 %, not above. Then every new bad record pushes out an old bad one.
    assert _feed(policy, 0, "xxxxx.....") == []
    breaker = policy.breaker(0)
    assert breaker.invalid_in_window == 5
    for _ in range(5):
        assert policy.observe(0, "bad") is None  # replaces a bad record: still 5 of 10
    assert breaker.invalid_in_window == 5
    assert policy.observe(0, "bad") is not None  # replaces a valid one: 6 of 10


def test_consecutive_trips() -> None:
    policy = DeadLetterPolicy(DeadLetterLimits(max_ratio=None, max_consecutive=20))
    trips = _feed(policy, 3, "." * 500 + "x" * 20 + "x" * 5)
    assert trips == [519]
    trip = policy.tripped()[3]
    assert trip.cause is TripCause.CONSECUTIVE and trip.consecutive == 20
    assert trip.as_json()["cause"] == "consecutive"
    assert "20 consecutive records were dead-lettered" in trip.describe()


def test_valid_records_reset_the_consecutive_count() -> None:
    policy = DeadLetterPolicy(DeadLetterLimits(max_ratio=None, max_consecutive=20))
    assert _feed(policy, 0, ("x" * 19 + ".") * 200) == []
    assert policy.breaker(0).consecutive == 0
    assert _feed(policy, 0, "x" * 19) == []
    assert policy.breaker(0).consecutive == 19


def test_per_partition_independence() -> None:
    policy = DeadLetterPolicy(DeadLetterLimits(max_ratio=0.5, window=10, min_records=5, max_consecutive=5))
    for i in range(5):
        assert policy.observe(1, None, i) is None
        trip = policy.observe(2, "bad", i)
    assert trip is not None and trip.partition == 2
    assert policy.is_tripped(2) and not policy.is_tripped(1) and not policy.is_tripped(0)
    assert list(policy.tripped()) == [2]
    assert policy.breaker(1).invalid_in_window == 0


def test_tripped_is_final_until_forgotten() -> None:
    policy = DeadLetterPolicy(DeadLetterLimits(max_consecutive=2, max_ratio=None))
    assert _feed(policy, 0, "xx") == [1]
    first = policy.tripped()[0]
    # Valid records after the trip change nothing; no second Trip is reported.
    assert _feed(policy, 0, "." * 100 + "xxxx") == []
    assert policy.is_tripped(0) and policy.tripped()[0] is first
    # forget() starts it over (the worker itself keeps breakers across revocations).
    policy.forget(0)
    assert not policy.is_tripped(0) and policy.tripped() == {}
    assert policy.breaker(0).state is BreakerState.CLOSED


def test_both_limits_off_never_trip() -> None:
    policy = DeadLetterPolicy(DeadLetterLimits(max_ratio=None, max_consecutive=None))
    assert _feed(policy, 0, "x" * 10_000) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_ratio": 1.0}, "--dlq-max-ratio"),
        ({"max_ratio": -0.1}, "--dlq-max-ratio"),
        ({"window": 0}, "--dlq-window"),
        ({"window": 10, "min_records": 11}, "--dlq-min-records"),
        ({"min_records": 0}, "--dlq-min-records"),
        ({"max_consecutive": 0}, "--dlq-max-consecutive"),
    ],
)
def test_invalid_limits_are_configuration_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        DeadLetterLimits(**kwargs)


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, DeadLetterSettings)
    assert dead_letter_limits(load(DeadLetterSettings, parser.parse_args([]))) == DeadLetterLimits()
    args = parser.parse_args(
        [
            "--dlq-max-ratio",
            "0.25",
            "--dlq-window",
            "50",
            "--dlq-min-records",
            "10",
            "--dlq-max-consecutive",
            "off",
        ]
    )
    assert dead_letter_limits(load(DeadLetterSettings, args)) == DeadLetterLimits(0.25, 50, 10, None)

    monkeypatch.setenv("DERENDER_DLQ_MAX_RATIO", "off")
    monkeypatch.setenv("DERENDER_DLQ_MAX_CONSECUTIVE", "7")
    parser = argparse.ArgumentParser()
    add_arguments(parser, DeadLetterSettings)
    limits = dead_letter_limits(load(DeadLetterSettings, parser.parse_args([])))
    assert (limits.max_ratio, limits.max_consecutive) == (None, 7)

    monkeypatch.setenv("DERENDER_DLQ_WINDOW", "many")
    with pytest.raises(ConfigurationError, match="DERENDER_DLQ_WINDOW"):
        load(DeadLetterSettings, parser.parse_args([]))


def test_window_counts_stay_exact_over_a_long_random_run() -> None:
    limits = DeadLetterLimits(max_ratio=None, window=37, min_records=1, max_consecutive=None)
    breaker = PartitionBreaker(0, limits)
    history: list[bool] = []
    for bad in itertools.islice(itertools.cycle([True, False, False, True, True, False, True]), 5000):
        breaker.observe("bad" if bad else None)
        history.append(bad)
        assert breaker.invalid_in_window == sum(history[-37:])
