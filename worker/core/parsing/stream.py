"""One streamed chat choice (vLLM's ``ChatStreamProcessor`` over a live parser)."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from worker.core.parsing.tool_choice import filter_parallel_delta, resolve_finish_reason
from worker.core.parsing.types import DeltaOut, ParseRequest


class ChoiceParser(Protocol):
    """One choice's live parser: ``CompositeParser``, or Harmony's ``HarmonyChoiceParser``."""

    def parse_delta(
        self, delta_text: str, delta_ids: list[int], prompt_token_ids: list[int] | None, finished: bool
    ) -> DeltaOut | None: ...


P = TypeVar("P", bound=ChoiceParser)


class ChatStreamSession(Generic[P]):
    """One choice's stream over its parser ``P`` (``ChatStreamSession[Any]``: any of them)."""

    def __init__(
        self,
        parser: P,
        request: ParseRequest,
        prompt_token_ids: list[int] | None,
        *,
        keep_tool_calls: bool,
    ) -> None:
        self._parser = parser
        self._request = request
        self._prompt_token_ids = prompt_token_ids
        self._keep_tool_calls = keep_tool_calls
        self._num_output_tokens = 0
        #: Settable: the carried stream state is authoritative after a replay.
        self.tools_streamed = False

    def step(
        self, delta_text: str, delta_token_ids: list[int], finish_reason: str | None
    ) -> tuple[DeltaOut | None, str | None]:
        """One record: ``delta_token_ids`` are the record's ids *including* a dropped stop token."""
        delta: DeltaOut | None
        if not delta_text and not delta_token_ids and not self._num_output_tokens:
            delta = DeltaOut()  # finished without output: unparsed final chunk
        else:
            delta = self._parser.parse_delta(
                delta_text, delta_token_ids, self._prompt_token_ids, finished=finish_reason is not None
            )
            if delta is not None and delta.tool_calls:
                if self._keep_tool_calls:
                    self.tools_streamed = True
                else:
                    delta.tool_calls = []
                    if not delta.content and not delta.reasoning:
                        delta = None
        self._num_output_tokens += len(delta_token_ids)
        if delta is not None:
            delta = filter_parallel_delta(delta, self._request)
        resolved = None
        if finish_reason is not None:
            resolved = resolve_finish_reason(finish_reason, self._request, self.tools_streamed)
        return delta, resolved
