"""Every metric the runtime emits, named in one place (as getsentry/arroyo does).

Counters end in a plural noun, timings in ``_ms``, gauges describe a current level.
``prometheus_export`` serves them on ``/metrics`` (dots become underscores, counters get
``_total``, timings become ``_seconds`` histograms); labels travel in the name (``labelled``).
"""

from __future__ import annotations

from typing import Final

# --- records in ---------------------------------------------------------------------------
RECORDS_CONSUMED: Final = "derender.records.consumed"
RECORDS_DUPLICATE: Final = "derender.records.duplicate"
RECORDS_DEAD_LETTERED: Final = "derender.records.dead_lettered"
RECORDS_SKIPPED_STALE: Final = "derender.records.skipped_stale"
PROCESS_ERRORS: Final = "derender.process.errors"
# Dead-lettered after resetting their partition --max-record-retries times in a row (``poison``).
RECORDS_POISON_SKIPPED: Final = "derender.records.poison_skipped"

# --- records out --------------------------------------------------------------------------
OUTPUTS_PRODUCED: Final = "derender.outputs.produced"
REQUESTS_CLOSED: Final = "derender.requests.closed"
REQUESTS_EXPIRED: Final = "derender.requests.expired"
REQUESTS_OPEN: Final = "derender.requests.open"  # gauge

# --- state topic --------------------------------------------------------------------------
STATE_SNAPSHOTS_WRITTEN: Final = "derender.state.snapshots_written"
STATE_TOMBSTONES_WRITTEN: Final = "derender.state.tombstones_written"
STATE_RESTORED_REQUESTS: Final = "derender.state.restored_requests"
STATE_RESTORE_MS: Final = "derender.state.restore_ms"
# Input records re-read at a restore to bring checkpoints up to the committed offset (``state_changelog``).
STATE_REPLAYED_RECORDS: Final = "derender.state.replayed_records"

# --- commits ------------------------------------------------------------------------------
COMMITS: Final = "derender.commits"
COMMITS_FAILED: Final = "derender.commits.failed"
COMMITS_FORCED: Final = "derender.commits.forced_by_backpressure"
COMMIT_MS: Final = "derender.commit_ms"
COMMIT_FLUSH_MS: Final = "derender.commit.flush_ms"  # outputs + state acknowledged
COMMIT_OFFSETS_MS: Final = "derender.commit.offsets_ms"  # AddOffsetsToTxn + TxnOffsetCommit
COMMIT_END_TXN_MS: Final = "derender.commit.end_txn_ms"  # EndTxn
COMMIT_LAG_MS: Final = "derender.commit.lag_ms"  # oldest input's create time -> its commit
UNCOMMITTED_RECORDS: Final = "derender.uncommitted_records"  # gauge

# --- group membership ---------------------------------------------------------------------
PARTITIONS_ASSIGNED: Final = "derender.partitions.assigned"
PARTITIONS_REVOKED: Final = "derender.partitions.revoked"
PARTITION_RESETS: Final = "derender.partitions.resets"
RESETS_BY_RECORD: Final = "derender.partitions.resets_by_record"  # a record's handling failed
COMMITS_ISOLATED: Final = "derender.commits.isolated"  # one-record commits after a failed commit
OBSERVER_ERRORS: Final = "derender.observer.errors"  # tracing / GenAI metrics failed on a record
LAYOUT_ERRORS: Final = "derender.partitions.layout_errors"  # assigned input partitions without state
PARTITIONS_OWNED: Final = "derender.partitions.owned"  # gauge
PARTITIONS_PAUSED: Final = "derender.partitions.paused"  # gauge: tripped dead-letter breakers
REBALANCES: Final = "derender.rebalances"  # assignments received (one per group rebalance)
CONSUMER_LAG: Final = "derender.consumer.lag"  # gauge{partition}: last stable offset - position

# --- records out, per topic (labelled topic=...) -------------------------------------------
RECORDS_PRODUCED: Final = "derender.records.produced"  # {topic}: outputs, dead letters, state
SEQUENCE_GAPS: Final = "derender.records.gaps"  # SequenceGapError outputs

# --- timings --------------------------------------------------------------------------------
DERENDER_MS: Final = "derender.derender_ms"  # processor.process of one record
RECORD_AGE_MS: Final = "derender.record.age_ms"  # input create time -> start of its processing

# --- memory ---------------------------------------------------------------------------------
PARSERS_LIVE: Final = "derender.parsers.live"  # gauge: parser sessions kept alive
PARSER_EVICTIONS: Final = "derender.parsers.evicted"  # each evicted parser is replayed on next use
STATE_BYTES_WRITTEN: Final = "derender.state.bytes_written"  # snapshot bytes written to the state topic
STATE_BYTES: Final = (
    "derender.state.bytes"  # gauge: estimated live bytes of request state (the cap's measure)
)
REQUESTS_REJECTED: Final = "derender.requests.rejected"  # {cap}: new requests refused at a memory cap

# --- transactions and the dead-letter breaker -----------------------------------------------
TRANSACTIONS_ABORTED: Final = "derender.transactions.aborted"  # committed ones: COMMITS
DLQ_BREAKER_TRIPS: Final = "derender.dead_letters.breaker_trips"

# --- the memory caps, so dashboards and alerts can compare the levels above with them --------
REQUESTS_OPEN_LIMIT: Final = "derender.requests.open_limit"  # gauge: --max-open-requests (0: no cap)
STATE_BYTES_LIMIT: Final = "derender.state.bytes_limit"  # gauge: --max-state-bytes (0: no cap)

# --- GenAI (OpenTelemetry's GenAI conventions; see ``genai_metrics`` for the sources) -------------
GEN_AI_TIME_TO_FIRST_TOKEN_MS: Final = "gen_ai.server.time_to_first_token_ms"  # {model}
GEN_AI_TIME_PER_OUTPUT_TOKEN_MS: Final = "gen_ai.server.time_per_output_token_ms"  # {model}
# {model, token_type}: token_type is reasoning | content | tool_call
GEN_AI_OUTPUT_TOKENS: Final = "gen_ai.server.output_tokens"
GEN_AI_REQUESTS: Final = "gen_ai.server.requests"  # {model, finish_reason}: finished choices
GEN_AI_FINISHED_OUTPUT_TOKENS: Final = "gen_ai.server.finished_output_tokens"  # {model, finish_reason}
ERROR_RECORDS: Final = "derender.error_records"  # {code}: error records (the HTTP status vLLM would answer)

# --- event loop and the pipeline's ingest ----------------------------------------------------
# How late the loop heartbeat woke (``loop_heartbeat``): a loop held by slow work shows here first.
LOOP_LAG_MS: Final = "derender.loop.lag_ms"
INGEST_PARTITIONS_OWNED: Final = "derender.ingest.partitions_owned"  # gauge
INGEST_REQUESTS_RUNNING: Final = "derender.ingest.requests_running"  # gauge
