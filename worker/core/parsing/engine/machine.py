"""The engine's state machine (vLLM's ``StreamingParserEngine``): scanner, lexer, transition table.

One record in, semantic events out: ``(event, value, tool index)``. Plain text
becomes the event its state names (content, reasoning, a call's name or
arguments; other states swallow it). Special tokens the config does not name
vanish, by id and by text. Raw JSON arguments (configs without an argument
converter) hold a closing brace that may end the top-level value until the
next character shows.
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.core.parsing.engine.config import TOOL_STATES, EngineConfig, Event, State
from worker.core.parsing.engine.lexer import MarkerLexer, Piece
from worker.core.parsing.engine.scanner import DROP, Item, Mark, TokenIdScanner, engine_id_markers
from worker.core.parsing.types import ParserTokenizer

#: (kind, value, tool index)
EngineEvent = tuple[Event, str, int]

#: What plain text becomes in each state (states missing here swallow it).
_TEXT_EVENT = {
    State.CONTENT: Event.TEXT,
    State.REASONING: Event.REASONING,
    State.TOOL_NAME: Event.NAME,
    State.TOOL_ARGS: Event.ARG,
}


class EventMachine:
    def __init__(self, config: EngineConfig, tokenizer: ParserTokenizer) -> None:
        self.config = config
        id_map, drops = engine_id_markers(tokenizer, config.terminals, config.id_terminals)
        self._id_names = frozenset(id_map.values())
        self._scanner = TokenIdScanner(tokenizer, id_map)
        variants = [(name, literal) for name, literals in config.variants.items() for literal in literals]
        self._lexer = MarkerLexer([*config.terminals.items(), *variants, *drops])
        self._json_args = config.arguments is None
        #: markers purely about reasoning are text (set when no reasoning parser runs)
        self.skip_reasoning = False
        #: tool markup is text, except that a marker ending reasoning still ends it
        #: (the reasoning adapter: vLLM runs its engine with ``skip_tool_parsing``)
        self.skip_tools = False
        self.reset(config.initial)

    def reset(self, state: State) -> None:
        self.state = state
        self.tool_index = -1
        self._had_ids = False
        self._scanner.reset()
        self._lexer.reset()
        self._args = ""  # raw JSON argument text not released yet
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, text: str, ids: Sequence[int]) -> list[EngineEvent]:
        if ids:
            self._had_ids = True
        out: list[EngineEvent] = []
        if text and not self._lexer.buffer and not self._scanner.deferred and not ids:
            self._lexed(self._lexer.feed(text), out)
            return out
        for item in self._scanner.scan(text, ids):
            self._item(item, out)
        return out

    def _call_open(self) -> bool:
        """Whether the output ended inside a call that has not sent its end (a family may know more)."""
        return self.tool_index >= 0

    def finish(self) -> list[EngineEvent]:
        out: list[EngineEvent] = []
        for item in self._scanner.flush():
            self._item(item, out)
        self._lexed(self._lexer.flush(), out)
        if self._args:
            out.append((Event.ARG, self._args, self.tool_index))
            self._args = ""
        if self.state in TOOL_STATES:
            if self._call_open():
                out.append((Event.CALL_END, "", self.tool_index))
            self.state = State.CONTENT
        elif self.state is State.REASONING:
            out.append((Event.REASONING_END, "", self.tool_index))
            self.state = State.CONTENT
        return out

    def _item(self, item: Item, out: list[EngineEvent]) -> None:
        if isinstance(item, Mark):
            self._lexed(self._lexer.flush(), out)
            self._terminal(item.name, item.text, out)
        elif item.text:
            self._lexed(self._lexer.feed(item.text), out)
        elif item.count:
            self._emit("", out)

    def _lexed(self, pieces: list[Piece], out: list[EngineEvent]) -> None:
        strict = self._had_ids
        for name, text in pieces:
            # Once ids flow, markers matched by id are text when merely spelled.
            if name is None or (strict and name in self._id_names):
                if text:
                    self._emit(text, out)
            else:
                self._terminal(name, text, out)

    def _emit(self, text: str, out: list[EngineEvent]) -> None:
        if self._json_args and self.state is State.TOOL_ARGS:
            self._feed_json_args(text, out)
            return
        kind = _TEXT_EVENT.get(self.state)
        if kind is not None:
            out.append((kind, text, self.tool_index))

    def _terminal(self, name: str, text: str, out: list[EngineEvent]) -> None:
        transition = self.config.transitions.get((self.state, name))
        if transition is None:
            if name != DROP:
                self._emit(text, out)
            return
        if self.skip_reasoning and name in self.config.reasoning_markup:
            self._emit(text, out)
            return
        nxt, events = transition
        if self.skip_tools and name in self.config.tool_terminals:
            self._tool_terminal_as_text(text, events, out)
            return
        if self._args and nxt is not State.TOOL_ARGS:
            out.append((Event.ARG, self._args, self.tool_index))
            self._args = ""
        self.state = nxt
        for kind in events:
            if kind is Event.CALL_START:
                self.tool_index += 1
            if kind is Event.TEXT and not text:
                continue
            out.append((kind, text, self.tool_index))
        if self._json_args and nxt is State.TOOL_ARGS:
            self._depth = 0
            self._in_string = False
            self._escape = False

    def _tool_terminal_as_text(self, text: str, events: tuple[Event, ...], out: list[EngineEvent]) -> None:
        """vLLM's projection with tool parsing off (``_on_terminal`` in its streaming engine).

        The machine stays in its plain state, so no tool state is ever entered;
        vLLM's extra care for an exit marker reused from a plain state is not
        needed by any family here.
        """
        if Event.REASONING_END in events:
            self.state = State.CONTENT
            out.append((Event.REASONING_END, text, self.tool_index))
            if text:
                out.append((Event.TEXT, text, self.tool_index))
        else:
            self._emit(text, out)

    def _feed_json_args(self, text: str, out: list[EngineEvent]) -> None:
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
            out.append((Event.ARG, self._args, self.tool_index))
            self._args = ""
