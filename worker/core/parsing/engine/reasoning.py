"""The reasoning adapter over the parser engine (vLLM's ``ParserEngineReasoningAdapter``).

vLLM 0.33.0 routes ``qwen3``, ``glm45`` and ``mistral`` reasoning to adapters
over its parser engine, run on the family's config with tool parsing switched
off: a marker that starts a call ends reasoning (where the config says so) and
stays as content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from worker.core.parsing.base import ReasoningParser
from worker.core.parsing.engine.config import EngineConfig, Event, State
from worker.core.parsing.engine.family import EngineFamily
from worker.core.parsing.engine.machine import EngineEvent, EventMachine
from worker.core.parsing.engine.shaping import ContentHold, hold_trailing_reasoning_ws
from worker.core.parsing.types import DeltaOut, ParserTokenizer


class EngineReasoningParser(ReasoningParser):
    """The reasoning adapter; a family's subclass names its :class:`EngineFamily` in ``family``."""

    engine_based = True
    family: ClassVar[type[EngineFamily]] = EngineFamily

    def __init__(self, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> None:
        super().__init__(tokenizer, chat_template_kwargs)
        self.config = self.make_config(tokenizer, chat_template_kwargs)
        vocab = tokenizer.get_vocab()
        self._machine = EventMachine(self.config, tokenizer)
        self._machine.skip_tools = True
        self._start_id = self._marker_id(vocab, "THINK_START")
        self._end_id = self._marker_id(vocab, "THINK_END")
        self._end_ids = self._resolve_end_ids(vocab)
        self._boundary_ids = frozenset(
            i for t in self.config.turn_boundaries if (i := vocab.get(t)) is not None
        )
        self._prompt_closes = False
        self._started = False
        self._reset()

    # -- configuration -------------------------------------------------

    @classmethod
    def make_config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return cls.family.config(tokenizer, chat_template_kwargs)

    def thinking_enabled(self) -> bool:
        """False when a request switch turns reasoning extraction off one-shot."""
        return self.family.reasoning_enabled(self.tokenizer, self.chat_template_kwargs, self.config)

    @property
    def opens_reasoning_in_content(self) -> bool:
        """Whether the grammar reopens reasoning at a start marker in content (glm45, not qwen3)."""
        transition = self.config.transitions.get((State.CONTENT, "THINK_START"))
        return transition is not None and transition[0] is State.REASONING

    def _marker_id(self, vocab: dict[str, int], name: str) -> int | None:
        config = self.config
        return vocab.get(config.terminals[name]) if name in config.id_terminals else None

    def _resolve_end_ids(self, vocab: dict[str, int]) -> frozenset[int]:
        ids: set[int] = set()
        for name in self.config.end_markers:
            token_id = self._marker_id(vocab, name)
            if token_id is not None:
                ids.add(token_id)
            elif self.config.transitions.get((State.REASONING, name)) == _CLOSE:
                # An end marker without a token cannot be seen in ids at all.
                return frozenset()
        return frozenset(ids)

    # -- state ---------------------------------------------------------

    def _reset(self) -> None:
        self._machine.reset(State.CONTENT if self._prompt_closes else self.config.initial)
        self.ended = not self.config.has_reasoning or self._prompt_closes
        self._content = ContentHold()
        self._deferred_reasoning = ""

    def set_prompt_token_ids(self, prompt_token_ids: Sequence[int]) -> None:
        # Only configs with turn boundaries can tell this turn's closed block
        # from an earlier turn's.
        self._prompt_closes = (
            self.config.initial is State.REASONING
            and bool(self._boundary_ids)
            and self.is_reasoning_end(prompt_token_ids)
        )

    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        # Does a start marker at the initial state (re)open reasoning?
        initial = self.config.initial
        transition = self.config.transitions.get((initial, "THINK_START"))
        start_opens = transition is not None and transition[0] is State.REASONING
        for token_id in reversed(token_ids):
            if token_id in self._end_ids:
                return True
            if token_id == self._start_id:
                if start_opens:
                    return False
                break
            if token_id in self._boundary_ids:
                break
        return not self.config.wait_for_reasoning

    def content_ids(self, delta_ids: list[int]) -> list[int]:
        if not self.config.wait_for_reasoning:
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

    # -- output shaping ------------------------------------------------

    def _to_delta(self, events: list[EngineEvent], finished: bool = False) -> DeltaOut | None:
        if not events and not self._content.held:
            return None
        carried = self._content.held
        content: list[str] = []
        reasoning: list[str] = []
        for kind, text, _ in events:
            if kind is Event.TEXT:
                content.append(text)
            elif kind is Event.REASONING:
                reasoning.append(text)
            elif kind is Event.REASONING_END:
                self.ended = True
        content_text = self._content.take(content, carried, release=True, finished=finished)
        reasoning_text = "".join(reasoning)
        if content_text or reasoning_text:
            return DeltaOut(reasoning=reasoning_text or None, content=content_text or None)
        return None

    def _strip_trailing(self, delta: DeltaOut | None) -> DeltaOut | None:
        if not self.config.strip_trailing_reasoning_ws:
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
        events = self._machine.feed(text, [])
        events.extend(self._machine.finish())
        reasoning = "".join(t for k, t, _ in events if k is Event.REASONING)
        content = "".join(t for k, t, _ in events if k is Event.TEXT)
        if self.config.strip_trailing_reasoning_ws:
            reasoning = reasoning.rstrip()
        return reasoning or None, content or None

    def stream(self, delta_text: str, delta_ids: Sequence[int]) -> DeltaOut | None:
        if not self._started:
            self._started = True
            self._reset()
        return self._strip_trailing(self._to_delta(self._machine.feed(delta_text, delta_ids)))

    def ended_in_stream(self, delta_ids: Sequence[int]) -> bool:
        return self.ended

    def finish_stream(self) -> DeltaOut | None:
        events = self._machine.finish()
        if events or self._content.held:
            return self._to_delta(events, finished=True)
        return None


#: The transition that closes reasoning and drops its marker.
_CLOSE = (State.CONTENT, (Event.REASONING_END,))
