"""The per-record observability hook of a partition: trace context, spans, GenAI metrics.

``OwnedPartition`` calls ``observe(record, result)`` once per processed record and sends the
returned headers with every record the result causes; ``expired(result)`` for a request closed
by its TTL. One observer serves a worker's partitions (one event loop, no locking). The GenAI
metrics need the worker's ``Derenderer`` wrapped by ``measured`` (``Worker`` does that).
"""

from __future__ import annotations

from typing import Any

from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import ProcessResult
from worker.runtime.observability.genai_metrics import GenAiMetrics
from worker.runtime.observability.metrics import Metrics
from worker.runtime.observability.tracing import (
    NO_HEADERS,
    NO_SPANS,
    Headers,
    RecordInfo,
    SpanEvent,
    Spans,
    propagated,
)


class RecordObserver:
    """``metrics``: where the GenAI metrics go (none: not counted); ``propagate``: copy trace headers."""

    def __init__(
        self,
        group_id: str | None,
        spans: Spans = NO_SPANS,
        *,
        metrics: Metrics | None = None,
        propagate: bool = True,
    ) -> None:
        if spans is not NO_SPANS and group_id is None:
            raise ValueError("spans name the consumer group: an observer with spans needs its group id")
        self.group_id = group_id  # None only without spans: nothing reports it
        self.spans = spans
        self.genai = GenAiMetrics(metrics) if metrics is not None else None
        self.propagate = propagate

    def measured(self, derenderer: Derenderer) -> Derenderer:
        """The derenderer the worker's processors must use for the GenAI metrics to see tokens."""
        return self.genai.measured(derenderer) if self.genai is not None else derenderer

    def observe(self, record: Any, result: ProcessResult) -> Headers:
        """The trace headers for the records ``result`` causes (``record``: a ``ConsumedRecord``)."""
        tokens = self.genai.observe(record, result) if self.genai is not None else None
        headers = propagated(record.headers) if self.propagate else NO_HEADERS
        if self.spans is NO_SPANS:
            return headers
        info = RecordInfo(record.topic, record.partition, record.offset, self._group())
        return self.spans.observe(
            SpanEvent(result.request_id, info, headers, result.output, result.closed, tokens)
        )

    def expired(self, result: ProcessResult) -> Headers:
        """A request closed by its TTL: counted, its span ends; the 408 record continues its trace."""
        if self.genai is not None:
            self.genai.observe(None, result)
            self.genai.expired(result)
        if self.spans is NO_SPANS or result.request_id is None:
            return NO_HEADERS
        info = RecordInfo("", -1, -1, self._group())
        return self.spans.observe(SpanEvent(result.request_id, info, NO_HEADERS, result.output, True))

    def _group(self) -> str:
        assert self.group_id is not None  # an observer with spans has one (``__init__``)
        return self.group_id

    def partition_closed(self, partition: int) -> None:
        """The partition's requests continue elsewhere: end their spans here."""
        self.spans.close_partition(partition)

    def shutdown(self) -> None:
        self.spans.shutdown()


NO_OBSERVER = RecordObserver(None)  # no spans, no metrics: no group to name
