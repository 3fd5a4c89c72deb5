"""``glm45`` (and ``glm47``): vLLM's ``Glm47MoeModelToolParser`` (GLM-4.5/4.6/4.7).

Format, served in vLLM 0.33.0 by the GLM-4.7 parser engine
(``Glm47MoeParserToolAdapter``)::

    <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>

(newlines between the parts are common). Behaviour matched (the engine in
:mod:`worker.core.parsing.engine`; this module is GLM's config):

* ``<tool_call>``/``</tool_call>`` (and ``<think>``/``</think>``) are cut by
  token id while streaming; the ``<arg_key>``/``<arg_value>`` tags by text,
  partial tags held back.
* Everything between ``<tool_call>`` and the first ``<arg_key>`` is the name,
  whitespace-stripped; it is streamed when the first ``<arg_key>`` arrives,
  or with the closing ``</tool_call>`` (and ``{}``) for a call without
  arguments. Names not among the request's tools are rejected
  (``validate_tool_names``): such a call vanishes entirely.
* Values are kept verbatim (no newline trimming, stripped keys), typed by the
  tool schema; string values stream as they grow, the closing ``"}`` or
  ``}`` comes with ``</tool_call>``. A call cut inside a value leaves the
  streamed JSON open; one-shot drops the unfinished argument. As with
  qwen3, when calls are found one-shot keeps only content before the
  first tool markup.
* ``<think>`` in content reopens reasoning inside the tool phase (when a
  reasoning parser runs; else it is text), with trailing reasoning
  whitespace held back; ``thinking``/``enable_thinking`` false removes the
  think markers from the config (then special think tokens are dropped).
* With ``tool_choice: "none"`` (and tools) the markup is parsed and dropped.
* Strict tool calling: ``required`` and named choices parse like ``auto``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from worker.core.parsing.engine.arguments import WS, GlmArgScanner, XmlArguments
from worker.core.parsing.engine.config import EngineConfig, Event, State, Transitions, thinking_requested
from worker.core.parsing.engine.tools import EngineToolParser
from worker.core.parsing.registry import tool_parser
from worker.core.parsing.types import ParserTokenizer

#: vLLM's ``Glm47MoeParser`` markup (vllm/parser/glm47_moe.py); the think markers
#: only exist while thinking is on.
GLM_THINK_MARKERS = {"THINK_START": "<think>", "THINK_END": "</think>"}
GLM_TOOL_MARKERS = {
    "TOOL_START": "<tool_call>",
    "TOOL_END": "</tool_call>",
    "ARG_KEY_START": "<arg_key>",
    "ARG_KEY_END": "</arg_key>",
    "ARG_VALUE_START": "<arg_value>",
    "ARG_VALUE_END": "</arg_value>",
}
_ARG_RE = re.compile(rf"<arg_key>(.*?)</arg_key>{WS}*<arg_value>(.*?)</arg_value>", re.DOTALL)
_OPEN_ARG_RE = re.compile(rf"<arg_key>(.*?)</arg_key>{WS}*<arg_value>(.*)$", re.DOTALL)


def _parse_args(raw: str, partial: bool) -> tuple[dict[str, Any], str | None]:
    """The arguments, and the key of a still-open trailing value."""
    params: dict[str, Any] = {}
    for match in _ARG_RE.finditer(raw):
        params[match.group(1).strip()] = match.group(2)
    open_key = None
    if partial:
        open_match = _OPEN_ARG_RE.search(_ARG_RE.sub("", raw))
        if open_match:
            key = open_match.group(1).strip()
            if key:
                params[key] = open_match.group(2)
                open_key = key
    return params, open_key


def convert_args(raw: str, partial: bool) -> str:
    return json.dumps(_parse_args(raw, partial)[0], ensure_ascii=False)


R, C = State.REASONING, State.CONTENT
NAME, ARGS = State.TOOL_NAME, State.TOOL_ARGS
GLM_ARGUMENTS = XmlArguments(convert_args, GlmArgScanner)


def glm_config(thinking: bool) -> EngineConfig:
    """The GLM-4.5/4.6/4.7 family, for the ``glm45`` reasoning and tool adapters."""
    think = dict(GLM_THINK_MARKERS) if thinking else {}
    transitions: Transitions = {}
    if thinking:
        transitions.update(
            {
                (C, "THINK_START"): (R, (Event.REASONING_START,)),
                (R, "THINK_END"): (C, (Event.REASONING_END,)),
                (C, "THINK_END"): (C, ()),
            }
        )
    transitions.update(
        {
            (R, "THINK_START"): (R, ()),
            (R, "TOOL_START"): (NAME, (Event.REASONING_END, Event.CALL_START)),
            (C, "TOOL_START"): (NAME, (Event.CALL_START,)),
            (NAME, "ARG_KEY_START"): (ARGS, (Event.ARG,)),
            (NAME, "TOOL_END"): (C, (Event.CALL_END,)),
            (ARGS, "TOOL_END"): (C, (Event.CALL_END,)),
        }
    )
    for marker in ("ARG_KEY_START", "ARG_KEY_END", "ARG_VALUE_START", "ARG_VALUE_END"):
        transitions[(ARGS, marker)] = (ARGS, (Event.ARG,))
    return EngineConfig(
        terminals={**think, **GLM_TOOL_MARKERS},
        id_terminals=(*think, "TOOL_START", "TOOL_END"),
        transitions=transitions,
        initial=R if thinking else C,
        wait_for_reasoning=thinking,
        end_markers=("THINK_END", "TOOL_START") if thinking else (),
        turn_boundaries=frozenset(("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")),
        arguments=GLM_ARGUMENTS,
        validate_tool_names=True,
        strip_trailing_reasoning_ws=True,
        strip_names=True,
    )


def _always_thinks(tokenizer: ParserTokenizer) -> bool:
    """GLM-5.3 templates have no thinking switch: reasoning is always on."""
    template = getattr(tokenizer, "chat_template", None)
    return (
        isinstance(template, str)
        and all(
            marker in template
            for marker in ("[gMASK]<sop>", "Reasoning Effort:", "<tool_call>", "<arg_key>", "<arg_value>")
        )
        and "enable_thinking" not in template
    )


def thinking_enabled(tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> bool:
    kwargs = chat_template_kwargs
    switched_off = kwargs.get("thinking") is False or kwargs.get("enable_thinking") is False
    if switched_off and _always_thinks(tokenizer):
        return True  # the switches are ignored, as if unset
    return thinking_requested(chat_template_kwargs)


@tool_parser("glm45", "glm47")
class Glm47MoeToolParser(EngineToolParser):
    @classmethod
    def make_config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return glm_config(thinking_enabled(tokenizer, chat_template_kwargs))
