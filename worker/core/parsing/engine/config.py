"""One parser-engine configuration per model family (vLLM's ``ParserEngineConfig``).

A family is a function returning an :class:`EngineConfig`: its terminals
(markers), which of them are matched by token id, the transition table
``(state, terminal) → (next state, events)``, how tool arguments are converted,
and the engine's output-shaping switches. The machine, the argument layer and
the adapters read nothing else; the reasoning adapter runs the same config
with tool parsing off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from worker.core.parsing.engine.arguments import XmlArguments


class State(Enum):
    CONTENT = "content"
    REASONING = "reasoning"
    TOOL_PREAMBLE = "tool_preamble"
    TOOL_NAME = "tool_name"
    TOOL_ARGS = "tool_args"
    TOOL_BETWEEN = "tool_between"


class Event(Enum):
    TEXT = "text"
    REASONING_START = "reasoning_start"
    REASONING = "reasoning"
    REASONING_END = "reasoning_end"
    CALL_START = "call_start"
    NAME = "name"
    ARG = "arg"
    CALL_END = "call_end"


TOOL_STATES = frozenset({State.TOOL_PREAMBLE, State.TOOL_NAME, State.TOOL_ARGS, State.TOOL_BETWEEN})
_PLAIN_STATES = frozenset({State.CONTENT, State.REASONING})
_REASONING_MARKER_EVENTS = frozenset({Event.REASONING_START, Event.REASONING_END})

#: (next state, events emitted, in order); an event's value is the terminal's text
Transition = tuple[State, tuple[Event, ...]]
Transitions = dict[tuple[State, str], Transition]


@dataclass(frozen=True)
class EngineConfig:
    """One family's format, for its reasoning adapter or its tool adapter."""

    #: terminal name → literal; every literal holds text back while partial
    terminals: dict[str, str]
    #: terminals matched by token id while streaming (their spelled text is text then)
    id_terminals: tuple[str, ...]
    transitions: Transitions
    initial: State
    #: reasoning: when False a prompt without any reasoning marker counts as closed
    wait_for_reasoning: bool = False
    #: reasoning: terminals whose token ids end reasoning (``is_reasoning_end``)
    end_markers: tuple[str, ...] = ()
    #: reasoning: special tokens that bound the prompt check to the last turn
    turn_boundaries: frozenset[str] = frozenset()
    #: None: arguments are raw JSON, streamed as written with a top-level closing
    #: brace held until the next character (vLLM ``tool_args_json``); else the
    #: XML-to-JSON converter
    arguments: XmlArguments | None = None
    # The three output-shaping switches below are vLLM's own config fields
    # (vllm/parser/engine/parser_engine_config.py), read by its ParserEngine
    # (vllm/parser/engine/parser_engine.py: _strip_trailing_reasoning, _events_to_delta,
    # _strip_content_whitespace) in the same way for every family.
    #: trailing reasoning whitespace waits for more reasoning (dropped once reasoning ended)
    strip_trailing_reasoning_ws: bool = True
    #: whitespace-only content is dropped once a call exists (else it waits, like any)
    drop_ws_only_content_before_tools: bool = True
    #: one-shot content is stripped when calls were found
    strip_content_ws_with_tools: bool = True
    #: calls naming no requested tool vanish
    validate_tool_names: bool = False
    #: whitespace around a streamed function name is stripped (GLM)
    strip_names: bool = False
    #: the chunk that announces a name is also sent as arguments (vLLM's Kimi and
    #: Mistral override ``_handle_arg_chunk`` so: vllm/parser/kimi_k2.py, mistral.py)
    resend_announcing_chunk: bool = False
    #: more spellings of a terminal, matched by text only (vLLM's tuple-valued terminals)
    variants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    reasoning_markup: frozenset[str] = field(init=False)
    #: terminals of any transition into or out of a tool state
    tool_terminals: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reasoning_markup", _reasoning_only_markers(self.transitions))
        tool_terminals = frozenset(
            marker
            for (state, marker), (nxt, _) in self.transitions.items()
            if state in TOOL_STATES or nxt in TOOL_STATES
        )
        object.__setattr__(self, "tool_terminals", tool_terminals)

    @property
    def has_reasoning(self) -> bool:
        return (
            "THINK_END" in self.id_terminals
            or "THINK_START" in self.terminals
            or "THINK_END" in self.terminals
            or self.initial is State.REASONING
        )


def _reasoning_only_markers(transitions: Transitions) -> frozenset[str]:
    """The markers that only open/close reasoning (text when no reasoning parser runs).

    A marker qualifies when it leads into or out of reasoning (not into a tool
    state); the set is empty when any of them also does anything else.
    """
    reasoning = State.REASONING
    items = transitions.items()
    markers = frozenset(
        marker for (state, marker), (nxt, _) in items if reasoning in (state, nxt) and nxt not in TOOL_STATES
    )
    for (state, marker), (nxt, events) in items:
        if marker in markers and (
            state not in _PLAIN_STATES
            or nxt not in _PLAIN_STATES
            or not _REASONING_MARKER_EVENTS.issuperset(events)
        ):
            return frozenset()
    return markers


def thinking_requested(chat_template_kwargs: dict[str, Any]) -> bool:
    """The ``thinking``/``enable_thinking`` switches of GLM and Kimi: on unless set, else either one."""
    thinking = chat_template_kwargs.get("thinking")
    enable = chat_template_kwargs.get("enable_thinking")
    if thinking is None and enable is None:
        return True
    return bool(thinking) or bool(enable)
