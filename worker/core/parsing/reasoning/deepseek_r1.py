"""``deepseek_r1``: vLLM's legacy ``DeepSeekR1ReasoningParser`` (think-tag base class).

Decisions are made on token ids: a record that is exactly one ``<think>`` or
``</think>`` token is swallowed, reasoning ends on the first record holding
the ``</think>`` id, and output that never opened ``<think>`` is reasoning
until then. One-shot works on text: everything before ``</think>`` (after an
optional ``<think>``) is reasoning; without ``</think>`` all of it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.core.parsing.base import ReasoningParser
from worker.core.parsing.types import DeltaOut, ParserTokenizer
from worker.errors import ParserSetupError


class ThinkTagReasoningParser(ReasoningParser):
    """Legacy start/end-token reasoning; subclasses name the two tokens."""

    start_token = "<think>"
    end_token = "</think>"

    def __init__(self, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> None:
        super().__init__(tokenizer, chat_template_kwargs)
        start_id = tokenizer.token_to_id(self.start_token)
        end_id = tokenizer.token_to_id(self.end_token)
        if start_id is None or end_id is None:
            raise ParserSetupError(
                f"{self.vllm_name} reasoning parser could not locate think start/end tokens in the tokenizer!"
            )
        self.start_id = start_id
        self.end_id = end_id
        # Whether earlier records held the start / end ids: this replaces
        # vLLM's membership tests on the accumulated ids.
        self._start_seen = False
        self._end_seen = False

    vllm_name = "DeepSeekR1ReasoningParser"

    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        for token_id in reversed(token_ids):
            if token_id == self.start_id:
                return False
            if token_id == self.end_id:
                return True
        return False

    def content_ids(self, delta_ids: list[int]) -> list[int]:
        if self.end_id not in delta_ids[:-1]:
            return []
        return delta_ids[delta_ids.index(self.end_id) + 1 :]

    def ended_in_stream(self, delta_ids: Sequence[int]) -> bool:
        return self.end_id in delta_ids

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        before, found, after = text.partition(self.start_token)
        text = after if found else before
        if self.end_token not in text:
            return text, None
        reasoning, _, content = text.partition(self.end_token)
        return reasoning, content or None

    def _split_at_end(self, delta_text: str) -> DeltaOut:
        # A missing end text (held back) gives find() == -1, cutting the last
        # character off as vLLM does.
        end = delta_text.find(self.end_token)
        content = delta_text[end + len(self.end_token) :]
        return DeltaOut(reasoning=delta_text[:end], content=content or None)

    def stream(self, delta_text: str, delta_ids: Sequence[int]) -> DeltaOut | None:
        start_before, end_before = self._start_seen, self._end_seen
        has_start = self.start_id in delta_ids
        has_end = self.end_id in delta_ids
        self._start_seen = start_before or has_start
        self._end_seen = end_before or has_end
        if len(delta_ids) == 1 and delta_ids[0] in (self.start_id, self.end_id):
            return None
        if start_before or not has_start:
            # Started earlier, or never started (models that skip <think>).
            if has_end:
                return self._split_at_end(delta_text)
            if end_before:
                return DeltaOut(content=delta_text)
            return DeltaOut(reasoning=delta_text)
        # <think> in this record.
        if has_end:
            start = delta_text.find(self.start_token)
            end = delta_text.find(self.end_token)
            content = delta_text[end + len(self.end_token) :]
            reasoning = delta_text[start + len(self.start_token) : end]
            return DeltaOut(reasoning=reasoning, content=content or None)
        return DeltaOut(reasoning=delta_text)


class DeepSeekR1ReasoningParser(ThinkTagReasoningParser):
    pass
