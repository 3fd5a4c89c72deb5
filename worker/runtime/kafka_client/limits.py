"""The sizes and times every Kafka client of the worker is held to; declared in ``worker.kafka_config``
(a leaf module the settings import too), named here for the runtime's producers and start-up checks."""

from __future__ import annotations

from worker.kafka_config import COMMIT_BUDGET_MS as COMMIT_BUDGET_MS
from worker.kafka_config import MAX_RECORD_BYTES as MAX_RECORD_BYTES
from worker.kafka_config import PER_WORKER_TRANSACTION_TIMEOUT_MS as PER_WORKER_TRANSACTION_TIMEOUT_MS
from worker.kafka_config import RECORD_BUDGET_MS as RECORD_BUDGET_MS
from worker.kafka_config import TRANSACTION_TIMEOUT_MS as TRANSACTION_TIMEOUT_MS
from worker.kafka_config import transaction_timeout_ms as transaction_timeout_ms
