"""``qwen3``: vLLM's ``Qwen3ParserReasoningAdapter`` (parser engine, tools off).

``<think>`` inside reasoning is swallowed, ``</think>`` ends it (and is
swallowed again later), ``<tool_call>`` ends it implicitly and stays as
content. ``enable_thinking: false`` starts in content. Trailing reasoning
whitespace is kept. ChatML turn markers bound the prompt check.
"""

from __future__ import annotations

from typing import Any

from worker.core.parsing.engine import Action, EngineReasoningParser, Grammar, State
from worker.core.parsing.registry import reasoning_parser
from worker.core.parsing.types import ParserTokenizer

R, C = State.REASONING, State.CONTENT

#: vLLM's ``Qwen3Parser`` markup, shared with the ``qwen3_coder`` tool grammar.
QWEN3_MARKERS = {
    "THINK_START": "<think>",
    "THINK_END": "</think>",
    "TOOL_START": "<tool_call>",
    "TOOL_END": "</tool_call>",
    # Tool-call grammar literals (with tools off only their hold-back is visible).
    "FUNC_PREFIX": "<function=",
    "FUNC_END": "</function>",
    "PARAM_START": "<parameter=",
    "PARAM_END": "</parameter>",
    "CLOSE_ANGLE": ">",
}
#: the markers matched by token id
QWEN3_ID_MARKERS = ("THINK_START", "THINK_END", "TOOL_START", "TOOL_END")


def qwen3_grammar(thinking: bool) -> Grammar:
    return Grammar(
        markers=dict(QWEN3_MARKERS),
        id_markers=QWEN3_ID_MARKERS,
        actions={
            (R, "THINK_START"): Action.CONSUME,
            (R, "THINK_END"): Action.CLOSE,
            (C, "THINK_END"): Action.CONSUME,
            (R, "TOOL_START"): Action.CLOSE_KEEP,
            (C, "TOOL_START"): Action.CLOSE_KEEP,
        },
        initial=R if thinking else C,
        wait_for_reasoning=thinking,
        end_markers=("THINK_END", "TOOL_START"),
        turn_boundaries=frozenset(("<|im_start|>", "<|im_end|>")),
        strip_trailing_reasoning_ws=False,
    )


@reasoning_parser("qwen3")
class Qwen3ReasoningParser(EngineReasoningParser):
    @classmethod
    def grammar(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> Grammar:
        return qwen3_grammar(bool(chat_template_kwargs.get("enable_thinking", True)))

    def thinking_enabled(self) -> bool:
        return bool(self.chat_template_kwargs.get("enable_thinking", True))
