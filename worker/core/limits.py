"""The defaults of the core's limits (per request, per record, per worker), in a leaf module: the
settings declare their flags with these, the core falls back to them when built without settings."""

from __future__ import annotations

DEFAULT_MAX_LOGPROBS = 20
DEFAULT_MAX_N_SEQUENCES = 16384
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_LIVE_PARSERS = 10_000
# Under the producers' 16 MiB max request size, with room for the key and the batch overhead.
DEFAULT_MAX_OUTPUT_BYTES = 15 * 1024 * 1024
# A request's context plus progress (what its state records hold); under the output limit, so its
# context record (context + progress) always fits in one Kafka record.
DEFAULT_MAX_REQUEST_STATE_BYTES = 12 * 1024 * 1024
