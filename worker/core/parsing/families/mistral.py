"""The Mistral family: ``mistral`` reasoning and tools (vLLM's ``MistralParser`` and ``MistralToolParser``).

Reasoning (vLLM's ``MistralParserReasoningAdapter``, the engine config with
tools off) uses ``[THINK]``/``[/THINK]`` when the vocabulary has them. vLLM's
plain-text ``<think>`` variant needs a mistral-common tokenizer
(``supports_grammar``), which a ``tokenizer.json`` model never is, so such
models get no reasoning at all: everything is content. vLLM builds the whole
Mistral parser for reasoning too, which insists on the ``[TOOL_CALLS]`` token.

Tools: vLLM's ``MistralToolParser`` (an adapter over its ``MistralParser`` engine).

Tokenizers without ``[ARGS]`` (pre-v11, e.g. Mistral-7B-v0.3) take vLLM's
legacy path: ``[TOOL_CALLS]`` followed by a JSON array (or one bare object) of
``{"name": ..., "arguments": {...}}``; with ``required``/named ``tool_choice``
the model may also write that array without the marker. Tool-call ids are 9
random alphanumerics.

Streaming (pre-v11) follows vLLM's ijson-driven state machine, fed only what
each record adds (:class:`_JsonEvents` reproduces yajl's event timing):

* text before the marker is content, as is a record's text ahead of the marker;
* a call's name streams once its string is closed; the arguments object
  streams as the raw text the model wrote (leading whitespace of its first
  piece stripped), including the closing ``}``, so a ``length`` cut leaves it
  open;
* string-valued ``arguments`` stream the decoded string, not JSON;
* once the top-level array (or bare object) closes, the rest of a record is
  content;
* a JSON syntax error silences that record and every later one that carries
  text (vLLM's parser coroutine is dead from then on);
* ``tool_choice: "none"`` still runs the parser (vLLM's engine-adapter route)
  and drops the calls, so text after the marker vanishes; one-shot keeps the
  whole output as content instead.

One-shot (pre-v11): the first non-blank segment after a marker is decoded with
``raw_decode`` (falling back to the first ``[{...}]``); no usable call returns
that segment, stripped, as content.

Tokenizers with ``[ARGS]`` (v11+) run the parser engine's
``[TOOL_CALLS]name[ARGS]{...}`` config; see :mod:`worker.core.parsing.engine` for the engine.
Mistral has no structural tag but vLLM marks it
``supports_required_and_named = False``: ``required``/named choices are parsed
like ``auto``.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Sequence
from typing import Any

from worker.core.parsing.base import ToolParser
from worker.core.parsing.engine.config import EngineConfig, Event, State, Transitions
from worker.core.parsing.engine.family import EngineFamily
from worker.core.parsing.engine.reasoning import EngineReasoningParser
from worker.core.parsing.engine.tools import CallSlot, EngineToolParser
from worker.core.parsing.types import (
    DeltaOut,
    ExtractedCalls,
    FunctionDeltaOut,
    ParseRequest,
    ParserTokenizer,
    ToolCallDeltaOut,
    ToolCallOut,
)
from worker.errors import ParserSetupError

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_ALNUM = string.ascii_letters + string.digits
#: vLLM's fallback for a payload JSON rejects; ``find_array`` returns what its ``findall`` does.
ARRAY_RE = re.compile(r"\[{.*}\]", re.DOTALL)


def find_array(text: str) -> list[str]:
    """``ARRAY_RE.findall(text)`` in linear time: from the first ``[{`` to the last ``}]`` after it.

    The regex tries every ``[{`` and, from each, backs off from the end of the
    text to the last ``}]``: quadratic on many ``[{`` and no ``}]``. Its greedy
    ``.*`` runs to the last ``}]`` of the text, so it matches at most once.
    """
    start = text.find("[{")
    end = text.rfind("}]", start + 2) if start >= 0 else -1
    return [text[start : end + 2]] if end >= 0 else []


MISTRAL_TOOL_CALL_ID = re.compile(r"[A-Za-z0-9]{9}")
"""What ``mistral_tool_call_id`` makes (``fullmatch``): the audit renames these, as random."""


def mistral_tool_call_id() -> str:
    """Mistral requires 9 alphanumeric characters."""
    return "".join(random.choices(_ALNUM, k=9))


# ---------------------------------------------------------------------------
# Incremental JSON events with the timing of ijson's yajl2_c backend.
#
# What clients see depends on *when* each event fires and on which record a
# syntax error surfaces: a string event fires at its closing quote, a literal at
# its last letter, a number at the first character after it, punctuation at
# once. A token in the wrong place is rejected when it is complete; a character
# that cannot start or continue any token, at that character. After an error
# every later feed fails again.
# ---------------------------------------------------------------------------
_Event = tuple[str, str, Any]  # (prefix, event name, value)

_WS = frozenset(" \t\n\v\f\r")
_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")
_LITERALS = {"t": ("true", True), "f": ("false", False), "n": ("null", None)}
_SURROGATE = re.compile("[\ud800-\udfff]")

# grammar positions
_VALUE, _VALUE_OR_CLOSE, _KEY_OR_CLOSE, _KEY, _COLON, _NEXT, _DONE = range(7)
# number states; the "open" ones cannot end a number
_MINUS, _ZERO, _INT, _DOT, _FRAC, _EXP_MARK, _EXP_SIGN, _EXP = range(8)
_OPEN_NUMBER = frozenset({_MINUS, _DOT, _EXP_MARK, _EXP_SIGN})


class _JsonSyntaxError(Exception):
    """The text so far is not a prefix of one JSON value."""


class _JsonEvents:
    def __init__(self) -> None:
        self._failed = False
        self._expect = _VALUE
        self._kinds: list[str] = []  # "map" / "array" per open container
        # ijson's prefixes per open container: its own, and that of its values
        # (a root map's values drop the dot; "item" drops it after "")
        self._outer: list[str] = []
        self._inner: list[str] = []
        # lexer
        self._token: str | None = None  # "str" / "num" / "lit"
        self._raw: list[str] = []
        self._escape = 0  # 0 none, 1 after backslash, 2..5 inside \\uXXXX
        self._number = _INT
        self._literal = ""
        self._literal_pos = 0

    def feed(self, text: str) -> list[_Event]:
        if self._failed:
            raise _JsonSyntaxError("parser already failed")
        events: list[_Event] = []
        try:
            for ch in text:
                self._char(ch, events)
        except _JsonSyntaxError:
            self._failed = True
            raise
        return events

    # -- lexer -----------------------------------------------------------

    def _char(self, ch: str, events: list[_Event]) -> None:
        token = self._token
        if token == "str":
            self._string_char(ch, events)
            return
        if token == "num":
            if self._number_char(ch):
                return
            self._token = None
            self._scalar(_number_value("".join(self._raw)), events)
        elif token == "lit":
            literal = self._literal
            if ch != literal[self._literal_pos]:
                raise _JsonSyntaxError(f"invalid literal at {ch!r}")
            self._literal_pos += 1
            if self._literal_pos == len(literal):
                self._token = None
                self._scalar(_LITERALS[literal[0]][1], events)
            return
        if ch in _WS:
            return
        if ch in "{}[],:":
            self._punct(ch, events)
        elif ch == '"':
            self._token, self._raw, self._escape = "str", [], 0
        elif ch == "-" or ch in _DIGITS:
            self._token, self._raw = "num", [ch]
            self._number = _MINUS if ch == "-" else _ZERO if ch == "0" else _INT
        elif ch in _LITERALS:
            self._token, self._literal, self._literal_pos = "lit", _LITERALS[ch][0], 1
        else:
            raise _JsonSyntaxError(f"invalid character {ch!r}")

    def _string_char(self, ch: str, events: list[_Event]) -> None:
        esc = self._escape
        if esc == 1:
            if ch not in _ESCAPES:
                raise _JsonSyntaxError(f"invalid escape {ch!r}")
            self._escape = 2 if ch == "u" else 0
        elif esc >= 2:
            if ch not in _HEX:
                raise _JsonSyntaxError(f"invalid unicode escape {ch!r}")
            self._escape = 0 if esc == 5 else esc + 1
        elif ch == "\\":
            self._escape = 1
        elif ch == '"':
            self._token = None
            # yajl turns a lone surrogate escape into "?"
            value = _SURROGATE.sub("?", json.loads('"' + "".join(self._raw) + '"'))
            self._string(value, events)
            return
        elif ord(ch) < 0x20:
            raise _JsonSyntaxError("control character in string")
        self._raw.append(ch)

    def _number_char(self, ch: str) -> bool:
        """Consume ``ch`` into the number; False when the number ended before it."""
        state = self._number
        digit = ch in _DIGITS
        nxt: int | None = None
        if state == _MINUS:
            nxt = (_ZERO if ch == "0" else _INT) if digit else None
        elif state in (_ZERO, _INT):
            if digit and state == _INT:
                nxt = _INT
            elif ch == ".":
                nxt = _DOT
            elif ch in "eE":
                nxt = _EXP_MARK
        elif state in (_DOT, _FRAC):
            if digit:
                nxt = _FRAC
            elif ch in "eE" and state == _FRAC:
                nxt = _EXP_MARK
        elif state == _EXP_MARK:
            nxt = _EXP if digit else _EXP_SIGN if ch in "+-" else None
        else:  # _EXP_SIGN / _EXP
            nxt = _EXP if digit else None
        if nxt is None:
            if state in _OPEN_NUMBER:
                raise _JsonSyntaxError(f"malformed number at {ch!r}")
            return False
        self._number = nxt
        self._raw.append(ch)
        return True

    # -- grammar ---------------------------------------------------------

    def _prefix(self) -> str:
        """Prefix of a value at the current position."""
        return self._inner[-1] if self._inner else ""

    def _after_value(self) -> None:
        self._expect = _NEXT if self._kinds else _DONE

    def _punct(self, ch: str, events: list[_Event]) -> None:
        expect = self._expect
        if ch in "{[":
            if expect not in (_VALUE, _VALUE_OR_CLOSE):
                raise _JsonSyntaxError(f"unexpected {ch!r}")
            outer = self._prefix()
            events.append((outer, "start_map" if ch == "{" else "start_array", None))
            self._kinds.append("map" if ch == "{" else "array")
            self._outer.append(outer)
            self._inner.append(outer if ch == "{" else f"{outer}.item" if outer else "item")
            self._expect = _KEY_OR_CLOSE if ch == "{" else _VALUE_OR_CLOSE
        elif ch in "}]":
            kind = "map" if ch == "}" else "array"
            allowed = (_KEY_OR_CLOSE, _NEXT) if kind == "map" else (_VALUE_OR_CLOSE, _NEXT)
            if not self._kinds or self._kinds[-1] != kind or expect not in allowed:
                raise _JsonSyntaxError(f"unexpected {ch!r}")
            self._kinds.pop()
            self._inner.pop()
            events.append((self._outer.pop(), "end_map" if kind == "map" else "end_array", None))
            self._after_value()
        elif ch == ",":
            if expect != _NEXT:
                raise _JsonSyntaxError("unexpected ','")
            self._expect = _KEY if self._kinds[-1] == "map" else _VALUE
        else:  # ":"
            if expect != _COLON:
                raise _JsonSyntaxError("unexpected ':'")
            self._expect = _VALUE

    def _string(self, value: str, events: list[_Event]) -> None:
        if self._expect in (_KEY_OR_CLOSE, _KEY):
            outer = self._outer[-1]
            self._inner[-1] = value if len(self._outer) == 1 else f"{outer}.{value}"
            events.append((outer, "map_key", value))
            self._expect = _COLON
            return
        self._value_event("string", value, events)

    def _scalar(self, value: Any, events: list[_Event]) -> None:
        self._value_event("scalar", value, events)

    def _value_event(self, name: str, value: Any, events: list[_Event]) -> None:
        if self._expect not in (_VALUE, _VALUE_OR_CLOSE):
            raise _JsonSyntaxError("unexpected value")
        events.append((self._prefix(), name, value))
        self._after_value()


def _number_value(raw: str) -> Any:
    return float(raw) if any(c in raw for c in ".eE") else int(raw)


# ---------------------------------------------------------------------------
# The pre-v11 streaming state machine.
# ---------------------------------------------------------------------------

(
    _WAIT_TOOL_START,
    _WAIT_TOOL_KEY,
    _PARSING_NAME,
    _NAME_DONE,
    _WAIT_ARGS_START,
    _PARSING_ARGS,
    _ARGS_DONE,
    _TOOL_DONE,
    _ALL_DONE,
) = range(9)

# After which character each state stops the piece it hands to the JSON parser
# (vLLM splits a record so it can tell which text produced which event).
_STOPS: dict[int, frozenset[str]] = {
    _WAIT_TOOL_START: frozenset("{"),
    _WAIT_TOOL_KEY: frozenset(":{}"),
    _PARSING_NAME: frozenset(",]}"),
    _WAIT_ARGS_START: frozenset("{}"),
    _PARSING_ARGS: frozenset("}"),
    _ARGS_DONE: frozenset("}]"),
    _NAME_DONE: frozenset("}]"),
    _TOOL_DONE: frozenset("{]"),
}


def _split(text: str, stops: frozenset[str]) -> tuple[str, str]:
    for i, ch in enumerate(text):
        if ch in stops:
            return text[: i + 1], text[i + 1 :]
    return text, ""


def _function_calls(parsed: Any) -> list[tuple[str, str]]:
    """(name, arguments) of the decoded pre-v11 payload; entries that are not calls are skipped."""
    if isinstance(parsed, dict):
        parsed = [parsed]
    if not isinstance(parsed, list):
        return []
    calls: list[tuple[str, str]] = []
    for item in parsed:
        if not isinstance(item, dict) or ("name" not in item and "arguments" not in item):
            continue
        name = item.get("name")
        arguments = item.get("arguments")
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append((name if isinstance(name, str) else "", arguments))
    return calls


def _forced(request: ParseRequest) -> bool:
    return request.tool_choice == "required" or request.named_function is not None


# -- Mistral v11+ (``[TOOL_CALLS]name[ARGS]{...}``): the engine path ----------------------

MISTRAL_THINK_START = "[THINK]"
MISTRAL_THINK_END = "[/THINK]"


CONTENT, REASONING, NAME, ARGS_STATE = State.CONTENT, State.REASONING, State.TOOL_NAME, State.TOOL_ARGS
ARG, CALL_START, CALL_END, THINK_END = Event.ARG, Event.CALL_START, Event.CALL_END, Event.REASONING_END


def mistral_config(special_think: bool) -> EngineConfig:
    """vLLM's ``MistralParser`` config (vllm/parser/mistral.py), for the reasoning and v11+ tool adapters."""
    markers = {"TOOL_CALLS": "[TOOL_CALLS]", "ARGS": "[ARGS]", "OPEN_BRACE": "{"}
    ids = ["TOOL_CALLS", "ARGS"]
    transitions: Transitions = {
        (CONTENT, "TOOL_CALLS"): (NAME, (THINK_END, CALL_START) if special_think else (CALL_START,)),
        (NAME, "ARGS"): (ARGS_STATE, ()),
        # ``name{...}`` without [ARGS]: the brace is the first argument text
        (NAME, "OPEN_BRACE"): (ARGS_STATE, (ARG,)),
        (ARGS_STATE, "TOOL_CALLS"): (NAME, (CALL_END, CALL_START)),
    }
    if special_think:
        markers = {"THINK_START": MISTRAL_THINK_START, "THINK_END": MISTRAL_THINK_END, **markers}
        ids = ["THINK_START", "THINK_END", *ids]
        transitions.update(
            {
                (CONTENT, "THINK_START"): (REASONING, ()),
                (REASONING, "THINK_START"): (REASONING, ()),
                (REASONING, "THINK_END"): (CONTENT, (THINK_END,)),
                (CONTENT, "THINK_END"): (CONTENT, ()),
                (REASONING, "TOOL_CALLS"): (NAME, (THINK_END, CALL_START)),
            }
        )
    return EngineConfig(
        terminals=markers,
        id_terminals=tuple(ids),
        transitions=transitions,
        initial=CONTENT,
        wait_for_reasoning=special_think,
        end_markers=("THINK_END", "TOOL_CALLS") if special_think else (),
        resend_announcing_chunk=True,
    )


