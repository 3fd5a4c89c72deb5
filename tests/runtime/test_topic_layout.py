"""The one layout rule of the four topics: the state topic mirrors the input topic's partitions."""

from __future__ import annotations

import pytest

from tests.partition_fakes import TOPICS
from worker.errors import ConfigurationError
from worker.runtime.topics import check_layout


def test_state_topic_must_mirror_input_partitions() -> None:
    check_layout(TOPICS, {"in": 6, "out": 3, "state": 6, "dlq": 1})
    check_layout(TOPICS, {"in": 6, "out": 3, "state": 12, "dlq": 1})  # mid-way through growing both
    with pytest.raises(ConfigurationError, match="needs at least as many"):
        check_layout(TOPICS, {"in": 6, "out": 6, "state": 3, "dlq": 6})
    with pytest.raises(ConfigurationError, match="missing topics"):
        check_layout(TOPICS, {"in": 6, "out": 6, "state": 6})
