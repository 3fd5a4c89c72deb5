"""The DeepSeek DSML family: ``deepseek_v4`` reasoning and tools, ``deepseek_v32`` tools.

vLLM 0.33.0's ``DeepSeekV4Parser`` and ``DeepSeekV32Parser`` (vllm/parser/deepseek_v4.py,
deepseek_v32.py), one format with two wrappers::

    <think>...</think>                          (V4 only)
    <｜DSML｜tool_calls>                          (V3.2: <｜DSML｜function_calls>)
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">5</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

Behaviour matched:

* V4 starts in reasoning unless ``thinking``/``enable_thinking`` is false
  (when either is given) or ``reasoning_effort`` is ``"none"``; a block opened
  inside ``<think>`` ends the reasoning. ``<｜DSML｜toolcalls>`` and
  ``<｜DSML｜tool>`` also open a V4 block.
* Content before a block keeps its whitespace; text after the closing block
  is dropped (the parser stays in a tool state).
* ``string="true"`` values stay strings; others (``string="false"`` or no
  attribute) are JSON-decoded when they parse, else kept as text; then the
  tool schema types them. A value ends at its closing tag or at the next
  ``<｜DSML｜parameter name=``.
* Streaming sends an argument delta only for a record whose argument text
  holds a ``>`` (vLLM's ``arg_structural_chars``); an open ``string="true"``
  value then streams as far as it came. A ``length`` cut inside a value:
  the stream has sent it so far, one-shot drops it.
* One-shot arguments shaped ``{"arguments": {...}}`` or ``{"input": {...}}``
  whose inner keys are the tool's (and the wrapper is not) are unwrapped.
  vLLM applies this to streamed arguments too, where it only matters for a
  call written so; here the stream sends them as written.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from worker.core.parsing.engine.arguments import WS, ArgEvent, XmlArguments, is_ws
from worker.core.parsing.engine.config import EngineConfig, Event, State, Transitions
from worker.core.parsing.engine.family import EngineFamily
from worker.core.parsing.engine.reasoning import EngineReasoningParser
from worker.core.parsing.engine.schema import ToolSchemas
from worker.core.parsing.engine.tools import EngineToolParser
from worker.core.parsing.types import ParserTokenizer

_DSML = "｜DSML｜"
THINK_START = "<think>"
THINK_END = "</think>"
V4_TOOL_START = f"<{_DSML}tool_calls>"
V4_TOOL_END = f"</{_DSML}tool_calls>"
#: other spellings of the V4 block opener seen in production (matched by text)
V4_TOOL_START_VARIANTS = (f"<{_DSML}toolcalls>", f"<{_DSML}tool>")
V32_TOOL_START = f"<{_DSML}function_calls>"
V32_TOOL_END = f"</{_DSML}function_calls>"
INVOKE_PREFIX = f'<{_DSML}invoke name="'
INVOKE_NAME_END = '">'
INVOKE_END = f"</{_DSML}invoke>"
PARAM_START = f"<{_DSML}parameter"
PARAM_CLOSE = f"</{_DSML}parameter>"

# -- the argument converter (vLLM's regular expressions, run once on one-shot output) ----

_HEAD = rf'{re.escape(PARAM_START)}{WS}+name="([^"]+)"(?:{WS}+string="([^"]*)")?{WS}*>'
_PARAM_RE = re.compile(
    rf"{_HEAD}(.*?)(?:{re.escape(PARAM_CLOSE)}|(?={re.escape(PARAM_START)}{WS}+name=))", re.DOTALL
)
_OPEN_PARAM_RE = re.compile(rf"{_HEAD}(.*)$", re.DOTALL)


def decode_value(value: str, fields: tuple[str, ...]) -> Any:
    """``string="true"``: the text; otherwise its JSON value when it parses, else the text."""
    if fields and fields[0] == "true":
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def convert_args(raw: str, partial: bool) -> str:
    params: dict[str, Any] = {}
    last_end = 0
    for match in _PARAM_RE.finditer(raw):
        params[match.group(1)] = decode_value(match.group(3), (match.group(2) or "",))
        last_end = match.end()
    if partial:
        open_match = _OPEN_PARAM_RE.search(raw, last_end)
        if open_match:
            name, is_str, value = open_match.group(1), open_match.group(2), open_match.group(3)
            if is_str == "true":
                params[name] = value
            else:
                with contextlib.suppress(ValueError):
                    params[name] = json.loads(value)
    return json.dumps(params, ensure_ascii=False)


def unwrap_wrapper_args(args_json: str, schemas: ToolSchemas, name: str) -> str:
    """``{"arguments": {...}}``/``{"input": {...}}`` around the tool's own keys → the inner object."""
    if not name:
        return args_json
    try:
        args = json.loads(args_json)
    except ValueError:
        return args_json
    properties = schemas.properties(name)
    if not isinstance(args, dict) or not properties:
        return args_json
    allowed = set(properties)
    for wrapper in ("arguments", "input"):
        if set(args) != {wrapper} or wrapper in allowed:
            continue
        inner = args[wrapper]
        if isinstance(inner, str):
            try:
                inner = json.loads(inner)
            except ValueError:
                return args_json
        if isinstance(inner, dict) and set(inner).issubset(allowed):
            return json.dumps(inner, ensure_ascii=False)
    return args_json


