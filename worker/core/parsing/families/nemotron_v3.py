"""The Nemotron 3 family: ``nemotron_v3`` reasoning (vLLM's ``NemotronV3Parser``); tools are ``qwen3_coder``.

Nemotron 3 (Nano/Super) writes the Qwen3 format (``<think>``/``</think>``,
``<tool_call>`` XML), so the config is Qwen3's with trailing reasoning
whitespace held back. vLLM registers only the reasoning name; tool calls go
through ``qwen3_coder`` (:mod:`worker.core.parsing.families.qwen3`).

``enable_thinking: false`` or ``force_nonempty_content: true`` make content
non-empty: one-shot, a blank content swaps with the reasoning; streaming,
when ``</think>`` never came, the last chunk carries every reasoning piece
streamed so far again as content (vLLM's ``get_streaming_fallback_content``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from worker.core.parsing.engine.config import EngineConfig
from worker.core.parsing.engine.family import EngineFamily
from worker.core.parsing.engine.machine import EngineEvent
from worker.core.parsing.engine.reasoning import EngineReasoningParser
from worker.core.parsing.families.qwen3 import qwen3_config
from worker.core.parsing.types import DeltaOut, ParserTokenizer


def nemotron_v3_config(thinking: bool) -> EngineConfig:
    """vLLM's ``nemotron_v3_config``: Qwen3's, holding trailing reasoning whitespace."""
    return dataclasses.replace(qwen3_config(thinking), strip_trailing_reasoning_ws=True)


def forces_content(chat_template_kwargs: dict[str, Any]) -> bool:
    return (
        chat_template_kwargs.get("enable_thinking") is False
        or chat_template_kwargs.get("force_nonempty_content") is True
    )


class NemotronV3(EngineFamily):
    @classmethod
    def config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return nemotron_v3_config(bool(chat_template_kwargs.get("enable_thinking", True)))


class NemotronV3ReasoningParser(EngineReasoningParser):
    family = NemotronV3

    def _reset(self) -> None:
        super()._reset()
        self._streamed_reasoning: list[str] = []

    def _to_delta(self, events: list[EngineEvent], finished: bool = False) -> DeltaOut | None:
        delta = super()._to_delta(events, finished)
        # Kept as produced, before trailing whitespace is held back (as vLLM keeps it).
        if delta is not None and delta.reasoning is not None and forces_content(self.chat_template_kwargs):
            self._streamed_reasoning.append(delta.reasoning)
        return delta

    def fallback_content(self) -> str | None:
        if not forces_content(self.chat_template_kwargs):
            return None
        return "".join(self._streamed_reasoning) or None

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        reasoning, content = super().extract_reasoning(text)
        if forces_content(self.chat_template_kwargs) and (content is None or not content.strip()):
            return content, reasoning
        return reasoning, content
