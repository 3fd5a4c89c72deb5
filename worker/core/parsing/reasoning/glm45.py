"""``glm45`` (and ``glm47``): vLLM's ``Glm47MoeParserReasoningAdapter``.

Unlike qwen3, ``<think>`` in content reopens reasoning, a ``<tool_call>`` in
content is plain text (only inside reasoning does it end it), trailing
reasoning whitespace is held back (and lost at the end of reasoning), and
``thinking``/``enable_thinking`` false removes reasoning markers entirely.
"""

from __future__ import annotations

from typing import Any

from worker.core.parsing.engine import Action, EngineReasoningParser, Grammar, State
from worker.core.parsing.registry import reasoning_parser
from worker.core.parsing.types import ParserTokenizer
from worker.core.parsing.util import thinking_requested

R, C = State.REASONING, State.CONTENT

#: vLLM's ``Glm47MoeParser`` markup, shared with the ``glm45`` tool grammar
#: (the think markers only exist while thinking is on).
GLM_THINK_MARKERS = {"THINK_START": "<think>", "THINK_END": "</think>"}
GLM_TOOL_MARKERS = {
    "TOOL_START": "<tool_call>",
    "TOOL_END": "</tool_call>",
    "ARG_KEY_START": "<arg_key>",
    "ARG_KEY_END": "</arg_key>",
    "ARG_VALUE_START": "<arg_value>",
    "ARG_VALUE_END": "</arg_value>",
}


def glm45_grammar(thinking: bool) -> Grammar:
    think = dict(GLM_THINK_MARKERS) if thinking else {}
    actions = {(R, "TOOL_START"): Action.CLOSE_KEEP}
    if thinking:
        actions.update(
            {
                (C, "THINK_START"): Action.OPEN,
                (R, "THINK_START"): Action.CONSUME,
                (R, "THINK_END"): Action.CLOSE,
                (C, "THINK_END"): Action.CONSUME,
            }
        )
    return Grammar(
        markers={**think, **GLM_TOOL_MARKERS},
        id_markers=(*think, "TOOL_START", "TOOL_END"),
        actions=actions,
        initial=R if thinking else C,
        wait_for_reasoning=thinking,
        end_markers=("THINK_END", "TOOL_START") if thinking else (),
        turn_boundaries=frozenset(("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")),
        strip_trailing_reasoning_ws=True,
    )


@reasoning_parser("glm45", "glm47")
class Glm45ReasoningParser(EngineReasoningParser):
    @classmethod
    def grammar(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> Grammar:
        return glm45_grammar(thinking_requested(chat_template_kwargs))

    def thinking_enabled(self) -> bool:
        # Unlike tools/glm45.thinking_enabled, no "template always thinks" override here.
        return thinking_requested(self.chat_template_kwargs)
