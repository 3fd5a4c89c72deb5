"""The commit schedule on its own: due times from the first record's create time, the in-batch
commit, the poll timeout, the forced commit and the running estimate (clock readings passed in)."""

from __future__ import annotations

import pytest

from worker.runtime.commit_schedule import MAX_POLL_TIMEOUT_MS, CommitSchedule


def test_the_first_record_after_a_commit_sets_the_due_time_and_later_ones_keep_it() -> None:
    schedule = CommitSchedule(interval_ms=100, max_uncommitted_records=10)
    assert schedule.due_at is None and schedule.poll_timeout_ms(5.0) == MAX_POLL_TIMEOUT_MS
    # Created 40 ms before it was handled: 60 ms are left of its interval.
    schedule.record_handled(timestamp_ms=9_960, now=5.0, wall_s=10.0)
    assert schedule.due_at == pytest.approx(5.06)
    schedule.record_handled(timestamp_ms=10_000, now=5.05, wall_s=10.05)
    assert schedule.due_at == pytest.approx(5.06)
    assert schedule.poll_timeout_ms(5.03) == 30
    assert not schedule.due(5.059) and schedule.due(5.061)
    schedule.periodic_commit_started()
    assert schedule.due_at is None and not schedule.due(9.0)


def test_a_batch_commits_within_only_after_an_interval_of_open_work() -> None:
    schedule = CommitSchedule(interval_ms=100, max_uncommitted_records=10)
    # An old backlog record is due at once, but the transaction opened only now.
    schedule.record_handled(timestamp_ms=0, now=1.0, wall_s=100.0)
    assert schedule.due(1.0)
    assert not schedule.due_within_batch(1.05)
    assert schedule.due_within_batch(1.1)


def test_expired_work_commits_an_interval_from_now_unless_already_due_earlier() -> None:
    schedule = CommitSchedule(interval_ms=200, max_uncommitted_records=10)
    schedule.work_without_record(now=3.0)
    assert schedule.due_at == pytest.approx(3.2)
    schedule.work_without_record(now=3.1)
    assert schedule.due_at == pytest.approx(3.2)


def test_the_estimate_follows_commit_durations_and_leads_the_next_commit() -> None:
    schedule = CommitSchedule(interval_ms=100, max_uncommitted_records=10)
    for _ in range(50):
        schedule.periodic_commit_took(0.02)
    assert schedule.estimate_s == pytest.approx(0.02, abs=1e-4)
    schedule.record_handled(timestamp_ms=10_000, now=0.0, wall_s=10.0)
    assert schedule.due_at == pytest.approx(0.08, abs=1e-3)


def test_uncommitted_records_force_a_commit_at_the_cap() -> None:
    schedule = CommitSchedule(interval_ms=100, max_uncommitted_records=3)
    assert not schedule.forced(2) and schedule.forced(3)
