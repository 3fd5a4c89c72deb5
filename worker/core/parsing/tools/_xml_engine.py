"""The tool side of vLLM's declarative "parser engine", for XML-ish tool formats.

vLLM 0.33.0 serves ``qwen3_coder``/``qwen3_xml`` and ``glm45``/``glm47`` with
adapters over its parser engine: a token-id scanner (single-token markers
are cut by id while streaming), an incremental marker lexer (text that may
still grow into a marker is held back), a transition table, and a layer that
turns the resulting events into tool-call deltas. This module reproduces that
pipeline for tool parsing; a format module only supplies a
:class:`ToolGrammar` (markers, transitions, argument converter).

Streaming keeps the engine alive across records, so each record costs its
own length: the current call's arguments are scanned once and their JSON is
kept per argument (``_xml_args``), where vLLM rebuilds it from the whole
argument text whenever a record is not a plain continuation of an open value.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from worker.core.parsing.base import ToolParser
from worker.core.parsing.deltas import args_delta, coalesce, name_delta
from worker.core.parsing.engine import ContentHold, hold_trailing_reasoning_ws, reasoning_only_markers
from worker.core.parsing.ids import random_tool_call_id
from worker.core.parsing.lexer import MarkerLexer
from worker.core.parsing.scanner import DROP, engine_id_markers
from worker.core.parsing.tools._schema import (
    find_tool_properties,
    fix_arg_types,
    has_tool,
    streamable_string_keys,
)
from worker.core.parsing.tools._xml_args import NAME_IN_ARGS_RE, ArgScanner, ArgsStream, ScannerFactory
from worker.core.parsing.tools._xml_args import WS as WS  # the patterns' whitespace, for the formats
from worker.core.parsing.types import (
    DeltaOut,
    ExtractedCalls,
    ParseRequest,
    ParserTokenizer,
    ToolCallDeltaOut,
    ToolCallOut,
)
from worker.core.parsing.util import NameProbe


class St(Enum):
    CONTENT = "content"
    REASONING = "reasoning"
    TOOL_PREAMBLE = "tool_preamble"
    TOOL_NAME = "tool_name"
    TOOL_ARGS = "tool_args"
    TOOL_BETWEEN = "tool_between"


TOOL_STATES = frozenset({St.TOOL_PREAMBLE, St.TOOL_NAME, St.TOOL_ARGS, St.TOOL_BETWEEN})
_PLAIN_STATES = frozenset({St.CONTENT, St.REASONING})


class Ev(Enum):
    TEXT = "text"
    REASONING_START = "reasoning_start"
    REASONING = "reasoning"
    REASONING_END = "reasoning_end"
    CALL_START = "call_start"
    NAME = "name"
    ARG = "arg"
    CALL_END = "call_end"


_REASONING_MARKER_EVENTS = frozenset({Ev.REASONING_START, Ev.REASONING_END})
#: What plain text becomes in each state (states missing here swallow it).
_TEXT_EVENT = {St.CONTENT: Ev.TEXT, St.REASONING: Ev.REASONING, St.TOOL_NAME: Ev.NAME, St.TOOL_ARGS: Ev.ARG}

#: (kind, value, tool index)
Event = tuple[Ev, str, int]
#: Maps a raw argument delta to the JSON text it appends to the open value, or
#: None once the delta may change anything else.
Extender = Callable[[str], "str | None"]
Transition = tuple[St, tuple[Ev, ...]]


@dataclass(frozen=True)
class ToolGrammar:
    """One parser-engine configuration, as far as tool parsing sees it."""

    terminals: dict[str, str]
    #: terminals matched by token id while streaming (their spelled text is text then)
    id_terminals: tuple[str, ...]
    transitions: dict[tuple[St, str], Transition]
    initial: St
    #: raw argument text → JSON object text (``partial``: the text may still grow)
    convert_args: Callable[[str, bool], str]
    value_extender: Callable[[str], Extender | None]
    validate_tool_names: bool = False
    strip_trailing_reasoning_ws: bool = True
    #: GLM strips whitespace around the function name it streams
    strip_names: bool = False
    #: the streaming argument scanner (same results as ``convert_args``, one pass); None
    #: rebuilds the JSON from the whole argument text per record, vLLM's way (the tests' reference)
    arg_scanner: ScannerFactory | None = None
    #: ``convert_args`` drops one leading and one trailing newline of each value
    trim_values: bool = False
    reasoning_markup: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        markup = reasoning_only_markers(
            self.transitions, St.REASONING, _PLAIN_STATES, TOOL_STATES, _REASONING_MARKER_EVENTS
        )
        object.__setattr__(self, "reasoning_markup", markup)

    @property
    def has_reasoning(self) -> bool:
        return (
            "THINK_END" in self.id_terminals
            or "THINK_START" in self.terminals
            or "THINK_END" in self.terminals
            or self.initial is St.REASONING
        )


# -- token-id scanner -------------------------------------------------------


@dataclass(slots=True)
class _Text:
    text: str
    count: int = 0  # token ids behind the text (a bare count still emits an empty event)


@dataclass(slots=True)
class _Mark:
    name: str
    text: str


_Item = _Text | _Mark


class _IdSplitter:
    """Cuts a record's text at marker tokens found by id (vLLM's ``TokenIDScanner``).

    A marker whose text has not reached the record text yet waits, and so
    does the text after it, until the marker text shows up. Kept apart from
    ``scanner.IdScanner`` on purpose: it counts the ids behind each text run
    (ids with no text yet still make an empty event, which can announce a call).
    """

    def __init__(self, tokenizer: ParserTokenizer, id_map: dict[int, str]) -> None:
        self._tokenizer = tokenizer
        self._id_map = id_map
        self._texts: dict[int, str] = {}
        self.reset()

    def reset(self) -> None:
        self.deferred: list[_Mark] = []
        self._deferred_counts: list[int] = []
        self._trailing = 0
        self._post_text = ""

    def _text_of(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text

    def scan(self, text: str, ids: Sequence[int]) -> list[_Item]:
        prefix: list[_Item] = []
        trailing = 0
        if self.deferred:
            prefix, text, trailing = self._resolve(text, len(ids))
        id_map = self._id_map
        if not id_map or not any(i in id_map for i in ids):
            if text:
                prefix.append(_Text(text, (trailing if prefix else 0) + len(ids)))
            return prefix
        results: list[_Item] = []
        run: list[str] = []
        for token_id in ids:
            name = id_map.get(token_id)
            piece = self._text_of(token_id)
            if name is None:
                run.append(piece)
                continue
            if run and (joined := "".join(run)):
                results.append(_Text(joined, len(run)))
            run = []
            results.append(_Mark(name, piece))
        if run and (joined := "".join(run)):
            results.append(_Text(joined, len(run)))
        if trailing:
            results.insert(0, _Text("", trailing))
        if text:
            return prefix + self._align(text, results)
        # No text to check the per-token decoding against: markers wait.
        count = 0
        for item in results:
            if isinstance(item, _Text):
                count += item.count
            else:
                self.deferred.append(item)
                self._deferred_counts.append(count)
                count = 0
        self._trailing += count
        return prefix

    def flush(self) -> list[_Item]:
        if not self.deferred and not self._post_text:
            return []
        out: list[_Item] = []
        if self._post_text:
            out.append(_Text(self._post_text, self._deferred_counts[0] if self._deferred_counts else 0))
            self._post_text = ""
        out.extend(self.deferred)
        if self._trailing:
            out.append(_Text("", self._trailing))
        self.deferred, self._deferred_counts, self._trailing = [], [], 0
        return out

    def _resolve(self, text: str, id_count: int) -> tuple[list[_Item], str, int]:
        waiting, counts, trailing = self.deferred, self._deferred_counts, self._trailing
        self.deferred, self._deferred_counts, self._trailing = [], [], 0
        out: list[_Item] = []
        rest = self._post_text + text
        self._post_text = ""
        for mark, count in zip(waiting, counts, strict=True):
            pos = rest.find(mark.text)
            if pos >= 0:
                if pos:
                    out.append(_Text(rest[:pos], count))
                out.append(mark)
                rest = rest[pos + len(mark.text) :]
            else:
                if rest:
                    self._post_text += rest
                    count += id_count
                    rest = ""
                self.deferred.append(mark)
                self._deferred_counts.append(count)
        if self.deferred:
            self._trailing = trailing
            trailing = 0
        return out, rest, trailing

    def _align(self, text: str, results: list[_Item]) -> list[_Item]:
        if not results:
            return [_Text(text)]
        joined = "".join(item.text for item in results)
        if not joined:
            return [_Text(text), *results]
        pos = text.find(joined)
        if pos > 0:
            return [_Text(text[:pos]), *results]
        if pos == 0:
            return results
        return self._rebuild(text, results)

    def _rebuild(self, text: str, results: list[_Item]) -> list[_Item]:
        """Per-token decoding differs from the record text: cut at the markers' rightmost spots."""
        marks = [item for item in results if isinstance(item, _Mark)]
        if not marks:
            return [_Text(text)]
        counts = [0] * (len(marks) + 1)
        group = 0
        for item in results:
            if isinstance(item, _Mark):
                group += 1
            else:
                counts[group] += item.count
        positions = [-1] * len(marks)
        end = len(text)
        for k in range(len(marks) - 1, -1, -1):
            pos = text.rfind(marks[k].text, 0, end)
            if pos >= 0:
                positions[k] = pos
                end = pos
        out: list[_Item] = []
        used = 0
        for k, mark in enumerate(marks):
            pos = positions[k]
            if pos >= used:
                if pos > used:
                    out.append(_Text(text[used:pos], counts[k]))
                out.append(mark)
                used = pos + len(mark.text)
                continue
            later = any(p >= 0 for p in positions[k + 1 :])
            if not later and used < len(text) and mark.name != DROP:
                self._post_text += text[used:]
                used = len(text)
            self.deferred.append(mark)
            self._deferred_counts.append(counts[k])
        if used < len(text):
            out.append(_Text(text[used:], counts[-1]))
        return out


