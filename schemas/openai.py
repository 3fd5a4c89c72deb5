"""OpenAI request fields derender reads, and the response objects it produces.

Requests keep every other field (``extra="allow"``) the way vLLM's
``OpenAIBaseModel`` does, so a body taken from vLLM's ``/render`` passes through
unchanged. Response models serialize to exactly vLLM 0.33.0's key sets and
nulls; the derender core builds the same shapes as plain dicts on the hot path
and the tests check the two agree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    model_serializer,
    model_validator,
)

from schemas.bounds import INT64_MAX, Int64, NonNegativeInt64


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionToolsParam(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    function: NamedFunction
    type: Literal["function"] = "function"


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | None


MAX_STOP_STRINGS = 4
"""vLLM's default ``VLLM_MAX_STOP_STRINGS``: a ``stop`` list may hold at most this many strings."""


class _SamplingFields(BaseModel):
    """Fields both request kinds share that change how output is decoded."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: Int64 | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = Field(default_factory=list)
    stop_token_ids: list[Int64] | None = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: Int64 = 0
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool = True
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    logprob_token_ids: list[Int64] | None = None
    # Not read here, but bounded as vLLM's request models bound them, so that a body it refuses
    # is refused here too.
    seed: Int64 | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = None
    priority: Int64 = 0
    routed_experts_prompt_start: NonNegativeInt64 = 0
    stream_interval: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    structured_outputs: dict[str, Any] | None = None

    def stop_strings(self) -> list[str]:
        """``stop`` as a list without empty strings, as ``SamplingParams`` normalizes it."""
        if not self.stop:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class RequestRuleError(ValueError):
    """A request rule vLLM checks before its fields, worded as its ``VLLMValidationError``: the
    text, then the parameter and the rejected value in brackets. The parameter, when there is one,
    is the error record's ``param``, as vLLM's handler reports it."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value

    def __str__(self) -> str:
        extras = []
        if self.parameter is not None:
            extras.append(f"parameter={self.parameter}")
        if self.value is not None:
            extras.append(f"value={self.value}")
        text = super().__str__()
        return f"{text} ({', '.join(extras)})" if extras else text


# The rules below read the raw body, before its fields are validated, so they see JSON values of
# any type. Each returns the body (``check_tool_usage`` may add a default ``tool_choice``) or
# raises ``RequestRuleError``. vLLM runs its ``mode="before"`` validators last-defined first; the
# tuples at the end of this section list them in that running order, so the first broken rule
# is the one reported.

Body = dict[str, Any]

_NAMED_TOOL_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def check_generation_prompt(data: Body) -> Body:
    if data.get("continue_final_message") and data.get("add_generation_prompt"):
        raise RequestRuleError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    return data


#: Validation context key: vLLM 0.34's ``tools`` rules (``tools: []`` is no tools; the unmatched
#: named tool is named in the error). Without it, vLLM 0.33's.
TOOL_RULES_034 = "tool_rules_034"


