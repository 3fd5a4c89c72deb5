"""OpenAI request fields derender reads, and the response objects it produces.

Requests keep every other field (``extra="allow"``) the way vLLM's
``OpenAIBaseModel`` does, so a body taken from vLLM's ``/render`` passes through
unchanged. Response models serialize to exactly vLLM 0.33.0's key sets and
nulls; the derender core builds the same shapes as plain dicts on the hot path
and the tests check the two agree.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from schemas.bounds import Int64


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


class _SamplingFields(BaseModel):
    """Fields both request kinds share that change how output is decoded."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: Int64 | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(default_factory=list)
    stop_token_ids: list[Int64] | None = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: Int64 = 0
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool = True
    return_token_ids: bool | None = None
    logprob_token_ids: list[Int64] | None = None

    def stop_strings(self) -> list[str]:
        """``stop`` as a list without empty strings, as ``SamplingParams`` normalizes it."""
        if not self.stop:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


_NAMED_TOOL_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


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
    def _check_tool_usage(cls, data: Any) -> Any:
        """vLLM's own rules for ``tools`` / ``tool_choice`` (``check_tool_usage``), in its order and
        words. Where vLLM trips over a malformed ``tools`` (a 500), the fields' own validation
        answers instead (a 400): this check only reads well-formed tools."""
        if not isinstance(data, dict):
            return data
        tools = data.get("tools")
        if tools == []:
            raise ValueError(
                "`tools` must not be an empty array. Either provide at least one tool or omit the "
                "field entirely."
            )
        if "tool_choice" not in data and tools:
            data = {**data, "tool_choice": "auto"}
        choice = data.get("tool_choice")
        if choice is None or choice == "none":
            return data
        if tools is None:
            raise ValueError("When using `tool_choice`, `tools` must be set.")
        if not isinstance(choice, dict):
            if choice not in ("auto", "required"):
                raise ValueError(
                    f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" '
                    'or "required" are supported.'
                )
            return data
        usage = _NAMED_TOOL_USAGE
        function = choice.get("function")
        if not isinstance(function, dict):
            raise ValueError(f"Invalid value for `function`: `{function}` in `tool_choice`! {usage}")
        if "name" not in function:
            raise ValueError(f"Expected field `name` in `function` in `tool_choice`! {usage}")
        name = function["name"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {usage}")
        if not isinstance(tools, list):
            return data
        for tool in tools:
            tool_function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool_function, dict) or "name" not in tool_function:
                return data  # malformed: the field validation reports it
            if tool_function["name"] == name:
                return data
        raise ValueError("The tool specified in `tool_choice` does not match any of the specified `tools`")

    @model_validator(mode="before")
    @classmethod
    def _check_logprobs(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("logprob_token_ids") and not data.get("logprobs"):
            raise ValueError("when using `logprob_token_ids`, `logprobs` must be set to true.")
        return data


class CompletionRequest(_SamplingFields):
    """The original (post ``adjust_request``) completion request from ``/render``."""

    prompt: Any = None
    logprobs: Int64 | None = None
    echo: bool | None = False


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