class Mistral(EngineFamily):
    @classmethod
    def config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        # Hugging Face tokenizers have no Mistral grammar support: reasoning is
        # only recognised through [THINK] special tokens.
        return mistral_config(MISTRAL_THINK_START in tokenizer.get_vocab())

    @classmethod
    def reasoning_enabled(
        cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any], config: EngineConfig
    ) -> bool:
        return "THINK_START" in config.terminals


class MistralReasoningParser(EngineReasoningParser):
    family = Mistral

    def __init__(self, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> None:
        if tokenizer.token_to_id(TOOL_CALLS) is None:
            raise ParserSetupError("Mistral parser could not locate the tool call token in the tokenizer!")
        super().__init__(tokenizer, chat_template_kwargs)


class MistralEngineToolParser(EngineToolParser):
    """vLLM's ``MistralParser`` engine path (tokenizers with ``[ARGS]``); not registered itself."""

    family = Mistral

    # Hooks, as vLLM's MistralParser overrides them.

    def _ensure_id(self, slot: CallSlot, name: str) -> None:
        if not slot.id:
            slot.id = mistral_tool_call_id()

    def _accept(self, name: str) -> bool:
        # Once [ARGS] or "{" ended the name it is final, even when empty.
        return True

    def _name_from_args(self, slot: CallSlot) -> str | None:
        return slot.name

    def _name_and_args(self, raw: str) -> tuple[str, str]:
        # never a {"name", "arguments"} envelope: a "name" argument stays an argument
        return "", self._raw_args_json(raw)

    def _raw_args_json(self, body: str) -> str:
        # The first JSON value; the model may write text after it.
        stripped = body.strip()
        if not stripped:
            return "{}"
        try:
            _, end = json.JSONDecoder().raw_decode(stripped)
        except ValueError:
            return stripped
        return stripped[:end]


class MistralToolParser(ToolParser):
    engine_based = True
    supports_required_and_named = False

    def setup(self) -> None:
        tokenizer = self.tokenizer
        chat_template_kwargs = self.chat_template_kwargs
        tools = self.tools
        vocab = tokenizer.get_vocab()
        self._bot_id = vocab.get(TOOL_CALLS)
        if self._bot_id is None:
            raise ParserSetupError("the tokenizer has no [TOOL_CALLS] token")
        self._engine: EngineToolParser | None = None
        if ARGS in vocab:
            # v11+: vLLM parses with its declarative engine instead.
            self._engine = MistralEngineToolParser(tokenizer, tools, chat_template_kwargs)
        # pre-v11 streaming state
        self._started = False
        self._json = _JsonEvents()
        self._state = _WAIT_TOOL_START
        self._bare = False  # top level is one object, not an array
        self._new_tool = False
        self._name: str | None = None  # closed name not yet streamed
        self._string_args: str | None = None  # string-valued arguments not yet streamed
        self._tool_id = -1
        self._pending_id: str | None = None

    # -- one-shot ------------------------------------------------------

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        if self._engine is not None:
            self._engine.skip_reasoning_parsing = self.skip_reasoning_parsing
            return self._engine.extract_tool_calls(text, request)
        if request.tool_choice == "none" and request.tools:
            return ExtractedCalls(False, [], text)
        content: str | None = None
        if TOOL_CALLS in text:
            # Repeated markers with nothing between them count as one; text
            # after a later marker is trailing output.
            content, *segments = text.split(TOOL_CALLS)
            payload = next((seg.strip() for seg in segments if seg.strip()), "")
        elif _forced(request):
            payload = text.strip()  # constrained bare array, no marker
        else:
            return ExtractedCalls(False, [], text)
        parsed: Any
        try:
            parsed, _ = json.JSONDecoder().raw_decode(payload)
        except ValueError:
            found = find_array(payload)
            try:
                parsed = json.loads(found[0]) if found else None
            except ValueError:
                parsed = None
        calls = _function_calls(parsed)
        if not calls:
            return ExtractedCalls(False, [], payload)
        out = [ToolCallOut(id=mistral_tool_call_id(), name=name, arguments=args) for name, args in calls]
        return ExtractedCalls(True, out, content if content and content.strip() else None)

    # -- streaming -----------------------------------------------------

    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        if self._engine is not None:
            self._engine.skip_reasoning_parsing = self.skip_reasoning_parsing
            return self._engine.stream(delta_text, delta_ids, request)
        has_marker = self._bot_id in delta_ids or TOOL_CALLS in delta_text
        if has_marker or (not self._started and delta_text and _forced(request)):
            self._started = True
        if not self._started:
            return DeltaOut(content=delta_text)
        try:
            return self._stream_calls(delta_text, has_marker)
        except (_JsonSyntaxError, IndexError):
            # vLLM logs and drops the record; its JSON coroutine stays broken.
            return None

    def finish_stream(self) -> DeltaOut | None:
        return self._engine.finish_stream() if self._engine is not None else None

    def _on_event(self, prefix: str, event: str, value: Any) -> None:
        if prefix == "" and event == "start_map":
            self._bare = True
        if self._bare:
            prefix = f"item.{prefix}" if prefix else "item"
        if prefix == "item":
            if event == "start_map":
                self._state = _WAIT_TOOL_KEY
                self._new_tool = True
            elif event == "map_key" and value == "name":
                self._state = _PARSING_NAME
            elif event == "map_key" and value == "arguments":
                self._state = _WAIT_ARGS_START
            elif event == "end_map":
                self._state = _ALL_DONE if self._bare else _TOOL_DONE
        elif prefix == "item.name" and event == "string":
            self._name = value
            self._state = _NAME_DONE
        elif prefix == "item.arguments":
            if event == "start_map":
                self._state = _PARSING_ARGS
            elif event == "end_map":
                self._state = _ARGS_DONE
            elif event == "string":
                self._string_args = value
        elif prefix == "" and event == "end_array":
            self._state = _ALL_DONE

    def _stream_calls(self, text: str, has_marker: bool) -> DeltaOut | None:
        content: str | None = None
        deltas: list[ToolCallDeltaOut] = []
        call = ToolCallDeltaOut(index=self._tool_id, type="function")
        touched = False
        if has_marker:
            parts = text.split(TOOL_CALLS)
            if not text.startswith(TOOL_CALLS):
                content = parts[0]
            text = "".join(parts[1:])
        while text:
            before = self._state
            piece = ""
            if self._state == _ALL_DONE:
                content, text = text, ""
            else:
                piece, text = _split(text, _STOPS[self._state])
                for event in self._json.feed(piece):
                    self._on_event(*event)
            if self._new_tool:
                self._new_tool = False
                if touched:
                    self._close_delta(call, deltas)
                touched = False
                self._tool_id += 1
                self._pending_id = mistral_tool_call_id()
                call = ToolCallDeltaOut(index=self._tool_id, type="function")
            function = call.function
            if function is None:
                function = call.function = FunctionDeltaOut()
            if self._name is not None:
                touched = True
                function.name, self._name = self._name, None
            if self._string_args is not None:
                touched = True
                function.arguments, self._string_args = self._string_args, None
            if self._state == _NAME_DONE:
                self._state = _WAIT_TOOL_KEY
            if self._state in (_PARSING_ARGS, _ARGS_DONE):
                if self._state == _ARGS_DONE:
                    self._state = _WAIT_TOOL_KEY
                touched = True
                function.arguments = (function.arguments or "") + piece
                if before != _PARSING_ARGS:
                    function.arguments = function.arguments.lstrip()
        if touched:
            self._close_delta(call, deltas)
        if content or deltas:
            return DeltaOut(content=content or None, tool_calls=deltas)
        return DeltaOut() if self._state == _ALL_DONE else None

    def _close_delta(self, call: ToolCallDeltaOut, deltas: list[ToolCallDeltaOut]) -> None:
        if self._pending_id is not None:
            call.id, self._pending_id = self._pending_id, None
        deltas.append(call)