# -- state machine ----------------------------------------------------------


class _Machine:
    """Scanner + lexer + transition table → events."""

    def __init__(self, grammar: ToolGrammar, tokenizer: ParserTokenizer) -> None:
        self.g = grammar
        # Special tokens the grammar does not name vanish (by id and by text).
        id_map, drops = engine_id_markers(tokenizer, grammar.terminals, grammar.id_terminals)
        self._id_names = frozenset(id_map.values())
        self._scanner = _IdSplitter(tokenizer, id_map)
        self._lexer = MarkerLexer([*grammar.terminals.items(), *drops])
        self.skip_reasoning = False
        self.reset(grammar.initial)

    def reset(self, state: St) -> None:
        self.state = state
        self.tool_index = -1
        self._had_ids = False
        self._scanner.reset()
        self._lexer.reset()

    def feed(self, text: str, ids: Sequence[int]) -> list[Event]:
        if ids:
            self._had_ids = True
        out: list[Event] = []
        if text and not self._lexer.buffer and not self._scanner.deferred and not ids:
            self._lexed(self._lexer.feed(text), out)
            return out
        for item in self._scanner.scan(text, ids):
            self._item(item, out)
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        for item in self._scanner.flush():
            self._item(item, out)
        self._lexed(self._lexer.flush(), out)
        if self.state in TOOL_STATES:
            if self.tool_index >= 0:
                out.append((Ev.CALL_END, "", self.tool_index))
            self.state = St.CONTENT
        elif self.state is St.REASONING:
            out.append((Ev.REASONING_END, "", self.tool_index))
            self.state = St.CONTENT
        return out

    def _item(self, item: _Item, out: list[Event]) -> None:
        if isinstance(item, _Mark):
            self._lexed(self._lexer.flush(), out)
            self._terminal(item.name, item.text, out)
        elif item.text:
            self._lexed(self._lexer.feed(item.text), out)
        elif item.count:
            self._emit("", out)

    def _lexed(self, pieces: list[tuple[str | None, str]], out: list[Event]) -> None:
        strict = self._had_ids
        for name, text in pieces:
            # Once ids flow, markers matched by id are text when merely spelled.
            if name is None or (strict and name in self._id_names):
                if text:
                    self._emit(text, out)
            else:
                self._terminal(name, text, out)

    def _emit(self, text: str, out: list[Event]) -> None:
        kind = _TEXT_EVENT.get(self.state)
        if kind is not None:
            out.append((kind, text, self.tool_index))

    def _terminal(self, name: str, text: str, out: list[Event]) -> None:
        transition = self.g.transitions.get((self.state, name))
        if transition is None:
            if name != DROP:
                self._emit(text, out)
            return
        if self.skip_reasoning and name in self.g.reasoning_markup:
            self._emit(text, out)
            return
        self.state, events = transition
        for kind in events:
            if kind is Ev.CALL_START:
                self.tool_index += 1
            if kind is Ev.TEXT and not text:
                continue
            out.append((kind, text, self.tool_index))


