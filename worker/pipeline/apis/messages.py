"""Anthropic Messages (``POST /v1/messages``) on the chat derender, as vLLM 0.33.0 serves it.

``to_chat_request`` makes the chat completions request vLLM's ``to_chat_completion_request`` makes;
``MessageStream`` turns the chat chunks into the Messages event sequence (``message_start``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``) and ``to_message``
a chat completion into the one ``Message``. Reasoning becomes ``thinking`` blocks, tool calls ``tool_use``
blocks, and ``stop_reason`` is mapped as vLLM maps it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from worker.pipeline.apis.chat_source import BadRequest, JsonDict, chat_delta, dict_of, list_of, text_of

_BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's per-request hash: dropped from system text
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
# Request fields carried over to the chat request under the same name (vLLM's extensions among them).
_PASSED_ON = (
    "temperature",
    "top_p",
    "top_k",
    "cache_salt",
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
    "chat_template_kwargs",
)


def error_type(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status, as vLLM translates it."""
    return _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> JsonDict:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


# --- request -----------------------------------------------------------------------------------------


def to_chat_request(body: JsonDict, *, merge_inline_system: bool = False) -> JsonDict:
    """The chat completions request for a Messages request (raises ``BadRequest``).

    ``merge_inline_system``: vLLM merges inline system messages into the leading one when the chat
    template rejects a system message after the first turn; the gateway has no template, so it is off.
    """
    model = body.get("model")
    if not isinstance(model, str):
        raise BadRequest("model must be a string")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise BadRequest("max_tokens must be an integer")
    messages: list[JsonDict] = []
    system = _system_text(body, merge_inline_system)
    if system:
        messages.append({"role": "system", "content": system})
    for message in list_of(body.get("messages"), "messages"):
        _convert_message(dict_of(message, "a message"), messages, merge_inline_system)
    chat: JsonDict = {"model": model, "messages": messages, "max_tokens": max_tokens}
    chat["max_completion_tokens"] = max_tokens
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    for name in _PASSED_ON:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    _output_config(body, chat)
    _thinking(body, chat)
    _tools(body, chat)
    return chat


def _block_texts(blocks: list[Any]) -> list[str]:
    texts = []
    for block in blocks:
        block = dict_of(block, "a content block")
        text = block.get("text")
        if (
            block.get("type") == "text"
            and isinstance(text, str)
            and text
            and not text.startswith(_BILLING_HEADER)
        ):
            texts.append(text)
    return texts


def _system_text(body: JsonDict, merge_inline_system: bool) -> str:
    system = body.get("system")
    parts: list[str] = []
    if isinstance(system, str):
        parts.append(system)  # a top-level string is kept whole, as vLLM keeps it
    elif system:
        parts += _block_texts(list_of(system, "system"))
    if merge_inline_system:
        for message in list_of(body.get("messages"), "messages"):
            if isinstance(message, dict) and message.get("role") == "system":
                text = _inline_system_text(message)
                if text:
                    parts.append(text)
    return "".join(parts)


def _inline_system_text(message: JsonDict) -> str | None:
    content = message.get("content")
    if isinstance(content, str):
        return None if content.startswith(_BILLING_HEADER) else content
    texts = _block_texts(list_of(content, "content"))
    return "".join(texts) if texts else None


def _convert_message(message: JsonDict, out: list[JsonDict], merge_inline_system: bool) -> None:
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise BadRequest(f"unknown message role {role!r}")
    if role == "system":
        text = None if merge_inline_system else _inline_system_text(message)
        if text:
            out.append({"role": "system", "content": text})
        return
    chat: JsonDict = {"role": role}
    content = message.get("content")
    if isinstance(content, str):
        chat["content"] = content
    else:
        _convert_blocks(list_of(content, "content"), role, chat, out)
    if role == "user" and "content" not in chat:
        return  # a user turn of tool results only: its tool messages were added already
    out.append(chat)


def _image_url(source: JsonDict) -> str:
    if source.get("type") == "url":
        return str(source.get("url") or "")
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _convert_blocks(blocks: list[Any], role: str, chat: JsonDict, out: list[JsonDict]) -> None:
    parts: list[JsonDict] = []
    calls: list[JsonDict] = []
    reasoning: list[str] = []
    for raw in blocks:
        block = dict_of(raw, "a content block")
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": text_of(block["text"], "text")})
        elif kind == "image" and block.get("source"):
            parts.append(
                {"type": "image_url", "image_url": {"url": _image_url(dict_of(block["source"], "source"))}}
            )
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(text_of(block["thinking"], "thinking"))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {
                        "name": block.get("name") or "",
                        "arguments": json.dumps(block.get("input") or {}),
                    },
                }
            )
        elif kind == "tool_result":
            if role == "user":
                _tool_result(block, out)
            else:
                result = str(block["content"]) if block.get("content") else ""
                parts.append({"type": "text", "text": f"Tool result: {result}"})
        elif kind not in (
            "text",
            "image",
            "thinking",
            "redacted_thinking",
            "tool_reference",
            "tool_addition",
            "tool_removal",
        ):
            raise BadRequest(f"unknown content block type {kind!r}")
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if parts:
        chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _tool_result(block: JsonDict, out: list[JsonDict]) -> None:
    content = block.get("content")
    text = ""
    images: list[str] = []
    references: list[JsonDict] = []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "text":
                texts.append(str(item.get("text", "")))
            elif item.get("type") == "image":
                source = item.get("source")
                url = _image_url(source if isinstance(source, dict) else {})
                if url:
                    images.append(url)
            elif item.get("type") == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.get("tool_use_id") or ""
    out.append({"role": "tool", "tool_call_id": call_id, "content": text or ""})
    if images:
        out.append(
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]}
        )
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})


