"""The sizes and times every Kafka client of the worker is held to, and what the settings must leave
room for: a leaf module, so the settings, the producers and the start-up checks read one copy."""

from __future__ import annotations

from worker.runtime.kafka_client.base import TransactionalIdMode

# Snapshots carry the request and its prompt ids and can pass Kafka's 1 MiB default; the topics
# made by `topics create` allow this much (max.message.bytes).
MAX_RECORD_BYTES = 16 * 1024 * 1024
TRANSACTION_TIMEOUT_MS = 60_000
# Per worker, a crashed worker's transactional id is not taken over by the partitions' next owner:
# its open transaction holds back read_committed readers of every partition it wrote until the
# broker times it out (Kafka Streams' exactly-once v2 uses 10 s for the same reason).
PER_WORKER_TRANSACTION_TIMEOUT_MS = 15_000
# What one record and one commit may take, at most, inside a transaction and a rebalance.
RECORD_BUDGET_MS = 10
COMMIT_BUDGET_MS = 10_000


def transaction_timeout_ms(mode: TransactionalIdMode) -> int:
    if mode is TransactionalIdMode.PER_WORKER:
        return PER_WORKER_TRANSACTION_TIMEOUT_MS
    return TRANSACTION_TIMEOUT_MS