# -- events → deltas --------------------------------------------------------


# Not _tool_engine.Slot: these calls stream converted JSON (safe prefix, extender), not raw text.
class _Slot:
    __slots__ = (
        "arg_events",
        "arg_parts",
        "args_stream",
        "extend",
        "id",
        "name",
        "name_probe",
        "name_sent",
        "scanner",
        "streamed",
        "string_keys",
        "value_streams",
    )

    def __init__(self, scanner: ArgScanner | None) -> None:
        self.id = ""
        self.name = ""
        self.arg_parts: list[str] = []
        self.name_sent = False
        self.string_keys: set[str] | None = None
        self.streamed = ""
        self.extend: Extender | None = None
        self.value_streams = False
        self.name_probe = NameProbe(NAME_IN_ARGS_RE)
        self.scanner = scanner
        self.arg_events: list[tuple[str, ...]] = []
        self.args_stream: ArgsStream | None = None

    @property
    def args(self) -> str:
        return "".join(self.arg_parts)


def safe_arg_prefix(text: str, string_keys: set[str] | None) -> tuple[str, bool]:
    """The JSON prefix that cannot change any more, and whether it ends inside an open string.

    Everything up to the last top-level value is stable; that value itself is
    left out unless it is a string of a key that stays a string, whose
    unterminated text may stream.
    """
    last_colon = -1
    last_key: str | None = None
    pending: str | None = None
    in_string = escape = False
    start = -1
    depth = 0
    for i, ch in enumerate(text):
        if escape:
            escape = False
            continue
        if in_string:
            if ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
                if depth == 1 and start >= 0:
                    pending = text[start + 1 : i]
            continue
        if ch == '"':
            in_string = True
            start = i
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == ":" and depth == 1:
            last_colon = i
            last_key = pending
            pending = None
    if last_colon < 0:
        return "", False
    end = last_colon + 1
    while end < len(text) and text[end] in " \t\n\r":
        end += 1
    if end >= len(text) or text[end] != '"':
        return text[:end], False
    if string_keys is not None and last_key not in string_keys:
        return text[:end], False
    escape = False
    for i in range(end + 1, len(text)):
        ch = text[i]
        if escape:
            escape = False
        elif ch == "\\":
            escape = True
        elif ch == '"':
            return text[:i], True
    return text, True


