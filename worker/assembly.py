"""Fold output envelopes back into whole OpenAI responses, the way a streaming client does.

Used by ``replay --assemble``, ``consume --assemble``, the demo and the tests (streamed == one-shot).
A request that came in on another API (Messages, Responses, Batch) is named by the ``origin`` its
first output carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JsonDict = dict[str, Any]


def origin_name(origin: Any) -> str | None:
    """How a report names an envelope's ``origin``: ``messages msg_...``, ``responses resp_...``,
    ``batch batch_... line 3``; ``None`` without one (a chat or completions request, an older record)."""
    if not isinstance(origin, dict) or not isinstance(origin.get("api"), str):
        return None
    name = f"{origin['api']} {origin.get('id')}"
    return f"{name} line {origin['line']}" if isinstance(origin.get("line"), int) else name


@dataclass
class AssembledChoice:
    index: int
    content: str = ""
    reasoning: str = ""
    tool_calls: dict[int, JsonDict] = field(default_factory=dict)
    finish_reason: str | None = None

    def add_tool_call_delta(self, delta: JsonDict) -> None:
        call = self.tool_calls.setdefault(
            delta["index"], {"id": None, "type": "function", "function": {"name": None, "arguments": ""}}
        )
        if delta.get("id"):
            call["id"] = delta["id"]
        function = delta.get("function") or {}
        if function.get("name"):
            call["function"]["name"] = function["name"]
        if function.get("arguments"):
            call["function"]["arguments"] += function["arguments"]


@dataclass
class AssembledResponse:
    request_id: str
    endpoint: str
    choices: dict[int, AssembledChoice] = field(default_factory=dict)
    usage: JsonDict | None = None
    error: JsonDict | None = None
    chunks: int = 0
    origin: JsonDict | None = None  # the API it came in on, from the first record that names it

    def choice(self, index: int) -> AssembledChoice:
        return self.choices.setdefault(index, AssembledChoice(index))


class Assembler:
    """Accumulates output envelopes per request."""

    def __init__(self) -> None:
        self.responses: dict[str, AssembledResponse] = {}

    def add(self, envelope: JsonDict) -> AssembledResponse:
        rid = envelope["request_id"]
        response = self.responses.setdefault(rid, AssembledResponse(rid, envelope["endpoint"]))
        response.chunks += 1
        if response.origin is None and isinstance(envelope.get("origin"), dict):
            response.origin = envelope["origin"]
        if envelope.get("error") is not None:
            response.error = envelope["error"]
            return response
        body = envelope["body"]
        if "chunk" in body:
            self._add_chunk(response, body["chunk"])
        else:
            self._add_full(response, body)
        return response

    def _add_chunk(self, response: AssembledResponse, chunk: JsonDict) -> None:
        if chunk.get("usage"):
            response.usage = chunk["usage"]
        for item in chunk["choices"]:
            choice = response.choice(item["index"])
            if "delta" in item:
                delta = item["delta"]
                choice.content += delta.get("content") or ""
                choice.reasoning += delta.get("reasoning") or ""
                for call in delta.get("tool_calls") or ():
                    choice.add_tool_call_delta(call)
            else:
                choice.content += item.get("text") or ""
            if item.get("finish_reason") is not None:
                choice.finish_reason = item["finish_reason"]

    def _add_full(self, response: AssembledResponse, body: JsonDict) -> None:
        response.usage = body.get("usage")
        for item in body["choices"]:
            choice = response.choice(item["index"])
            if "message" in item:
                message = item["message"]
                choice.content = message.get("content") or ""
                choice.reasoning = message.get("reasoning") or ""
                for position, call in enumerate(message.get("tool_calls") or ()):
                    choice.tool_calls[position] = call
            else:
                choice.content = item.get("text") or ""
            choice.finish_reason = item.get("finish_reason")


def render_text(response: AssembledResponse) -> str:
    """A short human-readable view of one assembled response."""
    named = origin_name(response.origin)
    title = response.request_id if named is None else f"{named} (request {response.request_id})"
    lines = [f"== {title} ({response.endpoint}, {response.chunks} records)"]
    if response.error is not None:
        lines.append(f"   error {response.error.get('code')}: {response.error.get('message')}")
    for index in sorted(response.choices):
        choice = response.choices[index]
        prefix = f"   [{index}] " if len(response.choices) > 1 else "   "
        if choice.reasoning:
            lines.append(f"{prefix}reasoning: {choice.reasoning!r}")
        if choice.content:
            lines.append(f"{prefix}content:   {choice.content!r}")
        for call in choice.tool_calls.values():
            function = call["function"]
            lines.append(f"{prefix}tool call: {function['name']}({function['arguments']})")
        lines.append(f"{prefix}finish_reason: {choice.finish_reason}")
    if response.usage:
        lines.append(
            f"   usage: prompt={response.usage['prompt_tokens']} "
            f"completion={response.usage['completion_tokens']}"
        )
    return "\n".join(lines)
