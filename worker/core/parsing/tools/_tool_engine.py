"""The parser engine for tool formats, as vLLM's tool adapters drive its ``ParserEngine``.

Used by ``kimi_k2`` and by ``mistral``'s v11+ path. It always starts in
CONTENT; markers are matched by token id when the record has ids (text
spelling them stays text), other special tokens are dropped, partial markers
are held back, JSON arguments stream raw with a top-level closing brace held
until the next character; names are announced with the first argument text,
text after a tool event in the same record is deferred, whitespace-only
content is deferred (or dropped once a call exists). One-shot arguments are
coerced to the tool schema's types and re-serialized; streamed arguments are
not (vLLM disagrees with itself there, and so do we).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.core.parsing.base import ToolParser
from worker.core.parsing.deltas import args_delta, coalesce, name_delta
from worker.core.parsing.engine import ContentHold, hold_trailing_reasoning_ws, reasoning_only_markers
from worker.core.parsing.ids import kimi_tool_call_id, random_tool_call_id
from worker.core.parsing.lexer import Piece
from worker.core.parsing.scanner import DROP, MarkerSplitter
from worker.core.parsing.tools._schema import fix_arg_types
from worker.core.parsing.types import (
    DeltaOut,
    ExtractedCalls,
    ParseRequest,
    ParserTokenizer,
    ToolCallDeltaOut,
    ToolCallOut,
)
from worker.core.parsing.util import NameProbe

# -- engine states and events ------------------------------------------------

CONTENT, REASONING, PREAMBLE, NAME, ARGS, BETWEEN = (
    "content",
    "reasoning",
    "preamble",
    "name",
    "args",
    "between",
)
_TOOL_STATES = frozenset({PREAMBLE, NAME, ARGS, BETWEEN})
_PLAIN_STATES = frozenset({CONTENT, REASONING})
# event kinds
TEXT, THINK, THINK_END, CALL_START, CALL_NAME, ARG, CALL_END = (
    "text",
    "reasoning",
    "reasoning_end",
    "call_start",
    "call_name",
    "arg",
    "call_end",
)
_STATE_EVENT = {CONTENT: TEXT, REASONING: THINK, NAME: CALL_NAME}

Event = tuple[str, str, int]  # (kind, value, tool index)


@dataclass(frozen=True)
class ToolGrammar:
    """One parser-engine configuration (vLLM ``ParserEngineConfig``), tool side."""

    markers: dict[str, str]
    #: markers also recognised by token id
    id_markers: frozenset[str]
    #: (state, marker) → (next state, event kinds)
    transitions: dict[tuple[str, str], tuple[str, tuple[str, ...]]]
    strip_content_ws_with_tools: bool = True
    drop_ws_only_content_before_tools: bool = True


class _ToolEngine:
    """vLLM's ``StreamingParserEngine`` for the shapes the tool grammars here use."""

    def __init__(self, tokenizer: ParserTokenizer, grammar: ToolGrammar, initial: str) -> None:
        self.g = grammar
        self._splitter = MarkerSplitter(tokenizer, grammar.markers, grammar.id_markers)
        # Only markers purely about reasoning pass through as text without a reasoning parser.
        self._reasoning_markup = reasoning_only_markers(
            grammar.transitions, REASONING, _PLAIN_STATES, _TOOL_STATES, frozenset({THINK_END})
        )
        self.skip_reasoning_parsing = False
        self.reset(initial)

    def reset(self, state: str) -> None:
        self.state = state
        self.tool_index = -1
        self._splitter.reset()
        self._args = ""  # argument text not released yet
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, text: str, ids: Sequence[int]) -> list[Event]:
        events: list[Event] = []
        self._pieces(self._splitter.feed(text, ids), events)
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        self._pieces(self._splitter.finish(), events)
        if self._args:
            events.append((ARG, self._args, self.tool_index))
            self._args = ""
        if self.state in _TOOL_STATES:
            if self.tool_index >= 0:
                events.append((CALL_END, "", self.tool_index))
            self.state = CONTENT
        elif self.state == REASONING:
            events.append((THINK_END, "", self.tool_index))
            self.state = CONTENT
        return events

    def _pieces(self, pieces: list[Piece], events: list[Event]) -> None:
        for name, text in pieces:
            if name is None:
                self._emit(text, events)
            else:
                self._terminal(name, text, events)

    def _terminal(self, name: str, text: str, events: list[Event]) -> None:
        transition = self.g.transitions.get((self.state, name))
        if transition is None:
            if not (self._splitter.has_drops and name == DROP):
                self._emit(text, events)
            return
        if self.skip_reasoning_parsing and name in self._reasoning_markup:
            self._emit(text, events)
            return
        nxt, kinds = transition
        if self.state == ARGS and nxt != ARGS and self._args:
            events.append((ARG, self._args, self.tool_index))
            self._args = ""
        self.state = nxt
        for kind in kinds:
            if kind == CALL_START:
                self.tool_index += 1
            events.append((kind, text, self.tool_index))
        if nxt == ARGS:
            self._depth = 0
            self._in_string = False
            self._escape = False

    def _emit(self, text: str, events: list[Event]) -> None:
        if self.state == ARGS:
            self._feed_args(text, events)
            return
        kind = _STATE_EVENT.get(self.state)
        if kind is not None:
            events.append((kind, text, self.tool_index))

    def _feed_args(self, text: str, events: list[Event]) -> None:
        # Every character is released at once, except a closing brace that may
        # end the top-level value: it waits for the next character (or the end).
        for ch in text:
            self._args += ch
            if self._escape:
                self._escape = False
            elif self._in_string:
                if ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                if self._depth > 0:
                    self._depth -= 1
                if self._depth == 0:
                    continue
            events.append((ARG, self._args, self.tool_index))
            self._args = ""


