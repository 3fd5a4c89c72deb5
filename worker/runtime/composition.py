"""The composition root: every part a command is made of, built from its settings and passed on.

``worker.settings`` is data (flags, environment, bounds); this module turns it into objects: the
derenderer (it loads the tokenizer), the envelope processors, the live-parser pool, the memory
budget, the state keys and changelogs, the owned partitions. (The Kafka security is built by
``kafka_security_settings.load_kafka``, the logging set by ``structured_logging.configure``: the pipeline's
commands use them too, without the core.)
Each part is given everything it uses in its constructor, so what a worker is made of is read here,
once, and a test builds the same parts the same way.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from worker.core.derenderer import Derenderer, ServerOptions
from worker.core.envelope_processor import Admission, EnvelopeProcessor
from worker.core.live_parsers import LiveParserPool
from worker.core.model_dir import load_tokenizer
from worker.core.parsing import ChatParsing, adapter_for
from worker.core.vllm_version import VllmBehaviour
from worker.errors import ConfigurationError
from worker.runtime.dead_letters.poison import ResetTracker
from worker.runtime.dead_letters.policy import DeadLetterLimits, DeadLetterPolicy
from worker.runtime.delivery import Sink
from worker.runtime.kafka_client.base import TopicPartition
from worker.runtime.memory import MemoryBudget
from worker.runtime.observability.health_server import ReadinessState
from worker.runtime.observability.metrics import Metrics
from worker.runtime.observability.observer import RecordObserver
from worker.runtime.observability.tracing import NO_SPANS, Spans
from worker.runtime.partition import OwnedPartition
from worker.runtime.state import changelog as state_changelog
from worker.runtime.state.changelog import StateChangelog, StateKeys
from worker.settings import DeadLetterSettings, KafkaSettings, ModelSettings

log = logging.getLogger(__name__)

# --- the model: every command that derenders ----------------------------------------------------


def load_derenderer(model: ModelSettings) -> Derenderer:
    """The derenderer of ``model``: loads its tokenizer (seconds) and builds its parsers."""
    if model.tool_parser and not model.enable_auto_tool_choice:
        log.warning(
            "--tool-parser %s does nothing without --enable-auto-tool-choice (as in vLLM): "
            "tool calls stay text",
            model.tool_parser,
        )
    tokenizer = load_tokenizer(model.tokenizer)
    max_len = model.max_model_len or tokenizer.max_position_embeddings
    if max_len is None or max_len <= 0:
        raise ConfigurationError(
            "max_model_len is unknown: pass --max-model-len or give config.json a max_position_embeddings"
        )
    names = model.served_model_names or (os.path.basename(os.path.normpath(model.tokenizer)),)
    behaviour = VllmBehaviour.of(model.vllm_version)
    options = ServerOptions(
        served_model_names=names,
        max_model_len=max_len,
        max_logprobs=model.max_logprobs,
        max_n_sequences=model.max_n_sequences,
        behaviour=behaviour,
        return_tokens_as_token_ids=model.return_tokens_as_token_ids,
    )
    # None when no parser applies (a gpt-oss model always has one: Harmony, as in vLLM).
    parsing = ChatParsing.create(
        adapter_for(tokenizer),
        reasoning_parser=model.reasoning_parser,
        tool_parser=model.tool_parser,
        enable_auto_tool_choice=model.enable_auto_tool_choice,
        reread_window=model.parse_budget_window,
        reasoning_streams_all=behaviour.reasoning_engine_streams_all,
        llama3_json_on_engine=behaviour.llama3_json_on_engine,
    )
    return Derenderer(tokenizer, options, parsing)


def new_processor(
    model: ModelSettings,
    derenderer: Derenderer,
    *,
    live_parsers: LiveParserPool | None = None,
    admission: Admission | None = None,
    require_key: bool = False,
) -> EnvelopeProcessor:
    """A new processor (its own request state) sharing ``derenderer`` (and ``live_parsers``)."""
    return EnvelopeProcessor(
        derenderer,
        max_record_bytes=model.max_record_bytes,
        max_live_parsers=model.max_live_parsers,
        max_output_bytes=model.max_output_bytes,
        max_request_state_bytes=model.max_request_state_bytes,
        require_key=require_key,
        live_parsers=live_parsers,
        admission=admission,
    )


def load_processor(model: ModelSettings) -> EnvelopeProcessor:
    """One processor with its own derenderer: ``replay`` and the offline demo."""
    return new_processor(model, load_derenderer(model))


# --- the worker ---------------------------------------------------------------------------------


def dead_letter_limits(settings: DeadLetterSettings) -> DeadLetterLimits:
    return DeadLetterLimits(
        max_ratio=settings.dlq_max_ratio,
        window=settings.dlq_window,
        min_records=settings.dlq_min_records,
        max_consecutive=settings.dlq_max_consecutive,
    )


@dataclass(frozen=True, slots=True)
class WorkerParts:
    """What a ``Worker`` is made of besides its settings: built by ``worker_parts``, shared by its
    partitions (one pool, one budget, one breaker table, one observer for the whole worker)."""

    model: ModelSettings
    derenderer: Derenderer  # as measured by ``observer``: the processors use this one
    parsers: LiveParserPool
    budget: MemoryBudget
    metrics: Metrics
    readiness: ReadinessState
    dead_letters: DeadLetterPolicy
    resets: ResetTracker
    observer: RecordObserver
    keys: StateKeys  # the state topic's keys of this group

    def processor(self) -> EnvelopeProcessor:
        """A partition's processor: the worker's derenderer, parser pool and memory budget."""
        return new_processor(
            self.model,
            self.derenderer,
            live_parsers=self.parsers,
            admission=self.budget,  # new requests past a cap get a 503 (``memory``)
            require_key=True,  # key-less records are dead letters (placement by request_id)
        )


def worker_parts(
    settings: KafkaSettings,
    model: ModelSettings,
    derenderer: Derenderer,
    *,
    metrics: Metrics | None = None,
    readiness: ReadinessState | None = None,
    dead_letters: DeadLetterLimits | None = None,
    resets: ResetTracker | None = None,
    spans: Spans = NO_SPANS,
) -> WorkerParts:
    """The parts of a worker of ``settings`` over ``derenderer``. Left out: fresh metrics and
    readiness, a breaker that never trips (library use; ``run`` passes the flags' limits), resets
    at the default retries, no spans."""
    metrics = metrics if metrics is not None else Metrics()
    observer = RecordObserver(settings.group_id, spans, metrics=metrics)
    limits = dead_letters or DeadLetterLimits(max_ratio=None, max_consecutive=None)
    return WorkerParts(
        model=model,
        derenderer=observer.measured(derenderer),  # the GenAI metrics see the tokens
        parsers=LiveParserPool(model.max_live_parsers),  # --max-live-parsers is worker-wide
        budget=MemoryBudget(settings.max_open_requests, settings.max_state_bytes),
        metrics=metrics,
        readiness=readiness if readiness is not None else ReadinessState(),
        dead_letters=DeadLetterPolicy(limits),
        resets=resets if resets is not None else ResetTracker(),
        observer=observer,
        keys=StateKeys(settings.group_id),
    )


def owned_partition(
    settings: KafkaSettings,
    parts: WorkerParts,
    tp: TopicPartition,
    sink: Sink,
    position: int,
    restored: state_changelog.Restored,
    replay: list[Any],
    now: float,
    epoch: int,
) -> OwnedPartition:
    """A newly opened partition: a processor holding the restored requests (the inputs after their
    checkpoints replayed), its state changelog, and the worker's shared parts."""
    processor = parts.processor()
    state_changelog.install(processor, restored.checkpoints, now)
    replayed = state_changelog.replay_after(processor, restored.checkpoints, replay)
    changelog = StateChangelog(
        settings.topics.state,
        tp.partition,
        parts.keys,
        checkpoint_interval_s=settings.state_checkpoint_interval_ms / 1000,
    )
    changelog.restored(restored, replayed)
    return OwnedPartition(
        tp,
        processor,
        sink,
        settings.topics,
        parts.metrics,
        position=position,
        changelog=changelog,
        epoch=epoch,
        dead_letters=parts.dead_letters,
        budget=parts.budget,
        resets=parts.resets,
        observer=parts.observer,
    )