def check_tool_usage(data: Body, *, rules_034: bool = False) -> Body:
    """vLLM's rules for ``tools`` / ``tool_choice``. Where vLLM trips over a malformed ``tools``
    (a 500), the fields' own validation answers instead (a 400): this check only reads well-formed
    tools. ``rules_034``: vLLM 0.34 takes ``tools: []`` (without a named ``tool_choice``) as no
    tools, ``auto``/``required`` as ``none``; 0.33 refuses it."""
    tools = data.get("tools")
    if rules_034 and tools == [] and not isinstance(data.get("tool_choice"), dict):
        choice = data.get("tool_choice")
        data = {**data, "tools": None}
        if choice in ("auto", "required"):
            data["tool_choice"] = "none"
        tools = None
    if tools == []:
        raise RequestRuleError(
            "`tools` must not be an empty array. Either provide at least one tool or omit the "
            "field entirely.",
            parameter="tools",
        )
    if "tool_choice" not in data and tools:
        data = {**data, "tool_choice": "auto"}
    choice = data.get("tool_choice")
    if choice is None or choice == "none":
        return data
    if tools is None:
        raise RequestRuleError("When using `tool_choice`, `tools` must be set.", parameter="tool_choice")
    if not isinstance(choice, dict):
        if choice not in ("auto", "required"):
            raise RequestRuleError(
                f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" '
                'or "required" are supported.',
                parameter="tool_choice",
            )
        return data
    usage = _NAMED_TOOL_USAGE
    function = choice.get("function")
    if not isinstance(function, dict):
        raise RequestRuleError(
            f"Invalid value for `function`: `{function}` in `tool_choice`! {usage}",
            parameter="tool_choice.function",
        )
    if "name" not in function:
        raise RequestRuleError(
            f"Expected field `name` in `function` in `tool_choice`! {usage}",
            parameter="tool_choice.function.name",
        )
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise RequestRuleError(
            f"Invalid `name` in `function`: `{name}` in `tool_choice`! {usage}",
            parameter="tool_choice.function.name",
        )
    if not isinstance(tools, list):
        return data
    for tool in tools:
        tool_function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool_function, dict) or "name" not in tool_function:
            return data  # malformed: the field validation reports it
        if tool_function["name"] == name:
            return data
    named = f" `{name}`" if rules_034 else ""
    raise RequestRuleError(
        f"The tool{named} specified in `tool_choice` does not match any of the specified `tools`",
        parameter="tool_choice",
    )


_CONSTRAINT_KINDS = ("json", "regex", "choice")
_ONE_CONSTRAINT_KIND = (
    "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice')."
)


def _constraint_kinds(data: Body) -> int:
    """How many kinds of structured-output constraint the body sets; 0 for a ``structured_outputs``
    that is not an object (vLLM fails on one with a 500; the field's validation answers here)."""
    structured = data.get("structured_outputs")
    if not isinstance(structured, dict):
        return 0
    return sum(structured.get(kind) is not None for kind in _CONSTRAINT_KINDS)


def check_chat_structured_outputs(data: Body) -> Body:
    kinds = _constraint_kinds(data)
    if kinds > 1:
        raise RequestRuleError(_ONE_CONSTRAINT_KIND)  # vLLM names no parameter here
    # A null ``tool_choice`` counts as a named one here, as in vLLM.
    if kinds and data.get("tool_choice", "none") not in ("none", "auto", "required"):
        raise RequestRuleError(
            "You can only either use constraints for structured outputs or tools, not both."
        )
    return data


def check_completion_structured_outputs(data: Body) -> Body:
    if _constraint_kinds(data) > 1:
        raise RequestRuleError(_ONE_CONSTRAINT_KIND, parameter="structured_outputs")
    return data


def _check_logprob_counts(data: Body, fields: tuple[str, str]) -> None:
    """The number checks both endpoints share: ``fields`` are ``prompt_logprobs`` and the field
    holding the per-token count (``top_logprobs`` for chat, ``logprobs`` for completions)."""
    for field in fields:
        value = data.get(field)
        if value is not None and not isinstance(value, int | float):
            raise RequestRuleError(f"`{field}` must be an integer.", parameter=field, value=value)
    prompt_logprobs = data.get("prompt_logprobs")
    if prompt_logprobs is not None:
        if data.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise RequestRuleError(
                "`prompt_logprobs` are not available when `stream=True`.", parameter="prompt_logprobs"
            )
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise RequestRuleError(
                "`prompt_logprobs` must be a positive value or -1.",
                parameter="prompt_logprobs",
                value=prompt_logprobs,
            )


def check_chat_logprobs(data: Body) -> Body:
    if data.get("logprob_token_ids") and data.get("use_beam_search"):
        raise RequestRuleError(
            "`logprob_token_ids` is not supported with beam search.", parameter="logprob_token_ids"
        )
    if data.get("logprob_token_ids") and not data.get("logprobs"):
        raise RequestRuleError(
            "when using `logprob_token_ids`, `logprobs` must be set to true.", parameter="logprob_token_ids"
        )
    _check_logprob_counts(data, ("prompt_logprobs", "top_logprobs"))
    top_logprobs = data.get("top_logprobs")
    if top_logprobs is not None:
        if top_logprobs < 0 and top_logprobs != -1:
            raise RequestRuleError(
                "`top_logprobs` must be a positive value or -1.", parameter="top_logprobs", value=top_logprobs
            )
        if (top_logprobs == -1 or top_logprobs > 0) and not data.get("logprobs"):
            raise RequestRuleError(
                "when using `top_logprobs`, `logprobs` must be set to true.", parameter="top_logprobs"
            )
    return data