# -- the engine-backed tool parser --------------------------------------------


class Slot:
    __slots__ = ("_parts", "id", "name", "name_probe", "name_sent")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self._parts: list[str] = []  # argument text; joined only when read
        self.name_sent = False
        self.name_probe = NameProbe(_NAME_IN_ARGS)

    @property
    def args(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def add_args(self, text: str) -> None:
        self._parts.append(text)
        self.name_probe.feed(text)


_NAME_IN_ARGS = re.compile(r'"name"\s*:\s*"([^"]*)"')
_KIMI_MODEL_TYPES = frozenset({"kimi_k2", "kimi_k25", "kimi_k3"})


class EngineToolParser(ToolParser):
    """vLLM's ``ParserEngineToolAdapter`` over a ``ParserEngine`` (tool side)."""

    engine_based = True

    def __init__(
        self,
        tokenizer: ParserTokenizer,
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any],
    ) -> None:
        super().__init__(tokenizer, tools, chat_template_kwargs)
        grammar, initial = self.grammar(tokenizer, chat_template_kwargs)
        self._engine = _ToolEngine(tokenizer, grammar, initial)
        self._kimi_ids = tokenizer.model_type in _KIMI_MODEL_TYPES
        self._id_count = 0  # generated Kimi-style ids, counted by this engine from 0
        self._tools = tools
        self._slots: list[Slot] = []
        self._content = ContentHold()
        self._deferred_reasoning = ""
        self._suppress = False
        self._streaming = False

    @classmethod
    def grammar(
        cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]
    ) -> tuple[ToolGrammar, str]:
        """The engine grammar and the engine's initial state."""
        raise NotImplementedError

    # -- request handling ------------------------------------------------

    def _prepare(self, request: ParseRequest) -> None:
        self._engine.skip_reasoning_parsing = self.skip_reasoning_parsing
        if request.tools:
            self._tools = request.tools
        if request.tool_choice == "none" and request.tools:
            self._suppress = True

    def _reset(self) -> None:
        self._engine.reset(CONTENT)
        self._slots.clear()
        self._content = ContentHold()
        self._deferred_reasoning = ""

    # -- one-shot ------------------------------------------------------

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        self._prepare(request)
        self._reset()
        events = self._engine.feed(text, [])
        events.extend(self._engine.finish())
        delta = self._to_delta(events, finished=True)
        calls = self._collect_calls()
        content = delta.content if delta else None
        if content:
            content = self._content_with_tools(content, bool(calls))
        return ExtractedCalls(bool(calls), calls, content)

    def _content_with_tools(self, content: str, tools_called: bool) -> str | None:
        if tools_called:
            if self._engine.g.strip_content_ws_with_tools:
                content = content.strip()
            elif self._engine.g.drop_ws_only_content_before_tools and not content.strip():
                content = ""
        return content or None

    def _collect_calls(self) -> list[ToolCallOut]:
        calls: list[ToolCallOut] = []
        for slot in self._slots:
            if not slot.name and not slot.args:
                continue
            name = slot.name.strip()
            body = slot.args
            if not name and body.strip():
                name, args = self._name_and_args(body)
            elif body.strip():
                args = self._args_json(body)
            else:
                args = "{}"
            if self._accept_name(name):
                self._ensure_id(slot, name)
                calls.append(
                    ToolCallOut(id=slot.id, name=name, arguments=fix_arg_types(args, self._tools, name))
                )
        return calls

    # -- hooks (vLLM's overridable ParserEngine methods) ----------------------

    def _name_and_args(self, body: str) -> tuple[str, str]:
        """A body without a separate name: a ``{"name", "arguments"}`` envelope."""
        body = body.strip()
        try:
            parsed = json.loads(body)
        except ValueError:
            return "", body
        if not isinstance(parsed, dict):
            return "", body
        name = parsed.get("name", "")
        for key in ("arguments", "parameters"):
            if key in parsed:
                value = parsed[key]
                return name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        rest = {k: v for k, v in parsed.items() if k != "name"}
        return name, json.dumps(rest, ensure_ascii=False)

    def _args_json(self, body: str) -> str:
        if not body.strip():
            return "{}"
        return self._name_and_args(body)[1]

    def _accept_name(self, name: str) -> bool:
        return bool(name)

    def _name_from_args(self, slot: Slot) -> str | None:
        # Searched as the text arrives: a nameless call would otherwise rescan all of it per record.
        return slot.name_probe.name

    def _ensure_id(self, slot: Slot, name: str) -> None:
        if not slot.id:
            if self._kimi_ids:
                slot.id = kimi_tool_call_id(name, self._id_count)
                self._id_count += 1
            else:
                slot.id = random_tool_call_id()

    def _announce(self, idx: int, deltas: list[ToolCallDeltaOut], name: str | None) -> None:
        if name is None or not self._accept_name(name):
            return
        slot = self._slots[idx]
        slot.name = name
        slot.name_sent = True
        self._ensure_id(slot, name)
        deltas.append(name_delta(idx, name, call_id=slot.id))

    def _on_arg(self, idx: int, value: str, deltas: list[ToolCallDeltaOut]) -> None:
        slot = self._slots[idx]
        if value:
            slot.add_args(value)
        if not slot.name_sent:
            if slot.name:
                self._announce(idx, deltas, slot.name)
            elif value:
                self._announce(idx, deltas, self._name_from_args(slot))
            if value and slot.name_sent:
                # Kimi and Mistral re-send the chunk that announced the name.
                deltas.append(args_delta(idx, value))
        elif value:
            deltas.append(args_delta(idx, value))

    def _on_end(self, idx: int, deltas: list[ToolCallDeltaOut]) -> None:
        if idx >= len(self._slots):
            return
        slot = self._slots[idx]
        if slot.name_sent:
            return
        name = slot.name or self._name_from_args(slot) or ""
        if self._accept_name(name):
            slot.name = name
            slot.name_sent = True
            self._ensure_id(slot, name)
            deltas.append(name_delta(idx, name, "", call_id=slot.id))

    # -- streaming -----------------------------------------------------

    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        if not self._streaming:
            self._streaming = True
            self._reset()
        self._prepare(request)
        events = self._engine.feed(delta_text, delta_ids)
        return self._strip_trailing_reasoning(self._to_delta(events))

    def finish_stream(self) -> DeltaOut | None:
        events = self._engine.finish()
        if events or self._content.held:
            return self._to_delta(events, finished=True)
        return None

    def _strip_trailing_reasoning(self, delta: DeltaOut | None) -> DeltaOut | None:
        # Trailing reasoning whitespace waits until more reasoning shows. Unlike
        # _xml_engine, held whitespace is never dropped (the end of reasoning is not tracked here).
        delta, self._deferred_reasoning = hold_trailing_reasoning_ws(
            delta, self._deferred_reasoning, reasoning_ended=False
        )
        return delta

    def _to_delta(self, events: list[Event], finished: bool = False) -> DeltaOut | None:
        if not events and not self._content.held:
            return None
        deltas: list[ToolCallDeltaOut] = []
        content: list[str] = []
        reasoning: list[str] = []
        carried = self._content.held
        saw_tool = False
        for kind, value, idx in events:
            if kind == TEXT:
                if saw_tool:
                    self._content.held += value
                else:
                    content.append(value)
            elif kind == THINK:
                reasoning.append(value)
            elif kind == THINK_END or self._suppress:
                continue
            else:
                saw_tool = True
                if kind == CALL_START:
                    while len(self._slots) <= idx:
                        self._slots.append(Slot())
                elif kind == CALL_NAME:
                    self._slots[idx].name += value
                elif kind == ARG:
                    self._on_arg(idx, value, deltas)
                else:
                    self._on_end(idx, deltas)
        if len(deltas) > 1:
            deltas = coalesce(deltas)
        text = self._content.take(
            content,
            carried,
            release=not saw_tool or not deltas,
            calls_exist=bool(self._slots),
            drop_ws_with_calls=self._engine.g.drop_ws_only_content_before_tools,
            finished=finished,
        )
        thought = "".join(reasoning)
        if text or deltas or thought:
            return DeltaOut(reasoning=thought or None, content=text or None, tool_calls=deltas)
        return None
