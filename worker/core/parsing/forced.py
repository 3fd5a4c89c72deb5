"""vLLM's JSON handling of ``required`` and named ``tool_choice``.

Only for tool parsers with ``supports_required_and_named`` (no structural
tag): the model then writes the forced JSON format instead of its native one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from worker.core.parsing.deltas import args_delta, name_delta
from worker.core.parsing.types import DeltaOut, ToolCallDeltaOut


def parse_required_array(content: str) -> list[tuple[str, str]] | None:
    """``[{"name", "parameters"}...]`` → (name, JSON arguments); None if invalid.

    Mirrors pydantic's ``list[FunctionDefinition]`` validation: names must be
    strings, ``parameters`` an object or null/absent, ``description`` a string
    or null.
    """
    try:
        data: Any = json.loads(content)
    except ValueError:
        return None
    if not isinstance(data, list):
        return None
    calls: list[tuple[str, str]] = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        params = item.get("parameters")
        if params is not None and not isinstance(params, dict):
            return None
        description = item.get("description")
        if description is not None and not isinstance(description, str):
            return None
        calls.append((item["name"], json.dumps(params, ensure_ascii=False)))
    return calls


def named_stream_delta(delta_text: str, function_name: str, name_sent: bool) -> tuple[DeltaOut, bool]:
    """Forced named call: the whole output is the arguments of one call."""
    call = args_delta(0, delta_text) if name_sent else name_delta(0, function_name, delta_text)
    return DeltaOut(tool_calls=[call]), True


@dataclass
class _Span:
    name: str | None = None
    name_end: int | None = None
    args_start: int | None = None
    args_end: int | None = None

    @property
    def ready(self) -> bool:
        return self.name is not None and self.args_start is not None

    def ready_at(self, length: int) -> bool:
        return (
            self.ready
            and self.name_end is not None
            and self.name_end <= length
            and self.args_start is not None
            and self.args_start < length
        )


_KEY, _COLON, _VALUE, _STR, _CONTAINER, _SCALAR, _AFTER = range(7)


def _scan_required(text: str) -> list[_Span]:
    """Element spans of a (partial) ``[{"name":..., "parameters":...}]`` array."""
    spans: list[_Span] = []
    depth = 0
    in_str = escaped = False
    str_start = value_start = 0
    cur: _Span | None = None
    expect = _KEY
    key: str | None = None

    def end_value(pos: int) -> None:
        nonlocal expect
        assert cur is not None
        if key == "parameters":
            cur.args_end = pos
        elif key == "name" and expect == _STR:
            try:
                cur.name = json.loads(text[value_start:pos])
                cur.name_end = pos
            except ValueError:
                cur.name = None
        expect = _AFTER

    def start_value(pos: int, kind: int) -> None:
        nonlocal expect, value_start
        assert cur is not None
        value_start = pos
        if key == "parameters":
            cur.args_start = pos
        expect = kind

    for i, ch in enumerate(text):
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
                if depth == 2 and cur is not None:
                    if expect == _KEY:
                        key = text[str_start + 1 : i]
                        expect = _COLON
                    elif expect == _STR:
                        end_value(i + 1)
            continue
        if ch == '"':
            in_str = True
            str_start = i
            if depth == 2 and cur is not None and expect == _VALUE:
                start_value(i, _STR)
            continue
        if ch in "{[":
            if depth == 0 and ch != "[":
                return spans
            if depth == 1:
                if ch != "{":
                    return spans
                cur = _Span()
                spans.append(cur)
                expect, key = _KEY, None
            elif depth == 2 and cur is not None and expect == _VALUE:
                start_value(i, _CONTAINER)
            depth += 1
            continue
        if ch in "}]":
            if depth == 2 and cur is not None and expect == _SCALAR:
                end_value(i)
            depth -= 1
            if depth == 2 and cur is not None and expect == _CONTAINER:
                end_value(i + 1)
            elif depth == 1:
                cur = None
            elif depth <= 0:
                return spans
            continue
        if depth != 2 or cur is None:
            continue
        if ch == ":":
            if expect == _COLON:
                expect = _VALUE
        elif ch == ",":
            if expect == _SCALAR:
                end_value(i)
            expect, key = _KEY, None
        elif ch.isspace():
            if expect == _SCALAR:
                end_value(i)
        elif expect == _VALUE:
            start_value(i, _SCALAR)
    return spans


def required_stream_delta(previous_text: str, current_text: str) -> tuple[DeltaOut | None, bool]:
    """Stream the calls of a ``required`` array; returns (delta, any call announced).

    Rescans the accumulated text (vLLM's approach); only used by parsers
    without a structural tag, never by the bundled ones.
    """
    if not current_text:
        return None, False
    spans = _scan_required(current_text)
    sent = len(previous_text)
    calls: list[ToolCallDeltaOut] = []
    for index, span in enumerate(spans):
        if not span.ready:
            break
        assert span.args_start is not None
        end = span.args_end if span.args_end is not None else len(current_text)
        if span.ready_at(sent):
            new = current_text[min(end, sent) : end]
            if new:
                calls.append(args_delta(index, new))
            continue
        calls.append(name_delta(index, span.name, current_text[span.args_start : end]))
    announced = any(span.ready for span in spans)
    return (DeltaOut(tool_calls=calls) if calls else None), announced