def check_completion_logprobs(data: Body) -> Body:
    token_ids = data.get("logprob_token_ids")
    if token_ids and data.get("use_beam_search"):
        raise RequestRuleError(
            "`logprob_token_ids` is not supported with beam search.", parameter="logprob_token_ids"
        )
    if data.get("use_beam_search") and data.get("echo") and data.get("logprobs") is not None:
        raise RequestRuleError(
            "`echo` with `logprobs` is not supported with beam search because beam search does not "
            "compute prompt logprobs.",
            parameter="echo",
        )
    if token_ids and data.get("echo") and data.get("max_tokens") == 0:
        raise RequestRuleError(
            "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no "
            "output tokens are generated.",
            parameter="logprob_token_ids",
        )
    if token_ids and data.get("logprobs") is None:
        raise RequestRuleError(
            "when using `logprob_token_ids`, `logprobs` must be set.", parameter="logprob_token_ids"
        )
    _check_logprob_counts(data, ("prompt_logprobs", "logprobs"))
    logprobs = data.get("logprobs")
    if logprobs is not None and logprobs < 0 and logprobs != -1:
        raise RequestRuleError(
            "`logprobs` must be a positive value or -1.", parameter="logprobs", value=logprobs
        )
    return data


def check_stream_options(data: Body) -> Body:
    if data.get("stream_options") and not data.get("stream"):
        raise RequestRuleError(
            "Stream options can only be defined when `stream=True`.", parameter="stream_options"
        )
    return data


def check_response_format(data: Body) -> Body:
    """A ``json_schema`` response format must carry its schema. (vLLM also compiles a
    ``structural_tag`` one with xgrammar; that grammar check is not made here.)"""
    response_format = data.get("response_format")
    if (
        isinstance(response_format, dict)
        and response_format.get("type") == "json_schema"
        and response_format.get("json_schema") is None
    ):
        raise RequestRuleError(
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            parameter="response_format",
        )
    return data


_CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")


def check_cache_salt(data: Body) -> Body:
    salt = data.get("cache_salt")
    if salt is None:
        return data
    if not isinstance(salt, str) or not salt:
        raise RequestRuleError(
            "Parameter 'cache_salt' must be a non-empty string if provided.", parameter="cache_salt"
        )
    if len(salt) > 128 or not _CACHE_SALT_FORBIDDEN.isdisjoint(salt):
        raise RequestRuleError(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', "
            "'\\\\', or NUL.",
            parameter="cache_salt",
        )
    return data


MAX_COMPLETION_PROMPTS = 1024
"""vLLM's default ``VLLM_MAX_COMPLETION_PROMPTS``."""


def check_prompt_count(data: Body) -> Body:
    """At most ``MAX_COMPLETION_PROMPTS`` prompts (or prompt embeddings) in one request. As in
    vLLM, a list whose first item is an int is one prompt of token ids."""
    prompt = data.get("prompt")
    if (
        isinstance(prompt, list)
        and prompt
        and not isinstance(prompt[0], int)
        and len(prompt) > MAX_COMPLETION_PROMPTS
    ):
        raise RequestRuleError(
            f"prompt list length {len(prompt)} exceeds the maximum allowed count of "
            f"{MAX_COMPLETION_PROMPTS}. To increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS "
            "environment variable.",
            parameter="prompt",
        )
    embeds = data.get("prompt_embeds")
    if isinstance(embeds, list) and len(embeds) > MAX_COMPLETION_PROMPTS:
        raise RequestRuleError(
            f"prompt_embeds list length {len(embeds)} exceeds the maximum allowed count of "
            f"{MAX_COMPLETION_PROMPTS}. To increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS "
            "environment variable.",
            parameter="prompt_embeds",
        )
    return data


