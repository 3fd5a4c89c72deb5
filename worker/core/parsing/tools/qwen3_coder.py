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

Behaviour matched (all from the engine, see ``_xml_engine``):

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

from worker.core.parsing.reasoning.qwen3 import QWEN3_ID_MARKERS, QWEN3_MARKERS
from worker.core.parsing.registry import tool_parser
from worker.core.parsing.tools._xml_args import QwenArgScanner
from worker.core.parsing.tools._xml_engine import WS, EngineToolParser, Ev, Extender, St, ToolGrammar
from worker.core.parsing.types import ParserTokenizer

_PARAM_RE = re.compile(
    rf"<{WS}*parameter{WS}*={WS}*([^>]*)>(.*?)(?:<{WS}*/{WS}*parameter{WS}*>|(?=<{WS}*parameter{WS}*=))",
    re.DOTALL,
)
_OPEN_PARAM_RE = re.compile(rf"<{WS}*parameter{WS}*={WS}*([^>]+)>(.*)$", re.DOTALL)
# What ends an open value: its closing tag or the next opener.
_VALUE_END_RE = re.compile(rf"<{WS}*/{WS}*parameter{WS}*>|<{WS}*parameter{WS}*=")
_WS_CHAR = re.compile(WS)


def _trim(value: str) -> str:
    """Drop one leading and one trailing newline (template markup around values)."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def convert_args(raw: str, partial: bool) -> str:
    params: dict[str, Any] = {}
    for match in _PARAM_RE.finditer(raw):
        params[match.group(1)] = _trim(match.group(2))
    if partial:
        open_match = _OPEN_PARAM_RE.search(_PARAM_RE.sub("", raw))
        if open_match and open_match.group(1):
            params[open_match.group(1)] = _trim(open_match.group(2))
    return json.dumps(params, ensure_ascii=False)


def _could_end_value(tail: str) -> bool:
    """Is ``tail`` (starting with ``<``) a prefix of a value end (``</parameter>`` / ``<parameter=``)?"""
    n = len(tail)
    i = 1

    def spaces(i: int) -> int:
        while i < n and _WS_CHAR.match(tail[i]):
            i += 1
        return i

    i = spaces(i)
    if i == n:
        return True
    closing = tail[i] == "/"
    if closing:
        i = spaces(i + 1)
    for ch in "parameter":
        if i == n:
            return True
        if tail[i] != ch:
            return False
        i += 1
    i = spaces(i)
    if i == n:
        return True
    return i == n - 1 and tail[i] == (">" if closing else "=")


def _end_window(text: str) -> str:
    """The suffix of ``text`` that may still grow into a value end."""
    start = text.rfind("<")
    if start < 0:
        return ""
    tail = text[start:]
    return tail if _could_end_value(tail) else ""


def value_extender(raw: str) -> Extender | None:
    """Stream the open trailing ``<parameter=...>`` value as JSON string text.

    Mirrors :func:`convert_args`: the value's first newline is dropped and a
    trailing newline is held back until more text follows it.
    """
    match = _OPEN_PARAM_RE.search(_PARAM_RE.sub("", raw))
    if match is None:
        return None
    name, value = match.group(1), match.group(2)
    # A key seen before keeps its first position in the JSON: not the last value.
    if any(m.group(1) == name for m in _PARAM_RE.finditer(raw)):
        return None
    window = _end_window(value)
    started = bool(value)
    held = "\n" if value.endswith("\n") and value != "\n" else ""

    def extend(delta: str) -> str | None:
        nonlocal window, started, held
        text = window + delta
        if _VALUE_END_RE.search(text):
            return None
        window = _end_window(text)
        text = held + delta
        if not started and text:
            started = True
            text = text.removeprefix("\n")
        held = "\n" if text.endswith("\n") else ""
        text = text[: len(text) - len(held)]
        return json.dumps(text, ensure_ascii=False)[1:-1]

    return extend


R, C = St.REASONING, St.CONTENT
PRE, NAME, ARGS, BETWEEN = St.TOOL_PREAMBLE, St.TOOL_NAME, St.TOOL_ARGS, St.TOOL_BETWEEN
_END, _START = Ev.CALL_END, Ev.CALL_START


def qwen3_tool_grammar(thinking: bool) -> ToolGrammar:
    return ToolGrammar(
        terminals=dict(QWEN3_MARKERS),
        id_terminals=QWEN3_ID_MARKERS,
        transitions={
            (R, "THINK_START"): (R, ()),
            (R, "THINK_END"): (C, (Ev.REASONING_END,)),
            (C, "THINK_END"): (C, ()),
            (R, "TOOL_START"): (PRE, (Ev.REASONING_END, _START)),
            (C, "TOOL_START"): (PRE, (Ev.REASONING_END, _START)),
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
            (ARGS, "PARAM_START"): (ARGS, (Ev.ARG,)),
            (ARGS, "PARAM_END"): (ARGS, (Ev.ARG,)),
            (BETWEEN, "TOOL_END"): (C, ()),
            (BETWEEN, "TOOL_START"): (PRE, (_START,)),
            (BETWEEN, "FUNC_PREFIX"): (NAME, (_START,)),
        },
        initial=R if thinking else C,
        convert_args=convert_args,
        value_extender=value_extender,
        strip_trailing_reasoning_ws=False,
        arg_scanner=QwenArgScanner,
        trim_values=True,
    )


@tool_parser("qwen3_coder")
class Qwen3EngineToolParser(EngineToolParser):
    @classmethod
    def make_grammar(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> ToolGrammar:
        return qwen3_tool_grammar(bool(chat_template_kwargs.get("enable_thinking", True)))