class EngineToolParser(ToolParser):
    """Base of the parser-engine tool adapters; subclasses provide :meth:`make_grammar`."""

    engine_based = True
    # vLLM's classes have a structural tag (strict tool calling by default):
    # ``required`` and named choices are parsed natively, like ``auto``.
    supports_required_and_named = False

    def __init__(
        self,
        tokenizer: ParserTokenizer,
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any],
    ) -> None:
        super().__init__(tokenizer, tools, chat_template_kwargs)
        self.g = self.make_grammar(tokenizer, chat_template_kwargs)
        self._machine = _Machine(self.g, tokenizer)
        self._suppress = False
        self._streaming = False
        self._reset()

    @classmethod
    def make_grammar(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> ToolGrammar:
        raise NotImplementedError

    def _reset(self, state: St | None = None) -> None:
        self._machine.reset(state if state is not None else self.g.initial)
        self._slots: list[_Slot] = []
        self._content = ContentHold()
        self._deferred_reasoning = ""
        self._reasoning_ended = not self.g.has_reasoning

    def _see_request(self, request: ParseRequest) -> None:
        if request.tools:
            self.tools = request.tools
        # tool_choice "none" with tools: tool markup is parsed, then dropped.
        if not self._suppress and request.tool_choice == "none" and request.tools:
            self._suppress = True

    # -- ToolParser ------------------------------------------------------

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        self._see_request(request)
        self._reset(St.CONTENT)
        self._machine.skip_reasoning = self.skip_reasoning_parsing
        events = self._machine.feed(text, [])
        events.extend(self._machine.finish())
        delta = self._to_delta(events, finished=True)
        calls = self._collect_calls()
        content = delta.content if delta else None
        if content and calls:
            content = content.strip()
        return ExtractedCalls(bool(calls), calls, content or None)

    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        if not self._streaming:
            self._streaming = True
            self._reset(St.CONTENT)
        self._see_request(request)
        self._machine.skip_reasoning = self.skip_reasoning_parsing
        return self._hold_reasoning_ws(self._to_delta(self._machine.feed(delta_text, delta_ids)))

    def finish_stream(self) -> DeltaOut | None:
        events = self._machine.finish()
        if events or self._content.held:
            return self._to_delta(events, finished=True)
        return None

    # -- events → delta ----------------------------------------------------

    # Mirrors _tool_engine's _to_delta except that the end of reasoning is tracked here.
    def _to_delta(self, events: list[Event], finished: bool = False) -> DeltaOut | None:
        if not events and not self._content.held:
            return None
        calls: list[ToolCallDeltaOut] = []
        content_parts: list[str] = []
        reasoning_parts: list[str] = []
        carried = self._content.held
        seen_tool = False
        live = not self._suppress
        for kind, value, index in events:
            if kind is Ev.TEXT:
                # Text after tool markup in the same record waits for the next one.
                if seen_tool:
                    self._content.held += value
                else:
                    content_parts.append(value)
            elif kind is Ev.REASONING:
                reasoning_parts.append(value)
            elif kind is Ev.REASONING_END:
                self._reasoning_ended = True
            elif kind is Ev.REASONING_START or not live:
                continue
            elif kind is Ev.CALL_START:
                seen_tool = True
                while len(self._slots) <= index:
                    factory = self.g.arg_scanner if self._streaming else None
                    self._slots.append(_Slot(factory() if factory is not None else None))
            elif kind is Ev.NAME:
                seen_tool = True
                self._slots[index].name += value
            elif kind is Ev.ARG:
                seen_tool = True
                self._on_arg(index, value, calls)
            else:
                seen_tool = True
                self._on_call_end(index, calls)
        if len(calls) > 1:
            calls = coalesce(calls)
        # Whitespace-only content next to tool calls is always dropped here.
        content = self._content.take(
            content_parts,
            carried,
            release=not seen_tool or not calls,
            calls_exist=bool(self._slots),
            finished=finished,
        )
        reasoning = "".join(reasoning_parts)
        if content or calls or reasoning:
            return DeltaOut(reasoning=reasoning or None, content=content or None, tool_calls=calls)
        return None

    def _hold_reasoning_ws(self, delta: DeltaOut | None) -> DeltaOut | None:
        if not self.g.strip_trailing_reasoning_ws:
            return delta
        delta, self._deferred_reasoning = hold_trailing_reasoning_ws(
            delta, self._deferred_reasoning, reasoning_ended=self._reasoning_ended
        )
        return delta

    # -- tool calls --------------------------------------------------------

    def _accept(self, name: str) -> bool:
        if not name:
            return False
        return not self.g.validate_tool_names or not self.tools or has_tool(self.tools, name)

    def _ensure_id(self, slot: _Slot) -> None:
        if not slot.id:
            slot.id = random_tool_call_id()

    def _name_from_args(self, slot: _Slot) -> str | None:
        return slot.name_probe.name

    def _send_name(self, index: int, name: str | None, calls: list[ToolCallDeltaOut]) -> None:
        if name is not None and self.g.strip_names:
            name = name.strip()
        if name is None or not self._accept(name):
            return
        slot = self._slots[index]
        slot.name = name
        slot.name_sent = True
        slot.string_keys = streamable_string_keys(find_tool_properties(self.tools, name))
        self._ensure_id(slot)
        calls.append(name_delta(index, name, call_id=slot.id))

    def _on_arg(self, index: int, value: str, calls: list[ToolCallDeltaOut]) -> None:
        slot = self._slots[index]
        if value:
            slot.name_probe.feed(value)
            if slot.scanner is None:
                slot.arg_parts.append(value)
            elif slot.args_stream is None:
                slot.arg_events += slot.scanner.feed(value)
            else:
                slot.value_streams = slot.args_stream.apply(slot.scanner.feed(value))
        if not slot.name_sent:
            # The first argument event (even an empty one) sends the name.
            if slot.name:
                self._send_name(index, slot.name, calls)
            elif value:
                self._send_name(index, self._name_from_args(slot), calls)
        elif value:
            diff = self._arg_delta(slot, value)
            if diff:
                calls.append(args_delta(index, diff))

    def _on_call_end(self, index: int, calls: list[ToolCallDeltaOut]) -> None:
        if index >= len(self._slots):
            return
        slot = self._slots[index]
        if self.g.strip_names:
            slot.name = slot.name.strip()
        remaining = self._final_args_diff(slot)
        if not slot.name_sent:
            name = slot.name or self._name_from_args(slot) or ""
            if self._accept(name):
                slot.name = name
                slot.name_sent = True
                slot.string_keys = streamable_string_keys(find_tool_properties(self.tools, name))
                self._ensure_id(slot)
                calls.append(name_delta(index, name, remaining or "", call_id=slot.id))
                remaining = None
        if remaining and slot.name_sent:
            calls.append(args_delta(index, remaining))

    def _args_stream(self, slot: _Slot) -> ArgsStream:
        """The slot's incremental arguments JSON, typed by the tool the call names."""
        if slot.args_stream is None:
            properties = find_tool_properties(self.tools, slot.name) if slot.name else {}
            slot.args_stream = ArgsStream(properties, slot.string_keys, trim_newlines=self.g.trim_values)
            slot.args_stream.apply(slot.arg_events)
            slot.arg_events = []
            slot.value_streams = False
        return slot.args_stream

    def _arg_delta(self, slot: _Slot, raw_delta: str) -> str | None:
        if slot.scanner is not None:
            stream = self._args_stream(slot)
            # value_streams holds whether this record's events only lengthened the open value.
            return stream.diff(grew_only=slot.value_streams)
        if not self._streaming:
            return None  # one-shot reads the finished calls, never these diffs
        if slot.extend is not None:
            # Fast path: the delta only lengthens the open trailing value.
            diff = slot.extend(raw_delta)
            if diff is not None:
                if not diff or not slot.value_streams:
                    return None
                slot.streamed += diff
                return diff
            slot.extend = None
        try:
            current = self.g.convert_args(slot.args, True)
        except (ValueError, TypeError):
            return None
        if not current:
            return None
        if slot.name:
            current = fix_arg_types(current, self.tools, slot.name)
        previous = slot.streamed
        safe, value_streams = safe_arg_prefix(current, slot.string_keys)
        if not safe or (previous and not safe.startswith(previous)):
            return None
        slot.streamed = safe
        slot.extend = self.g.value_extender(slot.args)
        slot.value_streams = value_streams
        return safe[len(previous) :] or None

    def _final_args_diff(self, slot: _Slot) -> str | None:
        if slot.scanner is not None:
            return self._args_stream(slot).final_diff()
        if not self._streaming:
            return None
        try:
            final = self.g.convert_args(slot.args, False)
        except (ValueError, TypeError):
            return None
        if final:
            final = fix_arg_types(final, self.tools, slot.name)
        previous = slot.streamed
        if final and len(final) > len(previous):
            if previous and not final.startswith(previous):
                return None
            slot.streamed = final
            return final[len(previous) :]
        return None

    def _collect_calls(self) -> list[ToolCallOut]:
        """The one-shot calls: every slot with a usable name."""
        calls: list[ToolCallOut] = []
        for slot in self._slots:
            if not slot.name and not slot.args:
                continue
            name = slot.name.strip()
            raw = slot.args
            if not name and raw.strip():
                name, args = _name_and_args_from_json(raw)
            elif raw.strip():
                try:
                    args = self.g.convert_args(raw, False)
                except (ValueError, TypeError):
                    args = _name_and_args_from_json(raw)[1]
            else:
                args = "{}"
            if self._accept(name):
                self._ensure_id(slot)
                calls.append(
                    ToolCallOut(id=slot.id, name=name, arguments=fix_arg_types(args, self.tools, name))
                )
        return calls


# Like _tool_engine.EngineToolParser._name_and_args but a non-string name counts as none here.
def _name_and_args_from_json(raw: str) -> tuple[str, str]:
    """A JSON-object body (``{"name": ..., "arguments": ...}``) when markup is missing."""
    raw = raw.strip()
    try:
        parsed = json.loads(raw)
    except ValueError:
        return "", raw
    if not isinstance(parsed, dict):
        return "", raw
    name = parsed.get("name", "")
    # A non-string name would fail vLLM's response model; treat it as none.
    name = name if isinstance(name, str) else ""
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return name, json.dumps({k: v for k, v in parsed.items() if k != "name"}, ensure_ascii=False)
