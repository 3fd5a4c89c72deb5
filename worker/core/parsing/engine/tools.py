"""The tool adapter over the parser engine (vLLM's ``ParserEngineToolAdapter``).

Events become tool-call deltas as vLLM's ``ParserEngine`` makes them: a name is
announced with the first argument event, text after a tool event in the same
record is deferred, whitespace-only content waits (or is dropped once a call
exists). Arguments go through the config's converter: raw JSON streams as
written, XML-to-JSON streams the safe prefix of the converted object, typed by
the tool schema. One-shot arguments are coerced to the schema's types; streamed
raw JSON is not (vLLM disagrees with itself there, and so do we).

Streaming keeps the engine alive across records, so each record costs its own
length; family hooks are the methods marked as such (vLLM's overridable ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any, ClassVar

from worker.core.parsing.base import ToolParser
from worker.core.parsing.deltas import args_delta, coalesce, name_delta
from worker.core.parsing.engine.arguments import (
    ArgScanner,
    ArgsStream,
    NameProbe,
    name_and_args,
)
from worker.core.parsing.engine.config import EngineConfig, Event, State
from worker.core.parsing.engine.family import EngineFamily
from worker.core.parsing.engine.machine import EngineEvent, EventMachine
from worker.core.parsing.engine.schema import ToolSchemas, fix_arg_types
from worker.core.parsing.engine.shaping import ContentHold, hold_trailing_reasoning_ws
from worker.core.parsing.ids import kimi_tool_call_id, random_tool_call_id
from worker.core.parsing.types import (
    DeltaOut,
    ExtractedCalls,
    ParseRequest,
    ParserTokenizer,
    ToolCallDeltaOut,
    ToolCallOut,
)

_KIMI_MODEL_TYPES = frozenset({"kimi_k2", "kimi_k25", "kimi_k3"})


class CallSlot:
    """One call: its name, id and the argument converter's state."""

    __slots__ = (
        "_parts",
        "arg_events",
        "args_stream",
        "id",
        "name",
        "name_probe",
        "name_sent",
        "scanner",
        "string_keys",
        "value_streams",
    )

    def __init__(self, scanner: ArgScanner | None) -> None:
        self.id = ""
        self.name = ""
        self.name_sent = False
        self.name_probe = NameProbe()
        self._parts: list[str] = []  # raw argument text (not kept by the one-pass scanner)
        self.scanner = scanner
        self.arg_events: list[tuple[str, ...]] = []
        self.args_stream: ArgsStream | None = None
        self.string_keys: set[str] | None = None
        self.value_streams = False

    @property
    def args(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def add_args(self, text: str) -> None:
        self._parts.append(text)


_JOINABLE = frozenset({Event.TEXT, Event.REASONING, Event.NAME})


def joined(events: list[EngineEvent]) -> list[EngineEvent]:
    """Each run of text, reasoning or name events of one call as one event.

    A name or held text grows by ``+=`` on an object's attribute, which copies it every time:
    a call name made of 40,000 marker pieces in one record was quadratic (0.35 s).
    """
    if len(events) < 2:
        return events
    out: list[EngineEvent] = []
    for (kind, index), run in groupby(events, key=lambda event: (event[0], event[2])):
        if kind in _JOINABLE:
            out.append((kind, "".join(value for _, value, _ in run), index))
        else:
            out.extend(run)
    return out


class EngineToolParser(ToolParser):
    """The tool adapter; a family's subclass names its :class:`EngineFamily` in ``family``."""

    engine_based = True
    family: ClassVar[type[EngineFamily]] = EngineFamily
    # vLLM's classes have a structural tag (strict tool calling by default):
    # ``required`` and named choices are parsed natively, like ``auto``.
    supports_required_and_named = False

    def setup(self) -> None:
        tokenizer = self.tokenizer
        chat_template_kwargs = self.chat_template_kwargs
        self.config = self.make_config(tokenizer, chat_template_kwargs)
        self._machine = EventMachine(self.config, tokenizer)
        self._kimi_ids = tokenizer.model_type in _KIMI_MODEL_TYPES
        self._id_count = 0  # generated Kimi-style ids, counted by this engine from 0
        self._suppress = False
        self._streaming = False
        self._schemas = ToolSchemas(self.tools)
        self._reset()

    @classmethod
    def make_config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        return cls.family.tool_config(tokenizer, chat_template_kwargs)

    def _reset(self) -> None:
        self._machine.reset(State.CONTENT)
        self._slots: list[CallSlot] = []
        self._content = ContentHold()
        self._deferred_reasoning = ""
        self._reasoning_ended = not self.config.has_reasoning

    def _see_request(self, request: ParseRequest) -> None:
        if request.tools and request.tools is not self.tools:
            self.tools = request.tools
            self._schemas = ToolSchemas(request.tools)
        # tool_choice "none" with tools: tool markup is parsed, then dropped.
        if not self._suppress and request.tool_choice == "none" and request.tools:
            self._suppress = True
        self._machine.skip_reasoning = self.skip_reasoning_parsing

    # -- ToolParser ------------------------------------------------------

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        self._see_request(request)
        self._reset()
        events = self._machine.feed(text, [])
        events.extend(self._machine.finish())
        delta = self._to_delta(events, finished=True)
        calls = self._collect_calls()
        content = delta.content if delta else None
        if content and calls:
            if self.config.strip_content_ws_with_tools:
                content = content.strip()
            elif self.config.drop_ws_only_content_before_tools and not content.strip():
                content = ""
        return ExtractedCalls(bool(calls), calls, content or None)

    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        if not self._streaming:
            self._streaming = True
            self._reset()
        self._see_request(request)
        delta = self._to_delta(self._machine.feed(delta_text, delta_ids))
        if self.config.strip_trailing_reasoning_ws:
            delta, self._deferred_reasoning = hold_trailing_reasoning_ws(
                delta, self._deferred_reasoning, reasoning_ended=self._reasoning_ended
            )
        return delta

    def finish_stream(self) -> DeltaOut | None:
        events = self._machine.finish()
        if events or self._content.held:
            return self._to_delta(events, finished=True)
        return None

    # -- events → delta ----------------------------------------------------

    def _to_delta(self, events: list[EngineEvent], finished: bool = False) -> DeltaOut | None:
        if not events and not self._content.held:
            return None
        calls: list[ToolCallDeltaOut] = []
        content_parts: list[str] = []
        reasoning_parts: list[str] = []
        carried = self._content.held
        seen_tool = False
        live = not self._suppress
        for kind, value, index in joined(events):
            if kind is Event.TEXT:
                # Text after tool markup in the same record waits for the next one.
                if seen_tool:
                    self._content.held += value
                else:
                    content_parts.append(value)
            elif kind is Event.REASONING:
                reasoning_parts.append(value)
            elif kind is Event.REASONING_END:
                self._reasoning_ended = True
            elif kind is Event.REASONING_START or not live:
                continue
            elif kind is Event.CALL_START:
                seen_tool = True
                while len(self._slots) <= index:
                    self._slots.append(self._new_slot())
            elif kind is Event.NAME:
                seen_tool = True
                self._slots[index].name += value
            elif kind is Event.ARG:
                seen_tool = True
                self._on_arg(index, value, calls)
            else:
                seen_tool = True
                self._on_call_end(index, calls)
        if len(calls) > 1:
            calls = coalesce(calls)
        content = self._content.take(
            content_parts,
            carried,
            release=not seen_tool or not calls,
            calls_exist=bool(self._slots),
            drop_ws_with_calls=self.config.drop_ws_only_content_before_tools,
            finished=finished,
        )
        reasoning = "".join(reasoning_parts)
        if content or calls or reasoning:
            return DeltaOut(reasoning=reasoning or None, content=content or None, tool_calls=calls)
        return None

    # -- family hooks (vLLM's overridable ParserEngine methods) ---------------

    def _accept(self, name: str) -> bool:
        if not name:
            return False
        return not self.config.validate_tool_names or not self.tools or self._schemas.has(name)

    def _ensure_id(self, slot: CallSlot, name: str) -> None:
        if not slot.id:
            if self._kimi_ids:
                slot.id = kimi_tool_call_id(name, self._id_count)
                self._id_count += 1
            else:
                slot.id = random_tool_call_id()

    def _name_from_args(self, slot: CallSlot) -> str | None:
        # Searched as the text arrives: a nameless call would otherwise rescan all of it per record.
        return slot.name_probe.name

    def _name_and_args(self, raw: str) -> tuple[str, str]:
        """A body without a separate name: a ``{"name", "arguments"}`` envelope."""
        return name_and_args(raw)

    def _raw_args_json(self, raw: str) -> str:
        """One-shot arguments without a converter (or where it fails)."""
        return self._name_and_args(raw)[1] if raw.strip() else "{}"

    def _convert_args(self, name: str, raw: str) -> str:
        """One-shot: a finished call's raw arguments → its arguments JSON."""
        arguments = self.config.arguments
        assert arguments is not None
        return arguments.convert(raw, False)

    def _announce(self, index: int, name: str | None, calls: list[ToolCallDeltaOut]) -> None:
        if name is not None and self.config.strip_names:
            name = name.strip()
        if name is None or not self._accept(name):
            return
        self._mark_named(self._slots[index], name)
        calls.append(name_delta(index, name, call_id=self._slots[index].id))

    def _on_call_end(self, index: int, calls: list[ToolCallDeltaOut]) -> None:
        if index >= len(self._slots):
            return
        slot = self._slots[index]
        if self.config.strip_names:
            slot.name = slot.name.strip()
        remaining = self._final_args_diff(slot)
        if not slot.name_sent:
            name = slot.name or self._name_from_args(slot) or ""
            if self._accept(name):
                self._mark_named(slot, name)
                calls.append(name_delta(index, name, remaining or "", call_id=slot.id))
                remaining = None
        if remaining and slot.name_sent:
            calls.append(args_delta(index, remaining))

    # -- tool calls --------------------------------------------------------

    def _new_slot(self) -> CallSlot:
        arguments = self.config.arguments
        if arguments is None or not self._streaming:
            return CallSlot(None)  # raw JSON, or one-shot: the finished text is converted once
        return CallSlot(arguments.scanner())

    def _mark_named(self, slot: CallSlot, name: str) -> None:
        slot.name = name
        slot.name_sent = True
        slot.string_keys = self._schemas.string_keys(name)
        self._ensure_id(slot, name)

    def _on_arg(self, index: int, value: str, calls: list[ToolCallDeltaOut]) -> None:
        slot = self._slots[index]
        if value:
            slot.name_probe.feed(value)
            if slot.scanner is None:
                slot.add_args(value)
            elif slot.args_stream is None:
                slot.arg_events += slot.scanner.feed(value)
            else:
                slot.value_streams = slot.args_stream.apply(slot.scanner.feed(value))
        if not slot.name_sent:
            # The first argument event (even an empty one) sends the name.
            if slot.name:
                self._announce(index, slot.name, calls)
            elif value:
                self._announce(index, self._name_from_args(slot), calls)
            if value and slot.name_sent and self.config.resend_announcing_chunk:
                calls.append(args_delta(index, value))
        elif value:
            diff = self._arg_delta(slot, value)
            if diff:
                calls.append(args_delta(index, diff))

    def _args_stream(self, slot: CallSlot) -> ArgsStream:
        """The slot's incremental arguments JSON, typed by the tool the call names."""
        if slot.args_stream is None:
            arguments = self.config.arguments
            trim = arguments is not None and arguments.trim_values
            properties = self._schemas.properties(slot.name) if slot.name else {}
            slot.args_stream = ArgsStream(
                properties,
                slot.string_keys,
                self._schemas.types,
                trim_newlines=trim,
                decode=arguments.decode if arguments is not None else None,
            )
            slot.args_stream.apply(slot.arg_events)
            slot.arg_events = []
            slot.value_streams = False
        return slot.args_stream

    def _arg_delta(self, slot: CallSlot, raw_delta: str) -> str | None:
        if self.config.arguments is None:
            return raw_delta
        if slot.scanner is None:
            return None  # one-shot reads the finished calls, never these diffs
        structural = self.config.arguments.structural_chars
        if structural is not None and structural.isdisjoint(raw_delta):
            return None
        # value_streams holds whether this record's events only lengthened the open value.
        return self._args_stream(slot).diff(grew_only=slot.value_streams)

    def _final_args_diff(self, slot: CallSlot) -> str | None:
        if self.config.arguments is None or slot.scanner is None:
            return None
        return self._args_stream(slot).final_diff()

    def _collect_calls(self) -> list[ToolCallOut]:
        """The one-shot calls: every slot with a usable name."""
        calls: list[ToolCallOut] = []
        arguments = self.config.arguments
        for slot in self._slots:
            if not slot.name and not slot.args:
                continue
            name = slot.name.strip()
            raw = slot.args
            if not name and raw.strip():
                name, args = self._name_and_args(raw)
            elif not raw.strip():
                args = "{}"
            elif arguments is None:
                args = self._raw_args_json(raw)
            else:
                try:
                    args = self._convert_args(name, raw)
                except (ValueError, TypeError):
                    args = self._raw_args_json(raw)
            if self._accept(name):
                self._ensure_id(slot, name)
                calls.append(
                    ToolCallOut(id=slot.id, name=name, arguments=fix_arg_types(args, self._schemas, name))
                )
        return calls
