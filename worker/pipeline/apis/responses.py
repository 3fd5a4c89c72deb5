"""OpenAI Responses (``POST /v1/responses``) on the chat derender, as vLLM 0.33.0 serves it (non-Harmony).

``to_chat_request`` builds the chat messages as vLLM's ``construct_input_messages`` does (instructions,
the previous turn's messages and output, then the new input) and the chat request around them;
``ResponseStream`` turns the chat chunks into the Responses events (``response.created`` ...
``response.completed``, each with its ``sequence_number``) with the state machine of vLLM's simple
streaming path; ``output_items`` makes a chat completion's output items for the one-shot ``Response``.
The objects carry exactly the fields of OpenAI's published schema (the SDK's typed models).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from worker.pipeline.apis.chat_source import BadRequest, JsonDict, chat_delta, dict_of, list_of, text_of

TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
# Request fields that become the chat request's under another name, or the same.
_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"}
_PASSED_ON = (
    "parallel_tool_calls",
    "user",
    "top_logprobs",
    "chat_template_kwargs",
    "cache_salt",
    "vllm_xargs",
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def error_body(status: int, message: str, param: str | None = None) -> JsonDict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


# --- request -----------------------------------------------------------------------------------------


@dataclass
class Previous:
    """The stored turn ``previous_response_id`` names: its chat messages and its output items."""

    messages: list[JsonDict]
    output: list[JsonDict]


def input_messages(body: JsonDict, previous: Previous | None = None) -> list[JsonDict]:
    """The chat messages of a Responses request, as vLLM's ``construct_input_messages`` builds them."""
    messages: list[JsonDict] = []
    instructions = body.get("instructions")
    if instructions:
        messages.append({"role": "system", "content": text_of(instructions, "instructions")})
    if previous is not None:
        # Instructions do not carry over from one response to the next; reasoning is not replayed.
        messages += [m for m in previous.messages if m.get("role") != "system"]
        for item in previous.output:
            if item.get("type") == "message":
                messages += [
                    {"role": "assistant", "content": part.get("text")} for part in item.get("content", [])
                ]
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    else:
        items: list[JsonDict] = []  # merged among themselves only, not into the history before them
        for item in list_of(given, "input"):
            message = _message_of(dict_of(item, "an input item"), items[-1] if items else None)
            if message is not None:
                items.append(message)
        messages += items
    return messages


def _message_of(item: JsonDict, last: JsonDict | None) -> JsonDict | None:
    """One input item as a chat message, or ``None`` when it was merged into ``last`` (an assistant turn
    spans reasoning, text and tool calls)."""
    assistant = last if last is not None and last.get("role") == "assistant" else None
    kind = item.get("type")
    if kind in ("function_call", "custom_tool_call"):
        name = text_of(item.get("name"), "a function call's name")
        if item.get("namespace"):
            name = f"{item['namespace']}.{name}"
        if kind == "function_call":
            arguments = text_of(item.get("arguments"), "a function call's arguments")
        else:
            arguments = _custom_input(item.get("input") or "")
        call = {
            "id": item.get("call_id"),
            "function": {"name": name, "arguments": arguments},
            "type": "function",
        }
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise BadRequest("Encrypted content is not supported.")
        parts = list_of(item.get("content") or [], "content") or list_of(item.get("summary") or [], "summary")
        reasoning = text_of(dict_of(parts[0], "a reasoning part").get("text", ""), "text") if parts else ""
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if item.get("role") == "assistant" and kind in (None, "message"):
        content = item.get("content")
        text = content if isinstance(content, str) else None
        if isinstance(content, list) and content and isinstance(content[0], dict):
            text = content[0].get("text")
        if text is not None:
            if assistant is not None and assistant.get("content") is None:
                assistant["content"] = text
                return None
            return {"role": "assistant", "content": text}
    if "role" in item:
        return item  # a user, system or developer message goes on as it is
    raise BadRequest(f"Unsupported input item type: {kind}")


def _custom_input(payload: str) -> str:
    return json.dumps({"input": payload})


def chat_tools(tools: Any) -> list[JsonDict] | None:
    """The chat tools for the Responses function tools (the flat ``{"type": "function", "name": ...}``)."""
    if not tools:
        return None
    converted = []
    for raw in list_of(tools, "tools"):
        tool = dict_of(raw, "a tool")
        if tool.get("type") != "function":
            raise BadRequest(f"tool type {tool.get('type')!r} is not supported (function tools only)")
        function = {k: v for k, v in tool.items() if k != "type" and v is not None}
        text_of(function.get("name"), "a tool's name")
        converted.append({"type": "function", "function": function})
    return converted


def to_chat_request(body: JsonDict, messages: list[JsonDict], *, stream: bool) -> JsonDict:
    """The chat completions request that generates the Responses request's answer."""
    model = body.get("model")
    if not isinstance(model, str):
        raise BadRequest("model must be a string")
    chat: JsonDict = {"model": model, "messages": messages}
    tools = chat_tools(body.get("tools"))
    choice = body.get("tool_choice", "auto")
    if tools is not None:
        chat["tools"] = tools
        if isinstance(choice, dict) and choice.get("type") == "function":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif isinstance(choice, str):
            chat["tool_choice"] = choice
    for theirs, ours in _SAMPLING.items():
        if body.get(theirs) is not None:
            chat[ours] = body[theirs]
    for name in _PASSED_ON:
        if body.get(name) is not None:
            chat[name] = body[name]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# --- the Response object -----------------------------------------------------------------------------


