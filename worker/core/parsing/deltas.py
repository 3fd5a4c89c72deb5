"""Tool-call delta construction shared by the tool parsers (vLLM's ``DeltaToolCall`` shapes)."""

from __future__ import annotations

from worker.core.parsing.ids import random_tool_call_id
from worker.core.parsing.types import FunctionDeltaOut, ToolCallDeltaOut


def name_delta(
    index: int, name: str | None, arguments: str | None = None, *, call_id: str | None = None
) -> ToolCallDeltaOut:
    """A call's first delta: id (a fresh random one unless given), type and name.

    ``arguments`` None and ``""`` differ on the wire; both are kept as given.
    """
    return ToolCallDeltaOut(
        index=index,
        id=random_tool_call_id() if call_id is None else call_id,
        type="function",
        function=FunctionDeltaOut(name=name, arguments=arguments),
    )


def args_delta(index: int, arguments: str) -> ToolCallDeltaOut:
    """A later delta of a call: argument text only."""
    return ToolCallDeltaOut(index=index, function=FunctionDeltaOut(arguments=arguments))


def coalesce(deltas: list[ToolCallDeltaOut]) -> list[ToolCallDeltaOut]:
    """One entry per call index, in first-appearance order, as vLLM merges a record's deltas.

    The first delta of an index absorbs the later ones (in place): missing
    id/type/name filled in, argument text appended. The input list comes back
    unchanged when no index repeats.
    """
    merged: dict[int, ToolCallDeltaOut] = {}
    for delta in deltas:
        first = merged.get(delta.index)
        if first is None:
            merged[delta.index] = delta
            continue
        if delta.id is not None and first.id is None:
            first.id = delta.id
        if delta.type is not None and first.type is None:
            first.type = delta.type
        if delta.function is None:
            continue
        if first.function is None:
            first.function = delta.function
            continue
        if delta.function.name is not None and first.function.name is None:
            first.function.name = delta.function.name
        if delta.function.arguments is not None:
            first.function.arguments = (first.function.arguments or "") + delta.function.arguments
    return deltas if len(merged) == len(deltas) else list(merged.values())