# -- the streaming argument scanner: ``convert_args`` in one pass -------------------------

#: the header after ``<｜DSML｜parameter``: blanks, ``name="N"``, optional blanks and ``string="S"``, ``>``
_NAME_LIT = 'name="'
_STRING_LIT = 'string="'
_NEXT_LIT = "name="


class DsmlArgScanner:
    """DSML ``<｜DSML｜parameter name="K" string="S">V</｜DSML｜parameter>`` items, from argument pieces.

    The lexer hands ``<｜DSML｜parameter`` and ``</｜DSML｜parameter>`` over as pieces of their own.
    The header is read one character at a time (no re-reading); a value streams only when
    its ``string`` attribute is ``"true"`` (others appear once done, as vLLM's partial
    conversion leaves them out until they parse).
    """

    def __init__(self) -> None:
        self._state = "seek"
        self._pos = 0  # position in the literal being matched, or blanks seen
        self._name: list[str] = []
        self._string: list[str] | None = None
        self._value: list[str] = []
        self._open = False
        self._lookahead: list[str] = []  # text after a possible next ``<｜DSML｜parameter``

    def feed(self, piece: str) -> list[ArgEvent]:
        events: list[ArgEvent] = []
        state = self._state
        if state == "seek":
            if piece == PARAM_START:
                self._start_header()
            return events
        if state == "value":
            if piece == PARAM_CLOSE:
                self._finish(events)
                self._state = "seek"
            elif piece == PARAM_START:
                self._state, self._pos, self._lookahead = "next", 0, []
            else:
                self._grow(piece, events)
            return events
        if state == "next":
            if piece in (PARAM_START, PARAM_CLOSE):
                self._not_next(events)
                return events + self.feed(piece)
            for i, ch in enumerate(piece):
                if self._next_step(ch):
                    continue
                if self._state == "next":  # not a next parameter: all of it was value text
                    self._lookahead.append(piece[i:])
                    self._not_next(events)
                    return events
                # ``\s+name=`` seen: the value ended before the marker; read the header on
                self._finish(events)
                self._start_header()
                self._header_feed(" " + _NEXT_LIT, events)  # the header so far, normalised
                self._header_feed(piece[i + 1 :], events)
                return events
            self._lookahead.append(piece)
            return events
        # header: a marker where "<" cannot continue it starts the next candidate (the
        # regular expression's next match); inside a quoted name or string it is text
        if piece == PARAM_START and state not in ("h_name", "h_string"):
            self._start_header()
            return events
        self._header_feed(piece, events)
        return events

    # -- the value ----------------------------------------------------------------------

    def _grow(self, text: str, events: list[ArgEvent]) -> None:
        if text:
            self._value.append(text)
            if self._open:
                events.append(("grow", text))

    def _finish(self, events: list[ArgEvent]) -> None:
        string = "".join(self._string) if self._string is not None else ""
        events.append(("done", "".join(self._name), "".join(self._value), string))
        self._open = False

    def _next_step(self, ch: str) -> bool:
        """One character of ``\\s+name=`` after a possible next marker; False ends the check
        (``_state`` still "next": it failed; else it matched)."""
        if self._pos == 0 or (self._pos == 1 and is_ws(ch)):
            if not is_ws(ch):
                return False
            self._pos = 1
            return True
        matched = self._pos - 1
        if ch != _NEXT_LIT[matched]:
            return False
        self._pos += 1
        if matched + 1 == len(_NEXT_LIT):
            self._state = "matched"
            return False
        return True

    def _not_next(self, events: list[ArgEvent]) -> None:
        self._state = "value"
        self._grow(PARAM_START + "".join(self._lookahead), events)
        self._lookahead = []

    # -- the header ---------------------------------------------------------------------

    def _start_header(self) -> None:
        self._state, self._pos = "h_blank", 0
        self._name, self._string, self._value, self._open = [], None, [], False

    def _header_feed(self, text: str, events: list[ArgEvent]) -> None:
        for i, ch in enumerate(text):
            if self._state == "seek":
                return
            if self._header_step(ch):
                self._state = "value"
                string = "".join(self._string) if self._string is not None else ""
                self._open = string == "true"
                if self._open:
                    events.append(("open", "".join(self._name)))
                self._grow(text[i + 1 :], events)
                return

    def _header_step(self, ch: str) -> bool:
        """One header character; True when the header is complete (its ``>``)."""
        state = self._state
        if state == "h_blank":  # \s+ then name="
            if is_ws(ch):
                self._pos = 1
            elif self._pos and ch == _NAME_LIT[0]:
                self._state, self._pos = "h_name_lit", 1
            else:
                self._state = "seek"
        elif state == "h_name_lit":
            if ch == _NAME_LIT[self._pos]:
                self._pos += 1
                if self._pos == len(_NAME_LIT):
                    self._state = "h_name"
            else:
                self._state = "seek"
        elif state == "h_name":  # [^"]+ then "
            if ch != '"':
                self._name.append(ch)
            elif self._name:
                self._state, self._pos = "h_after_name", 0
            else:
                self._state = "seek"
        elif state == "h_after_name":  # \s* > | \s+ string="
            if ch == ">":
                return True
            if is_ws(ch):
                self._pos = 1
            elif self._pos and ch == _STRING_LIT[0]:
                self._state, self._pos = "h_string_lit", 1
            else:
                self._state = "seek"
        elif state == "h_string_lit":
            if ch == _STRING_LIT[self._pos]:
                self._pos += 1
                if self._pos == len(_STRING_LIT):
                    self._state, self._string = "h_string", []
            else:
                self._state = "seek"
        elif state == "h_string":  # [^"]* then "
            assert self._string is not None
            if ch == '"':
                self._state = "h_end"
            else:
                self._string.append(ch)
        elif state == "h_end":  # \s* >
            if ch == ">":
                return True
            if not is_ws(ch):
                self._state = "seek"
        return False


