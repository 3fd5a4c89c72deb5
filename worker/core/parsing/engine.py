"""Reasoning parsers that follow vLLM's declarative "parser engine".

vLLM 0.33.0 routes ``qwen3``, ``glm45`` and ``mistral`` reasoning to adapters
over its parser engine, run with tool parsing switched off. What is visible
from that combination is captured here by a small grammar: which markers
exist, what each does in the REASONING and CONTENT states, and the engine's
output shaping (whitespace-only content deferred until something else shows,
optional deferral of trailing reasoning whitespace).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

from worker.core.parsing.base import ReasoningParser
from worker.core.parsing.lexer import Piece
from worker.core.parsing.scanner import DROP, MarkerSplitter
from worker.core.parsing.types import DeltaOut, ParserTokenizer


class State(Enum):
    REASONING = "reasoning"
    CONTENT = "content"


class Action(Enum):
    CONSUME = "consume"  # marker vanishes, state unchanged
    OPEN = "open"  # marker vanishes, reasoning (re)opens
    CLOSE = "close"  # marker vanishes, reasoning ends
    CLOSE_KEEP = "close_keep"  # reasoning ends, marker text becomes content (tool start)
    TEXT = "text"  # marker text stays in the current channel


@dataclass(frozen=True)
class Grammar:
    """One engine configuration, seen with tool parsing off."""

    #: marker name → literal; every literal holds text back while partial.
    markers: dict[str, str]
    #: markers matched by token id when ids are present (text spelling them is text).
    id_markers: tuple[str, ...]
    #: (state, marker name) → action; missing entries keep the text.
    actions: dict[tuple[State, str], Action]
    initial: State
    #: when False a prompt without any reasoning marker counts as closed.
    wait_for_reasoning: bool
    #: names whose marker *ends* reasoning (token ids feed ``is_reasoning_end``).
    end_markers: tuple[str, ...] = ()
    turn_boundaries: frozenset[str] = field(default_factory=frozenset)
    strip_trailing_reasoning_ws: bool = True

    @property
    def has_reasoning(self) -> bool:
        return (
            "THINK_END" in self.id_markers
            or "THINK_START" in self.markers
            or "THINK_END" in self.markers
            or self.initial is State.REASONING
        )


S = TypeVar("S")
E = TypeVar("E")


def reasoning_only_markers(
    transitions: Mapping[tuple[S, str], tuple[S, tuple[E, ...]]],
    reasoning: S,
    plain_states: frozenset[S],
    tool_states: frozenset[S],
    marker_events: frozenset[E],
) -> frozenset[str]:
    """Tool grammars: the markers that only open/close reasoning (text when no reasoning parser runs).

    A marker qualifies when it leads into or out of ``reasoning`` (not into
    a tool state); the set is empty when any of them also does anything
    else: a transition outside ``plain_states`` or events beyond ``marker_events``.
    """
    items = transitions.items()
    markers = frozenset(
        marker for (state, marker), (nxt, _) in items if reasoning in (state, nxt) and nxt not in tool_states
    )
    for (state, marker), (nxt, events) in items:
        if marker in markers and (
            state not in plain_states or nxt not in plain_states or not marker_events.issuperset(events)
        ):
            return frozenset()
    return markers


class ContentHold:
    """The parser engine's content shaping, shared by the reasoning and the tool adapters.

    ``held`` is content not sent yet: text that followed a tool event in its
    record (the tool adapters add it themselves) and, until non-whitespace
    content has been sent, whitespace-only content, which waits for what
    follows (or is dropped once tool calls exist, where the grammar says so).
    """

    __slots__ = ("held", "seen_text")

    def __init__(self) -> None:
        self.held = ""
        self.seen_text = False  # non-whitespace content sent

    def take(
        self,
        parts: list[str],
        carried: str,
        *,
        release: bool,
        calls_exist: bool = False,
        drop_ws_with_calls: bool = True,
        finished: bool,
    ) -> str:
        """This record's content from its text ``parts``.

        ``carried`` is what was held when the record began; with ``release``
        held text goes out now: the carried part first, text held during
        this record last.
        """
        if self.held and release:
            fresh = self.held[len(carried) :]
            if carried:
                parts.insert(0, carried)
            if fresh:
                parts.append(fresh)
            self.held = ""
        text = "".join(parts)
        if not self.seen_text and text:
            if text.strip():
                self.seen_text = True
            elif calls_exist:
                if drop_ws_with_calls:
                    text = ""
            elif not finished:
                self.held = text
                text = ""
        return text


def hold_trailing_reasoning_ws(
    delta: DeltaOut | None, held: str, *, reasoning_ended: bool
) -> tuple[DeltaOut | None, str]:
    """The parser engine's output shaping: trailing reasoning whitespace waits for more reasoning.

    ``held`` is the whitespace held so far; returns the delta to send (None
    when nothing is left of it) and the whitespace now held. Held whitespace
    is dropped by a delta without reasoning once ``reasoning_ended``.
    """
    if delta is not None and delta.reasoning is not None:
        combined = held + delta.reasoning
        trimmed = combined.rstrip()
        held = combined[len(trimmed) :]
        delta.reasoning = trimmed or None
        if delta.reasoning is None and delta.content is None and not delta.tool_calls:
            return None, held
    elif held and reasoning_ended:
        held = ""
    return delta, held


class EngineReasoningParser(ReasoningParser):
    """Shared implementation; subclasses pick a :class:`Grammar` in :meth:`grammar`."""

    engine_based = True

    def __init__(self, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> None:
        super().__init__(tokenizer, chat_template_kwargs)
        self.g = self.grammar(tokenizer, chat_template_kwargs)
        vocab = tokenizer.get_vocab()
        # Special tokens outside the grammar are dropped by the engine.
        self._splitter = MarkerSplitter(tokenizer, self.g.markers, self.g.id_markers)
        self._start_id = self._marker_id(vocab, "THINK_START")
        self._end_id = self._marker_id(vocab, "THINK_END")
        self._end_ids = self._resolve_end_ids(vocab)
        self._boundary_ids = frozenset(i for t in self.g.turn_boundaries if (i := vocab.get(t)) is not None)
        self._prompt_closes = False
        self._started = False
        self._reset()

    # -- configuration -------------------------------------------------

    @classmethod
    def grammar(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> Grammar:
        raise NotImplementedError

    def thinking_enabled(self) -> bool:
        """False when a request switch turns reasoning extraction off one-shot."""
        return True

    def _marker_id(self, vocab: dict[str, int], name: str) -> int | None:
        return vocab.get(self.g.markers[name]) if name in self.g.id_markers else None

    def _resolve_end_ids(self, vocab: dict[str, int]) -> frozenset[int]:
        ids: set[int] = set()
        for name in self.g.end_markers:
            token_id = vocab.get(self.g.markers[name]) if name in self.g.id_markers else None
            if token_id is not None:
                ids.add(token_id)
            elif self.g.actions.get((State.REASONING, name)) is Action.CLOSE:
                # An end marker without a token cannot be seen in ids at all.
                return frozenset()
        return frozenset(ids)

    # -- state ---------------------------------------------------------

    def _reset(self) -> None:
        self.state = State.CONTENT if self._prompt_closes else self.g.initial
        self.ended = not self.g.has_reasoning or self._prompt_closes
        self._splitter.reset()
        self._content = ContentHold()
        self._deferred_reasoning = ""

    def set_prompt_token_ids(self, prompt_token_ids: Sequence[int]) -> None:
        # Only grammars with turn boundaries can tell this turn's closed block
        # from an earlier turn's.
        self._prompt_closes = (
            self.g.initial is State.REASONING
            and bool(self._boundary_ids)
            and self.is_reasoning_end(prompt_token_ids)
        )

    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        # Does a start marker at the initial state (re)open reasoning?
        action = self.g.actions.get((self.g.initial, "THINK_START"))
        initial_r = self.g.initial is State.REASONING
        start_opens = action is Action.OPEN or (action is Action.CONSUME and initial_r)
        for token_id in reversed(token_ids):
            if token_id in self._end_ids:
                return True
            if token_id == self._start_id:
                if start_opens:
                    return False
                break
            if token_id in self._boundary_ids:
                break
        return not self.g.wait_for_reasoning

    def content_ids(self, delta_ids: list[int]) -> list[int]:
        if not self.g.wait_for_reasoning:
            return delta_ids
        if self._end_id is not None:
            for i in range(len(delta_ids) - 1, -1, -1):
                if delta_ids[i] == self._end_id:
                    return delta_ids[i + 1 :]
        if self._end_ids:
            start = 0
            for i in range(len(delta_ids) - 1, -1, -1):
                if delta_ids[i] in self._boundary_ids:
                    start = i + 1
                    break
            for i in range(start, len(delta_ids)):
                if delta_ids[i] in self._end_ids:
                    return delta_ids[i:]
        return delta_ids

    # -- feeding -------------------------------------------------------

    def _feed(self, text: str, ids: Sequence[int]) -> list[tuple[str, str]]:
        """Events: ("reasoning"|"content", text) and ("end", "")."""
        events: list[tuple[str, str]] = []
        self._pieces(self._splitter.feed(text, ids), events)
        return events

    def _finish(self) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        self._pieces(self._splitter.finish(), events)
        if self.state is State.REASONING:
            events.append(("end", ""))
            self.state = State.CONTENT
        return events

    def _pieces(self, pieces: list[Piece], events: list[tuple[str, str]]) -> None:
        for name, text in pieces:
            if name is None:
                events.append((self.state.value, text))
            else:
                self._marker(name, text, events)

    def _marker(self, name: str, text: str, events: list[tuple[str, str]]) -> None:
        action = self.g.actions.get((self.state, name))
        if action is None:
            if name != DROP:
                events.append((self.state.value, text))
        elif action is Action.CONSUME:
            pass
        elif action is Action.OPEN:
            self.state = State.REASONING
        elif action is Action.CLOSE:
            self.state = State.CONTENT
            events.append(("end", ""))
        elif action is Action.CLOSE_KEEP:
            self.state = State.CONTENT
            events.append(("end", ""))
            events.append(("content", text))
        else:
            events.append((self.state.value, text))

    # -- output shaping ------------------------------------------------

    def _to_delta(self, events: list[tuple[str, str]], finished: bool = False) -> DeltaOut | None:
        if not events and not self._content.held:
            return None
        carried = self._content.held
        content: list[str] = []
        reasoning: list[str] = []
        for kind, text in events:
            if kind == "content":
                content.append(text)
            elif kind == "reasoning":
                reasoning.append(text)
            else:
                self.ended = True
        content_text = self._content.take(content, carried, release=True, finished=finished)
        reasoning_text = "".join(reasoning)
        if content_text or reasoning_text:
            return DeltaOut(reasoning=reasoning_text or None, content=content_text or None)
        return None

    def _strip_trailing(self, delta: DeltaOut | None) -> DeltaOut | None:
        if not self.g.strip_trailing_reasoning_ws:
            return delta
        delta, self._deferred_reasoning = hold_trailing_reasoning_ws(
            delta, self._deferred_reasoning, reasoning_ended=self.ended
        )
        return delta

    # -- ReasoningParser -----------------------------------------------

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        if not self.thinking_enabled():
            return None, text
        self._reset()
        events = self._feed(text, [])
        events.extend(self._finish())
        reasoning = "".join(t for k, t in events if k == "reasoning")
        content = "".join(t for k, t in events if k == "content")
        if self.g.strip_trailing_reasoning_ws:
            reasoning = reasoning.rstrip()
        return reasoning or None, content or None

    def stream(self, delta_text: str, delta_ids: Sequence[int]) -> DeltaOut | None:
        if not self._started:
            self._started = True
            self._reset()
        return self._strip_trailing(self._to_delta(self._feed(delta_text, delta_ids)))

    def ended_in_stream(self, delta_ids: Sequence[int]) -> bool:
        return self.ended

    def finish_stream(self) -> DeltaOut | None:
        events = self._finish()
        if events or self._content.held:
            return self._to_delta(events, finished=True)
        return None
