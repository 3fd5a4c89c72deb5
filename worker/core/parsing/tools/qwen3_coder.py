"""``qwen3_coder`` (and ``qwen3_xml``): vLLM's ``Qwen3EngineToolParser``.

The Qwen3-Coder XML format, served in vLLM 0.33.0 by the Qwen3 parser
engine (``Qwen3ParserToolAdapter``)::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Behaviour matched (all from the engine in :mod:`worker.core.parsing.engine`;
this module is the Qwen3 config):

* ``<tool_call>``/``</tool_call>`` are cut by token id while streaming,
  every other marker (``<function=``, ``</function>``, ``<parameter=``,
  ``</parameter>``, even a lone ``>``) by text, with partial markers held.
  A ``<function=`` straight in content also starts a call.
* The name is streamed with the first argument text after ``<function=NAME>``
  (usually the newline); arguments stream as a JSON object of the raw
  parameter values, one leading and one trailing newline trimmed, typed by
  the tool schema (so an integer appears only once its value is closed), a
  string value streaming as it grows; the closing ``"}`` or ``}`` comes with
  ``</function>``.
* Cut off (``length``) between parameters, the streamed JSON is closed at
  the end; cut inside a value, it stays open (the value's text so far),
  while one-shot drops the unfinished parameter.
* ``<function=NAME`` without ``>`` ends at ``</tool_call>``/``</function>``:
  the name streams raw (newline included), one-shot strips it.
* Text in ``<tool_call>`` outside ``<function=...>`` (e.g. hermes-style JSON)
  disappears: no call, no content. Whitespace-only content is dropped once
  a call has started (unless real content came first); content after tool
  markup in the same record comes one record later (or never, if every
  later record carries call deltas); when calls are found, one-shot keeps
  only content before the first tool markup.
* ``</think>`` in content is swallowed when a reasoning parser runs, kept as
  text when none is configured.
* With ``tool_choice: "none"`` (and tools) the markup is parsed and dropped.
* Strict tool calling: ``required`` and named choices parse like ``auto``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from worker.core.parsing.engine.arguments import WS, QwenArgScanner, XmlArguments, trim_newlines
from worker.core.parsing.engine.config import EngineConfig, Event, State
from worker.core.parsing.engine.tools import EngineToolParser
from worker.core.parsing.registry import tool_parser
from worker.core.parsing.types import ParserTokenizer

#: vLLM's ``Qwen3Parser`` markup (vllm/parser/qwen3.py)
QWEN3_MARKERS = {
    "THINK_START": "<think>",
    "THINK_END": "</think>",
    "TOOL_START": "<tool_call>",
    "TOOL_END": "</tool_call>",
    "FUNC_PREFIX": "<function=",
    "FUNC_END": "</function>",
    "PARAM_START": "<parameter=",
    "PARAM_END": "</parameter>",
    "CLOSE_ANGLE": ">",
}
#: the markers matched by token id
QWEN3_ID_MARKERS = ("THINK_START", "THINK_END", "TOOL_START", "TOOL_END")
_PARAM_RE = re.compile(
    rf"<{WS}*parameter{WS}*={WS}*([^>]*)>(.*?)(?:<{WS}*/{WS}*parameter{WS}*>|(?=<{WS}*parameter{WS}*=))",
    re.DOTALL,
)
_OPEN_PARAM_RE = re.compile(rf"<{WS}*parameter{WS}*={WS}*([^>]+)>(.*)$", re.DOTALL)


def convert_args(raw: str, partial: bool) -> str:
    params: dict[str, Any] = {}
    for match in _PARAM_RE.finditer(raw):
        params[match.group(1)] = trim_newlines(match.group(2))
    if partial:
        open_match = _OPEN_PARAM_RE.search(_PARAM_RE.sub("", raw))
        if open_match and open_match.group(1):
            params[open_match.group(1)] = trim_newlines(open_match.group(2))
    return json.dumps(params, ensure_ascii=False)


R, C = State.REASONING, State.CONTENT
PRE, NAME, ARGS, BETWEEN = State.TOOL_PREAMBLE, State.TOOL_NAME, State.TOOL_ARGS, State.TOOL_BETWEEN
_END, _START = Event.CALL_END, Event.CALL_START
QWEN3_ARGUMENTS = XmlArguments(convert_args, QwenArgScanner, trim_values=True)


def qwen3_config(thinking: bool) -> EngineConfig:
    """The Qwen3 family, for the ``qwen3`` reasoning and ``qwen3_coder``/``qwen3_xml`` tool adapters."""
    return EngineConfig(
        terminals=dict(QWEN3_MARKERS),
        id_terminals=QWEN3_ID_MARKERS,
        transitions={
            (R, "THINK_START"): (R, ()),
            (R, "THINK_END"): (C, (Event.REASONING_END,)),
            (C, "THINK_END"): (C, ()),
            (R, "TOOL_START"): (PRE, (Event.REASONING_END, _START)),
            (C, "TOOL_START"): (PRE, (Event.REASONING_END, _START)),
            (C, "FUNC_PREFIX"): (NAME, (_START,)),
            (PRE, "TOOL_END"): (C, (_END,)),
            (PRE, "FUNC_PREFIX"): (NAME, ()),
            (NAME, "CLOSE_ANGLE"): (ARGS, ()),
            (NAME, "FUNC_END"): (BETWEEN, (_END,)),
            (NAME, "TOOL_END"): (C, (_END,)),
            (NAME, "TOOL_START"): (PRE, (_END, _START)),
            (NAME, "FUNC_PREFIX"): (NAME, (_END, _START)),
            (ARGS, "FUNC_END"): (BETWEEN, (_END,)),
            (ARGS, "FUNC_PREFIX"): (NAME, (_END, _START)),
            (ARGS, "PARAM_START"): (ARGS, (Event.ARG,)),
            (ARGS, "PARAM_END"): (ARGS, (Event.ARG,)),
            (BETWEEN, "TOOL_END"): (C, ()),
            (BETWEEN, "TOOL_START"): (PRE, (_START,)),
            (BETWEEN, "FUNC_PREFIX"): (NAME, (_START,)),
        },
        initial=R if thinking else C,
        wait_for_reasoning=thinking,
        end_markers=("THINK_END", "TOOL_START"),
        turn_boundaries=frozenset(("<|im_start|>", "<|im_end|>")),
        arguments=QWEN3_ARGUMENTS,
        strip_trailing_reasoning_ws=False,
    )


@tool_parser("qwen3_coder")
class Qwen3EngineToolParser(EngineToolParser):
    @classmethod
    def make_config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return qwen3_config(bool(chat_template_kwargs.get("enable_thinking", True)))