DSML_ARGUMENTS = XmlArguments(
    convert_args, DsmlArgScanner, decode=decode_value, structural_chars=frozenset(">")
)

# -- the configs ------------------------------------------------------------------------

R, C = State.REASONING, State.CONTENT
PRE, NAME, ARGS, BETWEEN = State.TOOL_PREAMBLE, State.TOOL_NAME, State.TOOL_ARGS, State.TOOL_BETWEEN
_START, _END = Event.CALL_START, Event.CALL_END


def _tool_transitions() -> Transitions:
    return {
        (C, "TOOL_START"): (PRE, ()),
        (PRE, "INVOKE_PREFIX"): (NAME, (_START,)),
        (C, "INVOKE_PREFIX"): (NAME, (_START,)),
        (NAME, "INVOKE_NAME_END"): (ARGS, ()),
        (ARGS, "INVOKE_END"): (BETWEEN, (_END,)),
        (ARGS, "TOOL_END"): (BETWEEN, (_END,)),
        (BETWEEN, "INVOKE_PREFIX"): (NAME, (_START,)),
        # a tool call ends the turn: text after the block is dropped
        (BETWEEN, "TOOL_END"): (BETWEEN, ()),
        (BETWEEN, "TOOL_START"): (PRE, ()),
    }


_CALL_MARKERS = {
    "INVOKE_PREFIX": INVOKE_PREFIX,
    "INVOKE_NAME_END": INVOKE_NAME_END,
    "INVOKE_END": INVOKE_END,
    "PARAM_START": PARAM_START,
    "PARAM_CLOSE": PARAM_CLOSE,
}


