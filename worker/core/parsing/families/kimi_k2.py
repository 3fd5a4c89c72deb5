"""The Kimi K2 family: ``kimi_k2`` reasoning and tools (vLLM's ``KimiK2Parser`` and its two adapters).

Reasoning (vLLM's ``KimiK2ParserReasoningAdapter``): thinking is on unless
``thinking``/``enable_thinking`` say otherwise; then the output starts in
reasoning even without a ``<think>``, ``</think>`` ends it, and a tool-call
section opened before ``</think>`` ends it too (and is content for the
reasoning parser). With thinking off the parser is the identity.

Tools: vLLM's ``KimiK2ToolParser`` (an adapter over its ``KimiK2Parser`` engine).

Format::

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Tokyo"}<|tool_call_end|>
    <|tool_calls_section_end|>

The header before ``<|tool_call_argument_begin|>`` is the call id the model
wrote; the name is its last dotted component before ``:N``. vLLM uses that id
verbatim. Only a call whose header does not parse (no ``:N``) gets a generated
id: ``functions.NAME:K`` for Kimi model types (``kimi_k2``/``kimi_k25``/
``kimi_k3``), a random ``chatcmpl-tool-`` id otherwise. In vLLM 0.33.0, K is
counted by the tool adapter's own engine from 0: the conversation's history
count (``set_history_tool_call_count``) is seeded into the *outer* parser
only, which Kimi never consults (its structural tag routes ``required``/named
through the native format), so the history does not reach these ids.
"""

from __future__ import annotations

import re
from typing import Any

from worker.core.parsing.engine.config import EngineConfig, Event, State, Transitions, thinking_requested
from worker.core.parsing.engine.family import EngineFamily
from worker.core.parsing.engine.reasoning import EngineReasoningParser
from worker.core.parsing.engine.tools import EngineToolParser
from worker.core.parsing.types import ParserTokenizer, ToolCallDeltaOut

# -- Kimi K2 -------------------------------------------------------------------

THINK_START_TAG = "<think>"
THINK_END_TAG = "</think>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END_TAG = "<|tool_call_end|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"

_HEADER_RE = re.compile(r"(.+:\d+)")
CONTENT, REASONING = State.CONTENT, State.REASONING
PREAMBLE, NAME, ARGS, BETWEEN = State.TOOL_PREAMBLE, State.TOOL_NAME, State.TOOL_ARGS, State.TOOL_BETWEEN
CALL_START, CALL_END, THINK_END = Event.CALL_START, Event.CALL_END, Event.REASONING_END


def kimi_config(thinking: bool) -> EngineConfig:
    """vLLM's ``kimi_k2_config`` (vllm/parser/kimi_k2.py)."""
    markers = {
        "SECTION_START": SECTION_BEGIN,
        "SECTION_END": SECTION_END,
        "CALL_START": CALL_BEGIN,
        "CALL_END": CALL_END_TAG,
        "ARG_START": ARG_BEGIN,
    }
    transitions: Transitions = {
        (REASONING, "SECTION_START"): (PREAMBLE, (THINK_END,)),
        (CONTENT, "SECTION_START"): (PREAMBLE, ()),
        (PREAMBLE, "CALL_START"): (NAME, (CALL_START,)),
        (NAME, "ARG_START"): (ARGS, ()),
        (ARGS, "CALL_END"): (BETWEEN, (CALL_END,)),
        (ARGS, "SECTION_END"): (PREAMBLE, (CALL_END,)),
        (BETWEEN, "CALL_START"): (NAME, (CALL_START,)),
        # after the section the parser stays in a tool state: trailing text is dropped
        (PREAMBLE, "SECTION_END"): (PREAMBLE, ()),
        (BETWEEN, "SECTION_END"): (PREAMBLE, ()),
    }
    if thinking:
        markers = {"THINK_START": THINK_START_TAG, "THINK_END": THINK_END_TAG, **markers}
        transitions.update(
            {
                (REASONING, "THINK_START"): (REASONING, ()),
                (REASONING, "THINK_END"): (CONTENT, (THINK_END,)),
                (CONTENT, "THINK_END"): (CONTENT, ()),
            }
        )
    return EngineConfig(
        terminals=markers,
        id_terminals=tuple(markers),
        transitions=transitions,
        initial=REASONING if thinking else CONTENT,
        wait_for_reasoning=thinking,
        end_markers=("THINK_END", "SECTION_START") if thinking else (),
        strip_content_ws_with_tools=False,
        resend_announcing_chunk=True,
    )


def _kimi_header(header: str) -> tuple[str | None, str | None]:
    """(id, name) of a call header such as ``functions.get_weather:0``."""
    match = _HEADER_RE.match(header.strip())
    if match is None:
        return None, None
    call_id = match.group(1).strip()
    return call_id, call_id.split(":")[0].removeprefix("functions.")


class KimiK2(EngineFamily):
    @classmethod
    def config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return kimi_config(thinking_requested(chat_template_kwargs))

    @classmethod
    def reasoning_enabled(
        cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any], config: EngineConfig
    ) -> bool:
        return thinking_requested(chat_template_kwargs)


class KimiK2ReasoningParser(EngineReasoningParser):
    family = KimiK2

    def content_ids(self, delta_ids: list[int]) -> list[int]:
        # vLLM's KimiK2Parser.extract_content_ids: after the last </think>, else from the
        # last section start, else nothing.
        if not self.thinking_enabled():
            return delta_ids
        for marker, keep_marker in (("THINK_END", False), ("SECTION_START", True)):
            token_id = self.tokenizer.token_to_id(self.config.terminals[marker])
            if token_id is None:
                continue
            for i in range(len(delta_ids) - 1, -1, -1):
                if delta_ids[i] == token_id:
                    return delta_ids[i:] if keep_marker else delta_ids[i + 1 :]
        return []


class KimiK2ToolParser(EngineToolParser):
    family = KimiK2
    supports_required_and_named = False  # xgrammar structural tag "kimi"

    # Hooks: the name comes from the call header, which also gives the id.

    def _announce(self, index: int, name: str | None, calls: list[ToolCallDeltaOut]) -> None:
        call_id, tool_name = _kimi_header(name) if name is not None else (None, None)
        if not tool_name:
            if 0 <= index < len(self._slots):
                self._slots[index].name = ""
            return
        self._slots[index].id = call_id or ""
        super()._announce(index, tool_name, calls)

    def _on_call_end(self, index: int, calls: list[ToolCallDeltaOut]) -> None:
        if 0 <= index < len(self._slots) and not self._slots[index].name_sent:
            call_id, tool_name = _kimi_header(self._slots[index].name)
            if tool_name:
                self._slots[index].id = call_id or ""
                self._slots[index].name = tool_name
        super()._on_call_end(index, calls)

    def _raw_args_json(self, raw: str) -> str:
        return raw.strip() or "{}"
