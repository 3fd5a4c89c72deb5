"""``llama3_json`` / ``llama4_json`` as vLLM 0.34 runs them: a config of the parser engine.

vLLM 0.34.0 replaced its own Llama reader (``tools/llama3_json.py``, kept for 0.33) with
an engine family (``vllm/parser/llama_json.py``). What that changes, all of it here:

* ``<|python_tag|>`` (by token id while streaming) opens a tool region; an output whose
  first text starts with ``{`` is read as if it began with the tag (``_LlamaMachine.feed``),
  unless tool calls are suppressed (``tool_choice: "none"``).
* A tool region is a sequence of JSON objects, blanks around them, at most one ``;``
  between two of them; each object is one call. Any other character ends the region: it
  and what follows are content again.
* A call's name is sent once ``"name": "..."`` has been read; its arguments (the
  ``arguments`` or ``parameters`` member, verbatim) are sent whole when its object closes.
  There are no partial-argument deltas. A call cut by the end of the output sends the raw
  text of that member as far as it goes (``{"city": "Paris``).
* One-shot, an output that starts with the tag or ``{`` must be such a sequence (only end
  tokens may follow the last object), else it all stays content. Other outputs go through
  the engine, so JSON quoted in prose stays content.

Streaming costs O(the record): the machine reads each character once, the name search is
incremental, and a call's text is joined and converted once, when it closes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from worker.core.parsing.engine.config import EngineConfig, Event, State
from worker.core.parsing.engine.machine import EngineEvent, EventMachine
from worker.core.parsing.engine.schema import fix_arg_types
from worker.core.parsing.engine.tools import CallSlot, EngineToolParser
from worker.core.parsing.types import ExtractedCalls, ParseRequest, ParserTokenizer, ToolCallDeltaOut

TOOL_START = "<|python_tag|>"
#: Tokens that may follow the last call of a valid one-shot output (vLLM's list).
OUTPUT_END_TOKENS = ("<|eom_id|>", "<|eot_id|>", "<|end_of_text|>")
_JSON_BLANKS = " \t\r\n"
_DECODER = json.JSONDecoder()


def valid_call_sequence(text: str) -> bool | None:
    """Whether a whole output is a call sequence: None when it does not start like one.

    Blanks here are ``str.isspace`` (as vLLM's check), wider than JSON's. JSON nested past
    the decoder's limit raises ``RecursionError``.
    """
    if text.startswith(TOOL_START):
        text = text[len(TOOL_START) :]
    elif not text.startswith("{"):
        return None
    end = len(text)
    pos = 0
    found = False
    while pos < end:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos == end:
            return found
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return False
        if not isinstance(value, dict) or "name" not in value:
            return False
        if "arguments" not in value and "parameters" not in value:
            return False
        found = True
        while pos < end and text[pos].isspace():
            pos += 1
        if pos == end:
            return True
        if any(
            text.startswith(end_token, pos) and not text[pos + len(end_token) :].strip()
            for end_token in OUTPUT_END_TOKENS
        ):
            return True
        if text[pos] != ";":
            return False
        pos += 1
    return found


def _outside_strings(raw: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """``(index, char, -1)`` for each character of ``raw[start:]`` outside JSON strings, and
    ``(index, '"', opening index)`` for each string's closing quote; escapes respected."""
    in_string = False
    escape = False
    opened = -1
    for i in range(start, len(raw)):
        ch = raw[i]
        if escape:
            escape = False
        elif in_string:
            if ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
                yield i, ch, opened
        elif ch == '"':
            in_string = True
            opened = i
        else:
            yield i, ch, -1


def _object_end(raw: str, start: int) -> int | None:
    """The end of the object opening at ``raw[start]`` (strings and escapes respected), or None."""
    depth = 0
    for i, ch, _ in _outside_strings(raw, start):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def member_object(raw: str, key: str) -> str | None:
    """The verbatim text of the object-valued top-level member ``key`` of ``raw``.

    The object may be unterminated (then the rest of ``raw``); None when the member or its
    value has not started. ``ValueError`` when the value is not an object. The key is the
    last string closed at depth 1 before a ``:`` there, as vLLM's scan reads it.
    """
    depth = 0
    last: str | None = None
    for i, ch, opened in _outside_strings(raw):
        if opened >= 0:
            if depth == 1:
                last = raw[opened + 1 : i]
        elif ch == ":" and depth == 1 and last == key:
            value = i + 1
            while value < len(raw) and raw[value] in _JSON_BLANKS:
                value += 1
            if value >= len(raw):
                return None
            if raw[value] != "{":
                raise ValueError(f"member {key!r} is not an object")
            close = _object_end(raw, value)
            return raw[value:] if close is None else raw[value:close]
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return None


def call_arguments(raw: str) -> str:
    """A finished call's arguments: its ``arguments`` or else ``parameters`` object, else ``{}``."""
    args = member_object(raw, "arguments")
    if args is None:
        args = member_object(raw, "parameters")
    return "{}" if args is None else args


class _LlamaMachine(EventMachine):
    """The engine's machine with Llama's tool region: JSON objects separated by ``;``."""

    def __init__(self, config: EngineConfig, tokenizer: ParserTokenizer) -> None:
        self._start_id = tokenizer.token_to_id(TOOL_START)
        #: set by the parser: tool calls suppressed, so ``{`` at the start stays text
        self.no_start_marker = False
        super().__init__(config, tokenizer)

    def reset(self, state: State) -> None:
        super().reset(state)
        self._at_start = True
        self._reset_sequence()

    def _reset_sequence(self) -> None:
        self._in_call = False
        self._had_call = False
        self._separated = False

    def feed(self, text: str, ids: Sequence[int]) -> list[EngineEvent]:
        if text and self._at_start:
            self._at_start = False
            if not self.no_start_marker and text.startswith("{"):
                text = TOOL_START + text
                if ids:
                    ids = [] if self._start_id is None else [self._start_id, *ids]
        return super().feed(text, ids)

    def _call_open(self) -> bool:
        # A closed call has sent its end already; only one cut short needs it.
        return self._in_call and self.tool_index >= 0

    def _terminal(self, name: str, text: str, out: list[EngineEvent]) -> None:
        before = self.state
        super()._terminal(name, text, out)
        if self.state is State.TOOL_ARGS and before is not State.TOOL_ARGS:
            self._reset_sequence()

    def _emit(self, text: str, out: list[EngineEvent]) -> None:
        if self.state is not State.TOOL_ARGS:
            super()._emit(text, out)
            return
        for i, ch in enumerate(text):
            if self.state is not State.TOOL_ARGS:
                super()._emit(text[i:], out)  # the region ended: the rest is content
                return
            self._sequence_char(ch, out)

    def _sequence_char(self, ch: str, out: list[EngineEvent]) -> None:
        if self._in_call:
            self._feed_json_args(ch, out)
            if ch == "}" and not self._in_string and self._depth == 0:
                self._in_call = False
                self._had_call = True
                if self._args:
                    out.append((Event.ARG, self._args, self.tool_index))
                    self._args = ""
                out.append((Event.CALL_END, "", self.tool_index))
            return
        if ch in _JSON_BLANKS:
            return
        pending = self._had_call and not self._separated
        if ch == ";" and pending:
            self._separated = True
        elif ch == "{" and not pending:
            self.tool_index += 1
            self._args = ""
            self._depth = 0
            self._in_string = False
            self._escape = False
            self._in_call = True
            self._separated = False
            out.append((Event.CALL_START, "", self.tool_index))
            self._feed_json_args(ch, out)
        else:
            self.state = State.CONTENT
            self._reset_sequence()
            super()._emit(ch, out)


class Llama3JsonEngineParser(EngineToolParser):
    """vLLM 0.34's ``LlamaJsonEngineToolParser``; chosen by version (``ChatParsing.create``), never by
    name (the names stay with 0.33's reader, ``tools/llama3_json.py``)."""

    @classmethod
    def make_config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return EngineConfig(
            terminals={"TOOL_START": TOOL_START},
            id_terminals=("TOOL_START",),
            transitions={(State.CONTENT, "TOOL_START"): (State.TOOL_ARGS, ())},
            initial=State.CONTENT,
        )

    def setup(self) -> None:
        super().setup()
        self._machine = _LlamaMachine(self.config, self.tokenizer)
        self._reset()

    def _see_request(self, request: ParseRequest) -> None:
        super()._see_request(request)
        machine = self._machine
        if isinstance(machine, _LlamaMachine):
            machine.no_start_marker = self._suppress

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        try:
            if valid_call_sequence(text) is not False:
                return super().extract_tool_calls(text, request)
        except RecursionError:
            pass  # nested past what json reads: vLLM fails the request, 0.33's reader keeps content
        return ExtractedCalls(False, [], text or None)

    def _arg_delta(self, slot: CallSlot, raw_delta: str) -> str | None:
        return None  # arguments go whole, when the call closes

    def _final_args_diff(self, slot: CallSlot) -> str | None:
        try:
            args = call_arguments(slot.args)
        except ValueError:
            return None
        return fix_arg_types(args, self._schemas, slot.name) or None

    def _on_call_end(self, index: int, calls: list[ToolCallDeltaOut]) -> None:
        super()._on_call_end(index, calls)
        if self._streaming and index < len(self._slots):
            self._slots[index] = CallSlot(None)  # sent: its text is not read again

    def _raw_args_json(self, raw: str) -> str:
        try:
            return call_arguments(raw)
        except ValueError:
            return super()._raw_args_json(raw)
