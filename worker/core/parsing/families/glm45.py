"""The GLM family: ``glm45``/``glm47`` reasoning and tools (vLLM's ``Glm47MoeParser``).

Reasoning (vLLM's ``Glm47MoeParserReasoningAdapter``, the config with tools
off): unlike qwen3, ``<think>`` in content reopens reasoning, a
``<tool_call>`` in content is plain text (only inside reasoning does it end
it), trailing reasoning whitespace is held back (and lost at the end of
reasoning), and ``thinking``/``enable_thinking`` false removes reasoning
markers entirely.

Tools: vLLM's ``Glm47MoeModelToolParser`` (GLM-4.5/4.6/4.7). Format, served
in vLLM 0.33.0 by the GLM-4.7 parser engine (``Glm47MoeParserToolAdapter``)::

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
from typing import Any, cast

from worker.core.parsing.engine.arguments import WS, ArgEvent, XmlArguments, is_ws
from worker.core.parsing.engine.config import EngineConfig, Event, State, Transitions, thinking_requested
from worker.core.parsing.engine.family import EngineFamily
from worker.core.parsing.engine.reasoning import EngineReasoningParser
from worker.core.parsing.engine.tools import EngineToolParser
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
#: vLLM's argument patterns: ``find_args`` and ``find_open_arg`` return what they match.
ARG_RE = re.compile(rf"<arg_key>(.*?)</arg_key>{WS}*<arg_value>(.*?)</arg_value>", re.DOTALL)
OPEN_ARG_RE = re.compile(rf"<arg_key>(.*?)</arg_key>{WS}*<arg_value>(.*)$", re.DOTALL)
_KEY, _KEY_END = "<arg_key>", "</arg_key>"
_VALUE, _VALUE_END = "<arg_value>", "</arg_value>"
_WS_RUN = re.compile(rf"{WS}*")


def _value_start(raw: str, key_start: int) -> tuple[int, int] | None:
    """Where the key from ``key_start`` ends and its value starts: the first
    ``</arg_key>`` from there followed by blanks and ``<arg_value>``."""
    key_end = raw.find(_KEY_END, key_start)
    while key_end >= 0:
        # A blank run stops at the next tag's "<": the runs are disjoint. (``*`` always matches.)
        blanks_end = cast(re.Match[str], _WS_RUN.match(raw, key_end + len(_KEY_END))).end()
        if raw.startswith(_VALUE, blanks_end):
            return key_end, blanks_end + len(_VALUE)
        key_end = raw.find(_KEY_END, blanks_end)
    return None


def find_args(raw: str) -> list[tuple[str, str, int, int]]:
    """``(key, value, start, end)`` of each ``ARG_RE.finditer(raw)`` match, in linear time.

    The regex retries every later ``</arg_key>`` and, from each, scans to the end
    for ``</arg_value>``, for every ``<arg_key>``: cubic on values that never
    close. A match takes the first ``</arg_key>`` followed by blanks and
    ``<arg_value>`` (later ones only come with later values) and the first
    ``</arg_value>`` after it; when either is missing, every later ``<arg_key>``
    fails the same way, so the scan stops.
    """
    found: list[tuple[str, str, int, int]] = []
    key = raw.find(_KEY)
    while key >= 0:
        value = _value_start(raw, key + len(_KEY))
        if value is None:
            break
        key_end, value_start = value
        value_end = raw.find(_VALUE_END, value_start)
        if value_end < 0:
            break
        end = value_end + len(_VALUE_END)
        found.append((raw[key + len(_KEY) : key_end], raw[value_start:value_end], key, end))
        key = raw.find(_KEY, end)
    return found


def find_open_arg(text: str) -> tuple[str, str] | None:
    """The groups of ``OPEN_ARG_RE.search(text)``: the value runs to the end
    (``$`` then matches at the very end), so only the first ``<arg_key>`` can match."""
    key = text.find(_KEY)
    value = _value_start(text, key + len(_KEY)) if key >= 0 else None
    if value is None:
        return None
    key_end, value_start = value
    return text[key + len(_KEY) : key_end], text[value_start:]


def _parse_args(raw: str, partial: bool) -> tuple[dict[str, Any], str | None]:
    """The arguments, and the key of a still-open trailing value."""
    params: dict[str, Any] = {}
    matches = find_args(raw)
    for key, value, _, _ in matches:
        params[key.strip()] = value
    open_key = None
    if partial:
        # what is left once the closed arguments are cut out (``ARG_RE.sub("", raw)``)
        pieces, last = [], 0
        for _, _, start, end in matches:
            pieces.append(raw[last:start])
            last = end
        pieces.append(raw[last:])
        open_match = find_open_arg("".join(pieces))
        if open_match:
            key = open_match[0].strip()
            if key:
                params[key] = open_match[1]
                open_key = key
    return params, open_key


def convert_args(raw: str, partial: bool) -> str:
    return json.dumps(_parse_args(raw, partial)[0], ensure_ascii=False)


# -- the streaming argument scanner: ``convert_args`` in one pass ----------------------


class GlmArgScanner:
    """``<arg_key>K</arg_key>\\s*<arg_value>V</arg_value>`` pairs, fed the parser's argument pieces.

    The lexer hands every ``<arg_key>``-family marker over as a piece of its own, so the
    scan works on pieces: a marker is one step, a text piece never holds one.
    """

    _KEY_START, _KEY_END, _VALUE_START, _VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"

    def __init__(self) -> None:
        self._state = "seek"
        self._key: list[str] = []
        self._ws = ""
        self._value: list[str] = []
        self._open = False

    def feed(self, piece: str) -> list[ArgEvent]:
        state = self._state
        if state == "seek":
            if piece == self._KEY_START:
                self._state, self._key = "key", []
            return []
        if state == "key":
            if piece == self._KEY_END:
                self._state, self._ws = "key_end", ""
            else:
                self._key.append(piece)
            return []
        if state == "key_end":
            if piece == self._VALUE_START:
                key = "".join(self._key).strip()
                self._state, self._value, self._open = "value", [], bool(key)
                self._key = [key]
                return [("open", key)] if key else []
            if all(is_ws(ch) for ch in piece):
                self._ws += piece
                return []
            # Not followed by <arg_value>: the lazy key runs on past this </arg_key>.
            self._key += [self._KEY_END, self._ws]
            self._ws = ""
            if piece == self._KEY_END:
                return []
            self._state = "key"
            self._key.append(piece)
            return []
        if piece == self._VALUE_END:
            self._state = "seek"
            self._open = False
            return [("done", self._key[0], "".join(self._value))]
        self._value.append(piece)
        return [("grow", piece)] if self._open and piece else []


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


class Glm47(EngineFamily):
    @classmethod
    def config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return glm_config(thinking_requested(chat_template_kwargs))

    @classmethod
    def tool_config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return glm_config(thinking_enabled(tokenizer, chat_template_kwargs))

    @classmethod
    def reasoning_enabled(
        cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any], config: EngineConfig
    ) -> bool:
        # Unlike the tool side, no "template always thinks" override here.
        return thinking_requested(chat_template_kwargs)


class Glm45ReasoningParser(EngineReasoningParser):
    family = Glm47


class Glm47MoeToolParser(EngineToolParser):
    family = Glm47
