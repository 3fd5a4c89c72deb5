"""Settings that cannot work are refused at start-up (a one-line configuration error, exit 2).

Each of these would otherwise start and then fail over and over, far from its cause:

* **commit interval vs. transaction timeout** (exactly-once): a transaction stays open for up
  to one commit interval plus the commit itself; past ``TRANSACTION_TIMEOUT_MS`` the broker aborts
  it, so every transaction would abort and the partition reset forever.
* **rebalance timeout vs. a batch plus a commit**: a revocation waits for the batch in progress
  and then commits it before the member rejoins; a member that rejoins after the rebalance
  timeout is dropped from the group, which rebalances again.
* **``max.message.bytes`` of the output, state and dead-letter topics** (read with
  ``describe_configs``): the producers send records up to ``MAX_RECORD_BYTES``; a topic that
  accepts less rejects them only when the transaction commits, long after the record that made
  them was processed.

The per-record and per-commit budgets are deliberately generous: a record's work is bounded
(O(its tokens + a constant window)) and an ordinary one takes tens of microseconds; a commit
takes milliseconds, and one slower than ``COMMIT_BUDGET_MS`` means the cluster is in trouble.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.errors import ConfigurationError
from worker.runtime.config import KafkaSettings, TopicNames
from worker.runtime.delivery import MAX_RECORD_BYTES, TRANSACTION_TIMEOUT_MS

RECORD_BUDGET_MS = 10
COMMIT_BUDGET_MS = 10_000
MAX_MESSAGE_BYTES = "max.message.bytes"


def check_settings(settings: KafkaSettings) -> None:
    """Raise ``ConfigurationError`` for flag combinations that cannot work."""
    if settings.exactly_once and settings.commit_interval_ms + COMMIT_BUDGET_MS > TRANSACTION_TIMEOUT_MS:
        raise ConfigurationError(
            f"--commit-interval-ms {settings.commit_interval_ms} leaves no room for the commit within the "
            f"transaction timeout of {TRANSACTION_TIMEOUT_MS} ms: use at most "
            f"{TRANSACTION_TIMEOUT_MS - COMMIT_BUDGET_MS}"
        )
    needed = settings.max_poll_records * RECORD_BUDGET_MS + COMMIT_BUDGET_MS
    if settings.rebalance_timeout_ms < needed:
        raise ConfigurationError(
            f"--rebalance-timeout-ms {settings.rebalance_timeout_ms} is shorter than a batch of "
            f"--max-poll-records {settings.max_poll_records} plus a commit ({needed} ms): raise it or "
            "lower --max-poll-records"
        )


def check_record_limits(topics: TopicNames, limits: Mapping[str, int | None]) -> None:
    """Raise unless every topic the worker writes accepts records as large as its producers send.

    ``limits``: ``max.message.bytes`` per topic name (``None``: not readable, e.g. no
    DescribeConfigs permission; then the check is skipped for that topic, with no false alarm).
    """
    for topic in (topics.output, topics.state, topics.dlq):
        limit = limits.get(topic)
        if limit is not None and limit < MAX_RECORD_BYTES:
            raise ConfigurationError(
                f"topic {topic!r} has {MAX_MESSAGE_BYTES}={limit}, below the {MAX_RECORD_BYTES} bytes the "
                f"worker's producers may send: raise it (`topics create` sets {MAX_RECORD_BYTES})"
            )


def parse_max_message_bytes(responses: list[Any]) -> dict[str, int | None]:
    """``max.message.bytes`` per topic from ``AIOKafkaAdminClient.describe_configs`` responses."""
    limits: dict[str, int | None] = {}
    for response in responses:
        for error_code, _message, _type, name, entries in response.resources:
            value = None
            if error_code == 0:
                value = next(
                    (int(e[1]) for e in entries if e[0] == MAX_MESSAGE_BYTES and e[1] is not None), None
                )
            limits[name] = value
    return limits