def check_prompt_given(data: Body) -> Body:
    prompt, embeds = data.get("prompt"), data.get("prompt_embeds")
    if (prompt is None or prompt == "") and (embeds is None or embeds == []):
        raise RequestRuleError(
            "Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt"
        )
    return data


Rule = Callable[[Body], Body]

CHAT_RULES: tuple[Rule, ...] = (
    check_generation_prompt,
    check_tool_usage,
    check_chat_structured_outputs,
    check_chat_logprobs,
    check_stream_options,
    check_response_format,
    check_cache_salt,
)
"""``ChatCompletionRequest``'s rules in the order vLLM 0.33.0 runs them."""

COMPLETION_RULES: tuple[Rule, ...] = (
    check_prompt_count,
    check_prompt_given,
    check_stream_options,
    check_completion_logprobs,
    check_completion_structured_outputs,
    check_response_format,
    check_cache_salt,
)
"""``CompletionRequest``'s rules in the order vLLM 0.33.0 runs them."""

_CHAT_RULES_034 = tuple(
    functools.partial(check_tool_usage, rules_034=True) if rule is check_tool_usage else rule
    for rule in CHAT_RULES
)
"""vLLM 0.34's: the same order, its ``tools`` rules."""


def _apply(rules: tuple[Rule, ...], data: Any) -> Any:
    if isinstance(data, dict):
        for rule in rules:
            data = rule(data)
    return data


class ChatCompletionRequest(_SamplingFields):
    """The original (post ``adjust_request``) chat request from ``/render``."""

    messages: list[dict[str, Any]]
    logprobs: bool | None = False
    top_logprobs: Int64 | None = 0
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: ToolChoice = "none"
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _check_rules(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(info.context, dict) and info.context.get(TOOL_RULES_034):
            return _apply(_CHAT_RULES_034, data)
        return _apply(CHAT_RULES, data)


class CompletionRequest(_SamplingFields):
    """The original (post ``adjust_request``) completion request from ``/render``."""

    prompt: list[NonNegativeInt64] | list[list[NonNegativeInt64]] | str | list[str] | None = None
    logprobs: Int64 | None = None
    n: Int64 = 1
    echo: bool | None = False

    @model_validator(mode="before")
    @classmethod
    def _check_rules(cls, data: Any) -> Any:
        return _apply(COMPLETION_RULES, data)


# --- response objects -------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: dict[str, Any] | None = None
    completion_tokens_details: dict[str, Any] | None = None


class ChatCompletionLogProb(BaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(BaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] | None = None
    index: int
    function: DeltaFunctionCall | None = None


def _drop_empty_tool_calls(data: dict[str, Any]) -> dict[str, Any]:
    if not data.get("tool_calls"):
        data.pop("tool_calls", None)
    return data


class ChatMessage(BaseModel):
    """Serialized without ``tool_calls`` when there are none, as vLLM does."""

    role: str
    content: str | None = None
    refusal: str | None = None
    annotations: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    function_call: FunctionCall | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning: str | None = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return _drop_empty_tool_calls(data)


class DeltaMessage(BaseModel):
    """Serialized without ``tool_calls`` when there are none, as vLLM does."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return _drop_empty_tool_calls(data)


class ChatCompletionResponseChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    routed_experts: str | None = None
    weight_versions: list[dict[str, Any]] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    service_tier: str | None = None
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_logprobs: list[dict[str, Any] | None] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None


class ChatCompletionResponseStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    weight_versions: list[dict[str, Any]] | None = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
    metrics: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None


class CompletionResponseChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: list[dict[str, Any] | None] | None = None
    prompt_token_ids: list[int] | None = None
    routed_experts: str | None = None
    weight_versions: list[dict[str, Any]] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseChoice]
    service_tier: str | None = None
    system_fingerprint: str | None = None
    usage: UsageInfo
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None


class CompletionResponseStreamChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    weight_versions: list[dict[str, Any]] | None = None


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    metrics: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """vLLM's error body; ``code`` is the HTTP status vLLM would answer with."""

    error: ErrorInfo
