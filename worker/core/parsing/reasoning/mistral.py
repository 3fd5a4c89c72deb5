"""``mistral``: vLLM's ``MistralParserReasoningAdapter``.

Reasoning uses ``[THINK]``/``[/THINK]`` when the vocabulary has them. vLLM's
plain-text ``<think>`` variant needs a mistral-common tokenizer
(``supports_grammar``), which a ``tokenizer.json`` model never is, so such
models get no reasoning at all: everything is content.
"""

from __future__ import annotations

from typing import Any

from worker.core.parsing.engine import Action, EngineReasoningParser, Grammar, State
from worker.core.parsing.registry import reasoning_parser
from worker.core.parsing.types import ParserTokenizer
from worker.errors import ParserSetupError

R, C = State.REASONING, State.CONTENT


def mistral_grammar(special_think: bool) -> Grammar:
    think = {"THINK_START": "[THINK]", "THINK_END": "[/THINK]"} if special_think else {}
    actions: dict[tuple[State, str], Action] = {}
    if special_think:
        actions = {
            (C, "THINK_START"): Action.OPEN,
            (R, "THINK_START"): Action.CONSUME,
            (R, "THINK_END"): Action.CLOSE,
            (C, "THINK_END"): Action.CONSUME,
            (R, "TOOL_CALLS"): Action.CLOSE_KEEP,
            (C, "TOOL_CALLS"): Action.CLOSE_KEEP,
        }
    return Grammar(
        markers={**think, "TOOL_CALLS": "[TOOL_CALLS]", "ARGS": "[ARGS]", "OPEN_BRACE": "{"},
        id_markers=(*think, "TOOL_CALLS", "ARGS"),
        actions=actions,
        initial=C,
        wait_for_reasoning=special_think,
        end_markers=("THINK_END", "TOOL_CALLS") if special_think else (),
        strip_trailing_reasoning_ws=True,
    )


@reasoning_parser("mistral")
class MistralReasoningParser(EngineReasoningParser):
    def __init__(self, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> None:
        # vLLM builds the whole Mistral parser, which insists on the tool token.
        if tokenizer.token_to_id("[TOOL_CALLS]") is None:
            raise ParserSetupError("Mistral parser could not locate the tool call token in the tokenizer!")
        super().__init__(tokenizer, chat_template_kwargs)

    @classmethod
    def grammar(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> Grammar:
        return mistral_grammar("[THINK]" in tokenizer.get_vocab())

    def thinking_enabled(self) -> bool:
        return "THINK_START" in self.g.markers