def response_object(body: JsonDict, response_id: str, created: int, status: str) -> JsonDict:
    """A ``Response`` with no output yet: the request's settings, as vLLM's ``from_request`` carries them."""
    reasoning = body.get("reasoning")
    return {
        "id": response_id,
        "created_at": created,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata"),
        "model": body.get("model"),
        "object": "response",
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature", 1.0),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "background": bool(body.get("background")),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "previous_response_id": body.get("previous_response_id"),
        "prompt": body.get("prompt"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": reasoning if isinstance(reasoning, dict) else None,
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": body.get("service_tier", "auto"),
        "status": status,
        "text": body.get("text"),
        "top_logprobs": body.get("top_logprobs"),
        "truncation": body.get("truncation", "disabled"),
        "usage": None,
        "user": body.get("user"),
    }


def usage_of(usage: Any) -> JsonDict | None:
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def item_status(finish_reason: str | None) -> str:
    """The status of the item a generation ended on: only ``length`` cuts it short."""
    return "incomplete" if finish_reason == "length" else "completed"


def finished(response: JsonDict, output: list[JsonDict], finish_reason: str | None, usage: Any) -> JsonDict:
    """``response`` completed (or ``incomplete`` after ``length``) with its output and usage."""
    status = "incomplete" if finish_reason == "length" else "completed"
    done = {**response, "output": output, "status": status, "usage": usage_of(usage)}
    if status == "incomplete":
        done["incomplete_details"] = {"reason": "max_output_tokens"}
    return done


def failed(response: JsonDict, output: list[JsonDict], error: JsonDict) -> JsonDict:
    message = str(error.get("message") or "the generation failed")
    return {
        **response,
        "output": output,
        "status": "failed",
        "error": {"code": "server_error", "message": message},
    }


def _text_part(text: str, logprobs: list[Any] | None = None) -> JsonDict:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _reasoning_item(item_id: str, text: str | None, status: str | None) -> JsonDict:
    content = None if text is None else [{"text": text, "type": "reasoning_text"}]
    return {
        "id": item_id,
        "summary": [],
        "type": "reasoning",
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def _message_item(item_id: str, text: str | None, status: str) -> JsonDict:
    content = [] if not text else [_text_part(text)]
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message"}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> JsonDict:
    return {
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "id": item_id,
        "status": status,
    }


def output_items(completion: JsonDict) -> tuple[list[JsonDict], str | None]:
    """A chat completion's answer as output items (reasoning, message, function calls) and its finish
    reason; only the last item can have been cut short."""
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    finish = choice.get("finish_reason")
    last = item_status(finish)
    calls = message.get("tool_calls") or []
    items: list[JsonDict] = []
    if message.get("reasoning"):
        items.append(_reasoning_item(new_id("rs"), message["reasoning"], None))
    if message.get("content"):
        items.append(_message_item(new_id("msg"), message["content"], "completed" if calls else last))
    for i, call in enumerate(calls):
        status = last if i == len(calls) - 1 else "completed"
        function = call["function"]
        call_id = call.get("id") or new_id("call")
        items.append(_call_item(new_id("fc"), call_id, function["name"], function["arguments"], status))
    return items, finish


# --- streaming ---------------------------------------------------------------------------------------


@dataclass
class ResponseStream:
    """Chat chunks in, Responses events out, numbered from 0 by ``sequence_number``.

    One output item is open at a time (reasoning, a message, or one function call); a delta of another
    kind, or another tool call's, closes it (its ``*.done`` events) and opens the next.
    """

    response: JsonDict
    sequence: int = 0
    output: list[JsonDict] = field(default_factory=list)
    state: str | None = None  # "reasoning", "message", "call" or None
    item_id: str = ""
    text: str = ""
    call_id: str = ""
    call_name: str = ""
    call_index: int | None = None
    finish_reason: str | None = None
    usage: Any = None
    # Set: item ids derive from it, so the same chunks give the same events again (a background response
    # taken over by another replica is converted again from its first chunk; its stored events stay valid).
    id_seed: str | None = None
    _ids_made: int = 0

    def _new_id(self, prefix: str) -> str:
        if self.id_seed is None:
            return new_id(prefix)
        self._ids_made += 1
        digest = hashlib.sha256(f"{self.id_seed}:{self._ids_made}".encode()).hexdigest()
        return f"{prefix}_{digest[:32]}"

    def _event(self, kind: str, **fields: Any) -> JsonDict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self) -> list[JsonDict]:
        return [
            self._event("response.created", response=self.response),
            self._event("response.in_progress", response=self.response),
        ]

    def feed(self, chunk: JsonDict) -> list[JsonDict]:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        delta, finish, _ = chat_delta(chunk)
        if finish is not None:
            self.finish_reason = finish
        events: list[JsonDict] = []
        reasoning, content, calls = (
            delta.get("reasoning"),
            delta.get("content"),
            delta.get("tool_calls") or [],
        )
        if reasoning:  # reasoning, then text, then each tool call: vLLM's split of a delta
            events += self._step("reasoning", None, reasoning)
        if content:
            events += self._step("message", None, content)
        by_index: dict[Any, list[JsonDict]] = {}
        for call in calls:
            by_index.setdefault(call.get("index"), []).append(call)
        for group in by_index.values():
            if group[0].get("function") is not None:
                arguments = "".join((c.get("function") or {}).get("arguments") or "" for c in group)
                events += self._step("call", group[0], arguments)
        return events

    def _step(self, target: str, call: JsonDict | None, delta: str) -> list[JsonDict]:
        events: list[JsonDict] = []
        switch = self.state != target or (
            target == "call"
            and call is not None
            and self.call_index is not None
            and call.get("index") is not None
            and call.get("index") != self.call_index
        )
        if switch:
            events += self._close("completed")
            events += self._open(target, call)
        if target == "call" and not delta:
            return events
        self.text += delta
        index = len(self.output)
        if target == "reasoning":
            events.append(
                self._event(
                    "response.reasoning_text.delta",
                    item_id=self.item_id,
                    output_index=index,
                    content_index=0,
                    delta=delta,
                )
            )
        elif target == "message":
            events.append(
                self._event(
                    "response.output_text.delta",
                    content_index=0,
                    output_index=index,
                    item_id=self.item_id,
                    delta=delta,
                    logprobs=[],
                )
            )
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    output_index=index,
                    item_id=self.item_id,
                    delta=delta,
                )
            )
        return events

    def _open(self, target: str, call: JsonDict | None) -> list[JsonDict]:
        self.state, self.text = target, ""
        index = len(self.output)
        if target in ("reasoning", "message"):
            reasoning = target == "reasoning"
            self.item_id = self._new_id("rs" if reasoning else "msg")
            item = (_reasoning_item if reasoning else _message_item)(self.item_id, None, "in_progress")
            part = {"text": "", "type": "reasoning_text"} if reasoning else _text_part("", [])
            return [
                self._event("response.output_item.added", output_index=index, item=item),
                self._event(
                    "response.content_part.added",
                    output_index=index,
                    item_id=self.item_id,
                    content_index=0,
                    part=part,
                ),
            ]
        assert call is not None
        function = call.get("function") or {}
        self.item_id = self._new_id("fc")
        self.call_id = call.get("id") or self._new_id("call")
        self.call_name = str(function.get("name") or "")
        self.call_index = call.get("index")
        item = _call_item(self.item_id, self.call_id, self.call_name, "", "in_progress")
        return [self._event("response.output_item.added", output_index=index, item=item)]

    def _close(self, status: str) -> list[JsonDict]:
        index = len(self.output)
        if self.state in ("reasoning", "message"):
            if self.state == "reasoning":
                part: JsonDict = {"text": self.text, "type": "reasoning_text"}
                item = _reasoning_item(self.item_id, self.text, status)
                text_done = self._event(
                    "response.reasoning_text.done",
                    item_id=self.item_id,
                    output_index=index,
                    content_index=0,
                    text=self.text,
                )
            else:
                part = _text_part(self.text)
                item = _message_item(self.item_id, self.text, status)
                text_done = self._event(
                    "response.output_text.done",
                    output_index=index,
                    content_index=0,
                    text=self.text,
                    logprobs=[],
                    item_id=self.item_id,
                )
            events = [
                text_done,
                self._event(
                    "response.content_part.done",
                    item_id=self.item_id,
                    output_index=index,
                    content_index=0,
                    part=part,
                ),
            ]
        elif self.state == "call":
            item = _call_item(self.item_id, self.call_id, self.call_name, self.text, status)
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    output_index=index,
                    item_id=self.item_id,
                    arguments=self.text,
                )
            ]
            self.call_index = None
        else:
            return []
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        self.state = None
        return events

    def end(self) -> list[JsonDict]:
        """The open item closes (``incomplete`` after ``length``), then the terminal event."""
        events = self._close(item_status(self.finish_reason))
        self.response = finished(self.response, self.output, self.finish_reason, self.usage)
        kind = "response.incomplete" if self.response["status"] == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=self.response)]

    def fail(self, error: JsonDict) -> list[JsonDict]:
        events = self._close("incomplete")
        self.response = failed(self.response, self.output, error)
        return [*events, self._event("response.failed", response=self.response)]


async def converted(
    converter: ResponseStream, first: JsonDict, answers: AsyncIterator[JsonDict]
) -> AsyncIterator[JsonDict]:
    """The Responses events of a chat stream whose first answer was ``first``."""
    for event in converter.start():
        yield event
    chunk: JsonDict | None = first
    while chunk is not None:
        if "error" in chunk:
            for event in converter.fail(chunk["error"]):
                yield event
            return
        for event in converter.feed(chunk):
            yield event
        chunk = await anext(answers, None)
    for event in converter.end():
        yield event


def now() -> int:
    return int(time.time())