def _output_config(body: JsonDict, chat: JsonDict) -> None:
    config = body.get("output_config")
    if not isinstance(config, dict):
        return
    fmt = config.get("format")
    if isinstance(fmt, dict) and fmt.get("schema") is not None:
        chat["response_format"] = {
            "type": fmt.get("type"),
            "json_schema": {"name": fmt.get("type"), "schema": fmt["schema"]},
        }
    if config.get("effort") is not None:
        chat["reasoning_effort"] = config["effort"]


def _thinking(body: JsonDict, chat: JsonDict) -> None:
    thinking = body.get("thinking")
    if not isinstance(thinking, dict):
        return
    if thinking.get("type") == "disabled":
        # vLLM probes its template for whether "none" really disables thinking; without a template the
        # gateway sends "none", which is what vLLM picks for templates that honour it.
        chat["reasoning_effort"] = "none"
    elif thinking.get("type") == "enabled" and thinking.get("budget_tokens") is not None:
        chat["thinking_token_budget"] = thinking["budget_tokens"]


def _tools(body: JsonDict, chat: JsonDict) -> None:
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        chat["parallel_tool_calls"] = not choice.get("disable_parallel_tool_use", False)
        kind = choice.get("type")
        if kind in ("auto", "none"):
            chat["tool_choice"] = kind
        elif kind == "any":
            chat["tool_choice"] = "required"
        elif kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    tools = body.get("tools")
    if tools is None:
        return
    converted = []
    for raw in list_of(tools, "tools"):
        tool = dict_of(raw, "a tool")
        function: JsonDict = {"name": text_of(tool.get("name"), "a tool's name")}
        for ours, theirs in (
            ("description", "description"),
            ("parameters", "input_schema"),
            ("strict", "strict"),
        ):
            if tool.get(theirs) is not None:
                function[ours] = tool[theirs]
        converted.append({"type": "function", "function": function})
    chat.setdefault("tool_choice", "auto")
    chat["tools"] = converted


# --- response ----------------------------------------------------------------------------------------


