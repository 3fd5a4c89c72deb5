"""``deepseek_v3``: vLLM's ``DeepSeekV3ReasoningParser``.

Per request: ``thinking`` or ``enable_thinking`` true in chat_template_kwargs
selects the deepseek_r1 behaviour (failing when the vocabulary has no think
tokens, as vLLM does at request time); otherwise everything is content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.core.parsing.base import ReasoningParser
from worker.core.parsing.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from worker.core.parsing.types import DeltaOut, ParserTokenizer


class IdentityReasoningParser(ReasoningParser):
    """No reasoning: all output is content."""

    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        return True

    def content_ids(self, delta_ids: list[int]) -> list[int]:
        return delta_ids

    def ended_in_stream(self, delta_ids: Sequence[int]) -> bool:
        return True

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        return None, text

    def stream(self, delta_text: str, delta_ids: Sequence[int]) -> DeltaOut | None:
        return DeltaOut(content=delta_text) if delta_text else None


class DeepSeekV3ReasoningParser(ReasoningParser):
    def __init__(self, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> None:
        super().__init__(tokenizer, chat_template_kwargs)
        thinking = bool(chat_template_kwargs.get("thinking", False)) or bool(
            chat_template_kwargs.get("enable_thinking", False)
        )
        self._inner: ReasoningParser = (
            DeepSeekR1ReasoningParser(tokenizer, chat_template_kwargs)
            if thinking
            else IdentityReasoningParser(tokenizer, chat_template_kwargs)
        )

    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        return self._inner.is_reasoning_end(token_ids)

    def content_ids(self, delta_ids: list[int]) -> list[int]:
        return self._inner.content_ids(delta_ids)

    def ended_in_stream(self, delta_ids: Sequence[int]) -> bool:
        return self._inner.ended_in_stream(delta_ids)

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        return self._inner.extract_reasoning(text)

    def stream(self, delta_text: str, delta_ids: Sequence[int]) -> DeltaOut | None:
        return self._inner.stream(delta_text, delta_ids)