def deepseek_v4_config(thinking: bool) -> EngineConfig:
    """vLLM's ``deepseek_v4_config``."""
    transitions = _tool_transitions()
    transitions.update(
        {
            (C, "THINK_START"): (R, (Event.REASONING_START,)),
            (C, "THINK_END"): (C, ()),
            (R, "THINK_START"): (R, ()),
            (R, "THINK_END"): (C, (Event.REASONING_END,)),
            (R, "TOOL_START"): (PRE, (Event.REASONING_END,)),
        }
    )
    return EngineConfig(
        terminals={
            "THINK_START": THINK_START,
            "THINK_END": THINK_END,
            "TOOL_START": V4_TOOL_START,
            "TOOL_END": V4_TOOL_END,
            **_CALL_MARKERS,
        },
        variants={"TOOL_START": V4_TOOL_START_VARIANTS},
        id_terminals=("THINK_START", "THINK_END", "TOOL_START", "TOOL_END"),
        transitions=transitions,
        initial=R if thinking else C,
        wait_for_reasoning=thinking,
        end_markers=("THINK_END", "TOOL_START"),
        arguments=DSML_ARGUMENTS,
        strip_content_ws_with_tools=False,
    )


def deepseek_v32_config() -> EngineConfig:
    """vLLM's ``deepseek_v32_config``: V4's tools with the ``function_calls`` wrapper, no reasoning."""
    return EngineConfig(
        terminals={"TOOL_START": V32_TOOL_START, "TOOL_END": V32_TOOL_END, **_CALL_MARKERS},
        id_terminals=("TOOL_START", "TOOL_END"),
        transitions=_tool_transitions(),
        initial=C,
        arguments=DSML_ARGUMENTS,
        strip_content_ws_with_tools=False,
    )


def v4_thinking(chat_template_kwargs: dict[str, Any]) -> bool:
    """On unless ``thinking``/``enable_thinking`` (when given) are both false, or no reasoning effort."""
    kwargs = chat_template_kwargs
    if "thinking" in kwargs or "enable_thinking" in kwargs:
        thinking = bool(kwargs.get("thinking") or kwargs.get("enable_thinking"))
    else:
        thinking = True
    return thinking and kwargs.get("reasoning_effort") != "none"


class DeepSeekV4(EngineFamily):
    @classmethod
    def config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return deepseek_v4_config(v4_thinking(chat_template_kwargs))


class DeepSeekV32(EngineFamily):
    @classmethod
    def config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return deepseek_v32_config()


class _DsmlToolParser(EngineToolParser):
    supports_required_and_named = False  # structural tags "deepseek_v4" / "deepseek_v3_2"

    def _convert_args(self, name: str, raw: str) -> str:
        return unwrap_wrapper_args(super()._convert_args(name, raw), self._schemas, name)


class DeepSeekV4ReasoningParser(EngineReasoningParser):
    family = DeepSeekV4


class DeepSeekV4ToolParser(_DsmlToolParser):
    family = DeepSeekV4


class DeepSeekV32ToolParser(_DsmlToolParser):
    family = DeepSeekV32
