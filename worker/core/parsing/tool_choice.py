"""Request-level rules shared by one-shot and streaming (vLLM's message assembly)."""

from __future__ import annotations

from worker.core.parsing.ids import random_tool_call_id
from worker.core.parsing.types import DeltaOut, ParsedMessage, ParseRequest, ToolCallOut


def keeps_tool_calls(request: ParseRequest, *, auto_tools: bool) -> bool:
    """Whether a choice returns the tool calls its parser found.

    ``auto_tools``: auto tool choice is enabled and a tool parser configured.
    A ``null`` tool_choice does not keep calls; ``auto`` without tools neither.
    """
    if request.forces_tool_calls:
        return True
    if not auto_tools or request.tool_choice != "auto":
        return False
    return bool(request.tools)


def filter_parallel_calls(calls: list[ToolCallOut], request: ParseRequest) -> list[ToolCallOut]:
    """``parallel_tool_calls: false`` keeps only the first call."""
    return calls[:1] if request.parallel_tool_calls is False else calls


def filter_parallel_delta(delta: DeltaOut, request: ParseRequest) -> DeltaOut:
    """Streaming form: only index 0 survives ``parallel_tool_calls: false``."""
    if request.parallel_tool_calls is False and delta.tool_calls:
        delta.tool_calls = [call for call in delta.tool_calls if call.index == 0]
    return delta


def resolve_finish_reason(
    engine_finish_reason: str | None, request: ParseRequest | None, tool_calls_made: bool
) -> str:
    """Chat ``finish_reason``: ``tool_calls`` only for a natural stop with calls.

    A ``length`` cut stays visible, and a forced named tool reports ``stop``
    (OpenAI's behaviour).
    """
    reason = engine_finish_reason or "stop"
    named = request is not None and request.named_function is not None
    if tool_calls_made and reason == "stop" and not named:
        return "tool_calls"
    return reason


def assemble_message(
    request: ParseRequest,
    reasoning: str | None,
    content: str | None,
    calls: list[ToolCallOut] | None,
    *,
    auto_tools: bool,
) -> ParsedMessage:
    if not request.include_reasoning:
        reasoning = None
    if not keeps_tool_calls(request, auto_tools=auto_tools):
        return ParsedMessage(reasoning, content, [])
    if request.forces_tool_calls:
        content = content or ""
    out = [
        ToolCallOut(id=call.id or random_tool_call_id(), name=call.name, arguments=call.arguments)
        for call in filter_parallel_calls(calls or [], request)
    ]
    return ParsedMessage(reasoning, content, out)
