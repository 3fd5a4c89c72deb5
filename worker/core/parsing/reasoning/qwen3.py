"""``qwen3``: vLLM's ``Qwen3ParserReasoningAdapter``.

The Qwen3 config (``tools/qwen3_coder.py``) with tools off.

``<think>`` inside reasoning is swallowed, ``</think>`` ends it (and is
swallowed again later), ``<tool_call>`` ends it implicitly and stays as
content. ``enable_thinking: false`` starts in content. Trailing reasoning
whitespace is kept. ChatML turn markers bound the prompt check.
"""

from __future__ import annotations

from typing import Any

from worker.core.parsing.engine.config import EngineConfig
from worker.core.parsing.engine.reasoning import EngineReasoningParser
from worker.core.parsing.registry import reasoning_parser
from worker.core.parsing.tools.qwen3_coder import qwen3_config
from worker.core.parsing.types import ParserTokenizer


@reasoning_parser("qwen3")
class Qwen3ReasoningParser(EngineReasoningParser):
    @classmethod
    def make_config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return qwen3_config(bool(chat_template_kwargs.get("enable_thinking", True)))

    def thinking_enabled(self) -> bool:
        return bool(self.chat_template_kwargs.get("enable_thinking", True))
