"""``glm45`` (and ``glm47``): vLLM's ``Glm47MoeParserReasoningAdapter``.

The GLM config (``tools/glm45.py``) with tools off.

Unlike qwen3, ``<think>`` in content reopens reasoning, a ``<tool_call>`` in
content is plain text (only inside reasoning does it end it), trailing
reasoning whitespace is held back (and lost at the end of reasoning), and
``thinking``/``enable_thinking`` false removes reasoning markers entirely.
"""

from __future__ import annotations

from typing import Any

from worker.core.parsing.engine.config import EngineConfig, thinking_requested
from worker.core.parsing.engine.reasoning import EngineReasoningParser
from worker.core.parsing.tools.glm45 import glm_config
from worker.core.parsing.types import ParserTokenizer


class Glm45ReasoningParser(EngineReasoningParser):
    @classmethod
    def make_config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return glm_config(thinking_requested(chat_template_kwargs))

    def thinking_enabled(self) -> bool:
        # Unlike tools/glm45.thinking_enabled, no "template always thinks" override here.
        return thinking_requested(self.chat_template_kwargs)
