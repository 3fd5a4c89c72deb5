"""Settings that cannot work are refused at start-up (a one-line configuration error, exit 2).

Each of these would otherwise start and then fail over and over, far from its cause:

* **no broker at the bootstrap address**: asked first, with one admin connection, before the
  tokenizer loads; librdkafka would otherwise retry and log every attempt for its whole timeout
  (about 30 s and hundreds of lines) before the same one-line error.
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

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from worker.errors import ConfigurationError, KafkaUnreachableError
from worker.runtime.kafka_client.base import MAX_MESSAGE_BYTES
from worker.runtime.kafka_client.limits import MAX_RECORD_BYTES
from worker.runtime.topics import TopicNames, partition_counts

if TYPE_CHECKING:
    from worker.settings import KafkaSettings


def unreachable(address: str) -> ConfigurationError:
    """The one line a start with no broker at ``address`` ends with."""
    return ConfigurationError(
        f"cannot reach Kafka at {address}; start a local broker with "
        "`deploy/local/kafka start` (127.0.0.1:19092), or point --bootstrap-servers / "
        "KAFKA_BOOTSTRAP_SERVERS at a running one"
    )


async def check_reachable(settings: KafkaSettings) -> None:
    """Raise :func:`unreachable` unless a broker answers at the bootstrap address."""
    library_log = logging.getLogger("aiokafka")
    level = library_log.level
    library_log.setLevel(logging.CRITICAL)  # its "Unable connect" line would say it twice
    try:
        await partition_counts(
            settings.bootstrap_servers, [settings.topics.input], settings.security.client_kwargs()
        )
    except KafkaUnreachableError as exc:
        raise unreachable(settings.bootstrap_servers) from exc
    finally:
        library_log.setLevel(level)


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
