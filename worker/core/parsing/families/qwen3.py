"""The Qwen3 family: ``qwen3`` reasoning and ``qwen3_coder``/``qwen3_xml`` tools (vLLM's ``Qwen3Parser``).

Reasoning (vLLM's ``Qwen3ParserReasoningAdapter``, the config with tools
off): ``<think>`` inside reasoning is swallowed, ``</think>`` ends it (and is
swallowed again later), ``<tool_call>`` ends it implicitly and stays as
content. ``enable_thinking: false`` starts in content. Trailing reasoning
whitespace is kept. ChatML turn markers bound the prompt check.

Tools (vLLM's ``Qwen3EngineToolParser``; ``qwen3_xml`` is the same class):
the Qwen3-Coder XML format::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Behaviour matched (all from the engine in :mod:`worker.core.parsing.engine`;
this module is the Qwen3 config, its argument converter and scanner):

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

from worker.core.parsing.engine.arguments import WS, ArgEvent, XmlArguments, is_ws, lstrip_ws, trim_newlines
from worker.core.parsing.engine.config import EngineConfig, Event, State
from worker.core.parsing.engine.family import EngineFamily
from worker.core.parsing.engine.reasoning import EngineReasoningParser
from worker.core.parsing.engine.tools import EngineToolParser
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


# -- the streaming argument scanner: ``convert_args`` in one pass ----------------------

_PARAMETER = "parameter"
#: Positions of the value-end matcher (one live candidate: no pattern accepts "<" after its first char).
_IDLE, _LT, _START_EQ, _SLASH, _END_GT = 0, 1, 10, 11, 20


def _step(state: int, ch: str) -> int:
    """One char through ``<\\s*parameter\\s*=`` | ``<\\s*/\\s*parameter\\s*>``; -1/-2 on a match."""
    if ch == "<":
        return _LT
    if state == _IDLE:
        return _IDLE
    if state == _LT:
        if is_ws(ch):
            return _LT
        return _SLASH if ch == "/" else (2 if ch == "p" else _IDLE)
    if state == _SLASH:
        if is_ws(ch):
            return _SLASH
        return 12 if ch == "p" else _IDLE
    if state in (_START_EQ, _END_GT):
        if is_ws(ch):
            return state
        if state == _START_EQ:
            return -1 if ch == "=" else _IDLE
        return -2 if ch == ">" else _IDLE
    matched = state - 1 if state < _SLASH else state - _SLASH  # chars of "parameter" seen
    return state + 1 if ch == _PARAMETER[matched] else _IDLE


class QwenArgScanner:
    """``<parameter=NAME>VALUE</parameter>`` (or up to the next ``<parameter=``); tags may hold whitespace."""

    def __init__(self) -> None:
        self._state = "seek"
        self._matcher = _IDLE
        self._name: list[str] = []
        self._value: list[str] = []
        self._value_len = 0
        self._candidate = 0  # where in the value a possible end tag starts
        self._named = False  # the open value has a name (convert_args shows it)

    def feed(self, text: str) -> list[ArgEvent]:
        events: list[ArgEvent] = []
        pos = 0
        size = len(text)
        while pos < size:
            state = self._state
            if state == "seek" and self._matcher == _IDLE:
                found = text.find("<", pos)
                if found < 0:
                    return events
                pos = found
            if state == "name":
                end = text.find(">", pos)
                if end < 0:
                    self._name.append(text[pos:])
                    return events
                self._name.append(text[pos:end])
                pos = end + 1
                self._open_value(events)
                continue
            if state == "value" and self._matcher == _IDLE:
                found = text.find("<", pos)
                chunk = text[pos:] if found < 0 else text[pos:found]
                if chunk:
                    self._grow(chunk, events)
                if found < 0:
                    return events
                pos = found
            ch = text[pos]
            pos += 1
            if state == "value":
                if ch == "<":
                    self._candidate = self._value_len
                self._grow(ch, events)
            self._matcher = _step(self._matcher, ch)
            if self._matcher >= 0:
                continue
            matched, self._matcher = self._matcher, _IDLE
            if state == "value":
                value = "".join(self._value)[: self._candidate]
                events.append(("done", lstrip_ws("".join(self._name)), trim_newlines(value)))
            if matched == -1:
                self._state, self._name = "name", []
            elif state == "value":
                self._state = "seek"
        return events

    def _open_value(self, events: list[ArgEvent]) -> None:
        segment = "".join(self._name)
        self._name = [segment]
        self._state, self._value, self._value_len, self._matcher = "value", [], 0, _IDLE
        key = lstrip_ws(segment) or segment[-1:]
        self._named = bool(key)
        if key:
            events.append(("open", key))

    def _grow(self, text: str, events: list[ArgEvent]) -> None:
        self._value.append(text)
        self._value_len += len(text)
        if self._named:
            events.append(("grow", text))


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


class Qwen3(EngineFamily):
    @classmethod
    def config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return qwen3_config(bool(chat_template_kwargs.get("enable_thinking", True)))

    @classmethod
    def reasoning_enabled(
        cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any], config: EngineConfig
    ) -> bool:
        return bool(chat_template_kwargs.get("enable_thinking", True))


class Qwen3ReasoningParser(EngineReasoningParser):
    family = Qwen3


class Qwen3EngineToolParser(EngineToolParser):
    family = Qwen3