def stop_reason(
    finish_reason: str | None, stop: Any, tool_used: bool, tool_complete: bool
) -> tuple[str | None, str | None]:
    """Anthropic's ``(stop_reason, stop_sequence)`` for a chat finish, as vLLM maps it: ``max_tokens`` wins;
    a matched stop string wins unless the tool calls are complete (a call it cut short must not run)."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def usage_of(usage: Any) -> JsonDict:
    """Anthropic usage from chat usage: cached prompt tokens are counted apart from ``input_tokens``."""
    if not isinstance(usage, dict):
        return {"input_tokens": 0, "output_tokens": 0}
    out: JsonDict = {"output_tokens": usage.get("completion_tokens") or 0}
    prompt = usage.get("prompt_tokens") or 0
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        if details.get("created_cache_tokens") is not None:
            prompt -= details["created_cache_tokens"]
            out["cache_creation_input_tokens"] = details["created_cache_tokens"]
        if details.get("cached_tokens") is not None:
            prompt -= details["cached_tokens"]
            out["cache_read_input_tokens"] = details["cached_tokens"]
    return {"input_tokens": max(0, prompt), **out}  # in the order of vLLM's AnthropicUsage


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def to_message(completion: JsonDict) -> JsonDict:
    """The ``Message`` for a (non-streamed) chat completion, ``None`` fields left out as vLLM dumps it."""
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    calls = message.get("tool_calls") or []
    reason, sequence = stop_reason(
        choice.get("finish_reason"), choice.get("stop_reason"), bool(calls), bool(calls)
    )
    content: list[JsonDict] = []
    if message.get("reasoning"):
        content.append({"type": "thinking", "thinking": message["reasoning"], "signature": uuid.uuid4().hex})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in calls:
        arguments = json.loads(call["function"]["arguments"])
        content.append(
            {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments}
        )
    if not content:
        content.append({"type": "text", "text": ""})  # strict clients read content[0]
    out: JsonDict = {
        "id": completion["id"],
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": completion.get("model"),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_of(completion.get("usage")),
    }
    return {k: v for k, v in out.items() if v is not None}


Event = tuple[str, JsonDict]


class MessageStream:
    """Chat chunks in, Messages events out (``(event name, data)``), in vLLM's order.

    Text that arrives while a ``tool_use`` block is open is held and sent as a text block of its own
    when that block closes (a tool call's arguments are never interleaved with text).
    """

    def __init__(self) -> None:
        self.started = False
        self.next_index = 0
        self.block_type: str | None = None
        self.block_index = 0
        self.signature: str | None = None  # the open thinking block's, sent when it closes
        self.tool_use_id: str | None = None
        self.pending_text: list[str] = []
        self.finish_reason: str | None = None
        self.stop: Any = None
        self.tool_used = False
        self.last_tool_args: list[str] = []
        self.tool_ids: dict[int, str] = {}

    def feed(self, chunk: JsonDict) -> list[Event]:
        events: list[Event] = []
        if not self.started:
            self.started = True
            message: JsonDict = {
                "id": chunk.get("id"),
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": chunk.get("model"),
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage_of(chunk.get("usage")),
            }
            # vLLM drops the rest of this first chunk; the worker's first chunk can carry reasoning
            # with the role, so it goes on to the deltas below.
            events.append(("message_start", {"type": "message_start", "message": message}))
        if not chunk.get("choices"):  # the usage chunk: the message's end
            events += self._flush()
            complete = self.tool_used and _is_json("".join(self.last_tool_args))
            reason, sequence = stop_reason(self.finish_reason or "stop", self.stop, self.tool_used, complete)
            delta = {"stop_reason": reason, "stop_sequence": sequence}
            data = {"type": "message_delta", "delta": delta, "usage": usage_of(chunk.get("usage"))}
            return [*events, ("message_delta", data)]
        delta, finish, stop = chat_delta(chunk)
        if finish is not None:
            self.finish_reason, self.stop = finish, stop
        reasoning = delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            if self.block_type != "thinking":
                events += self._flush()
                events.append(self._start({"type": "thinking", "thinking": "", "signature": ""}))
            events.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self.block_type == "tool_use":
                self.pending_text.append(text)
            else:
                if self.block_type != "text":
                    events += self._flush()
                    events.append(self._start({"type": "text", "text": ""}))
                events.append(self._delta({"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                events += self._tool_call(call)
        return events

    def _tool_call(self, call: JsonDict) -> list[Event]:
        events: list[Event] = []
        function = call.get("function") or {}
        arguments = function.get("arguments")
        call_id = call.get("id")
        if call_id is not None:
            self.tool_ids[call.get("index", 0)] = call_id
            if self.tool_use_id != call_id and function.get("name") is not None:
                events += self._flush()
                self.tool_used = True
                self.last_tool_args = []
                block = {"type": "tool_use", "id": call_id, "name": function["name"], "input": {}}
                events.append(self._start(block))
        else:
            call_id = self.tool_ids.get(call.get("index", 0))
        if arguments and call_id is not None and self.tool_use_id == call_id:
            self.last_tool_args.append(arguments)
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events

    def _start(self, block: JsonDict) -> Event:
        self.block_type = block["type"]
        self.block_index = self.next_index
        self.signature = uuid.uuid4().hex if block["type"] == "thinking" else None
        self.tool_use_id = block.get("id") if block["type"] == "tool_use" else None
        data = {"type": "content_block_start", "content_block": block, "index": self.block_index}
        return ("content_block_start", data)

    def _delta(self, delta: JsonDict) -> Event:
        return (
            "content_block_delta",
            {"type": "content_block_delta", "delta": delta, "index": self.block_index},
        )

    def _stop(self) -> list[Event]:
        if self.block_type is None:
            return []
        events: list[Event] = []
        if self.block_type == "thinking" and self.signature is not None:
            events.append(self._delta({"type": "signature_delta", "signature": self.signature}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": self.block_index}))
        self.block_type = self.signature = self.tool_use_id = None
        self.next_index += 1
        return events

    def _flush(self) -> list[Event]:
        """Close the open block, then send the text held while a tool call was open, as a block of its own."""
        held = "".join(self.pending_text)
        self.pending_text.clear()
        events = self._stop()
        if held:
            events.append(self._start({"type": "text", "text": ""}))
            events.append(self._delta({"type": "text_delta", "text": held}))
            events += self._stop()
        return events

    def end(self) -> list[Event]:
        return [*self._flush(), ("message_stop", {"type": "message_stop"})]

    def error(self, error: JsonDict) -> list[Event]:
        """The stream ends with an error: the open block closes, then the ``error`` event."""
        status = error.get("code")
        kind = error_type(status) if isinstance(status, int) else "api_error"
        data = {"type": "error", "error": {"type": kind, "message": str(error.get("message", ""))}}
        return [*self._stop(), ("error", data)]
