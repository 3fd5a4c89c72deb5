"""``mistral``: vLLM's ``MistralParserReasoningAdapter``.

The Mistral config (``tools/mistral.py``) with tools off.

Reasoning uses ``[THINK]``/``[/THINK]`` when the vocabulary has them. vLLM's
plain-text ``<think>`` variant needs a mistral-common tokenizer
(``supports_grammar``), which a ``tokenizer.json`` model never is, so such
models get no reasoning at all: everything is content.
"""

from __future__ import annotations

from typing import Any

from worker.core.parsing.engine.config import EngineConfig
from worker.core.parsing.engine.reasoning import EngineReasoningParser
from worker.core.parsing.registry import reasoning_parser
from worker.core.parsing.tools.mistral import mistral_config
from worker.core.parsing.types import ParserTokenizer
from worker.errors import ParserSetupError


@reasoning_parser("mistral")
class MistralReasoningParser(EngineReasoningParser):
    def __init__(self, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> None:
        # vLLM builds the whole Mistral parser, which insists on the tool token.
        if tokenizer.token_to_id("[TOOL_CALLS]") is None:
            raise ParserSetupError("Mistral parser could not locate the tool call token in the tokenizer!")
        super().__init__(tokenizer, chat_template_kwargs)

    @classmethod
    def make_config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return mistral_config("[THINK]" in tokenizer.get_vocab())

    def thinking_enabled(self) -> bool:
        return "THINK_START" in self.config.terminals
