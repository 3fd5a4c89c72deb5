"""When vLLM parses a model's output with Harmony, and with which parser names.

Kept apart from ``families/harmony.py`` so that deciding costs no import of the Harmony library:
only a gpt-oss model loads it.
"""

from __future__ import annotations

from typing import Final

from worker.core.parsing.types import ParserTokenizer

#: ``config.json`` model types vLLM serves with Harmony (``OnlineDerenderer.use_harmony``).
HARMONY_MODEL_TYPES: Final = frozenset({"gpt_oss"})
REASONING_NAME: Final = "openai_gptoss"
TOOL_NAME: Final = "openai"


def serves(tokenizer: ParserTokenizer) -> bool:
    """Whether vLLM parses this model's output with Harmony."""
    return tokenizer.model_type in HARMONY_MODEL_TYPES


def harmony_names(
    tokenizer: ParserTokenizer, reasoning: str | None, tools: str | None
) -> tuple[str | None, str | None]:
    """The parser names vLLM ends up with: on a gpt-oss model an unset reasoning parser is
    ``openai_gptoss`` (``GptOssForCausalLMConfig.verify_and_update_config``), so Harmony parses even
    with no flags at all."""
    if serves(tokenizer) and not reasoning:
        reasoning = REASONING_NAME
    return reasoning, tools
