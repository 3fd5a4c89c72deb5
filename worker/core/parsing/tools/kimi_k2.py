"""``kimi_k2``: vLLM's ``KimiK2ToolParser`` (an adapter over its ``KimiK2Parser`` engine).

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

from worker.core.parsing.registry import tool_parser
from worker.core.parsing.tools._tool_engine import (
    ARGS,
    BETWEEN,
    CALL_END,
    CALL_START,
    CONTENT,
    NAME,
    PREAMBLE,
    REASONING,
    THINK_END,
    EngineToolParser,
    ToolGrammar,
)
from worker.core.parsing.types import ParserTokenizer, ToolCallDeltaOut
from worker.core.parsing.util import thinking_requested

# -- Kimi K2 -------------------------------------------------------------------

THINK_START_TAG = "<think>"
THINK_END_TAG = "</think>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END_TAG = "<|tool_call_end|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"

_HEADER_RE = re.compile(r"(.+:\d+)")


def kimi_grammar(thinking: bool) -> tuple[ToolGrammar, str]:
    markers = {
        "SECTION_START": SECTION_BEGIN,
        "SECTION_END": SECTION_END,
        "CALL_START": CALL_BEGIN,
        "CALL_END": CALL_END_TAG,
        "ARG_START": ARG_BEGIN,
    }
    transitions: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
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
    grammar = ToolGrammar(
        markers=markers,
        id_markers=frozenset(markers),
        transitions=transitions,
        strip_content_ws_with_tools=False,
    )
    return grammar, REASONING if thinking else CONTENT


def _kimi_header(header: str) -> tuple[str | None, str | None]:
    """(id, name) of a call header such as ``functions.get_weather:0``."""
    match = _HEADER_RE.match(header.strip())
    if match is None:
        return None, None
    call_id = match.group(1).strip()
    return call_id, call_id.split(":")[0].removeprefix("functions.")


@tool_parser("kimi_k2")
class KimiK2ToolParser(EngineToolParser):
    supports_required_and_named = False  # xgrammar structural tag "kimi"

    @classmethod
    def grammar(
        cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]
    ) -> tuple[ToolGrammar, str]:
        return kimi_grammar(thinking_requested(chat_template_kwargs))

    def _announce(self, idx: int, deltas: list[ToolCallDeltaOut], name: str | None) -> None:
        call_id, tool_name = _kimi_header(name) if name is not None else (None, None)
        if not tool_name:
            if 0 <= idx < len(self._slots):
                self._slots[idx].name = ""
            return
        self._slots[idx].id = call_id or ""
        super()._announce(idx, deltas, tool_name)

    def _on_end(self, idx: int, deltas: list[ToolCallDeltaOut]) -> None:
        if 0 <= idx < len(self._slots) and not self._slots[idx].name_sent:
            call_id, tool_name = _kimi_header(self._slots[idx].name)
            if tool_name:
                self._slots[idx].id = call_id or ""
                self._slots[idx].name = tool_name
        super()._on_end(idx, deltas)

    def _args_json(self, body: str) -> str:
        return body.strip() or "{}"
