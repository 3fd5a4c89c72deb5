"""Plain data shapes shared by the parsing layer and the derender core."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class ParseRequest:
    """The chat request fields parsing reads (the core converts from the wire model).

    ``tool_choice`` must already carry vLLM's request defaulting: ``"auto"`` when
    tools are given without a choice, ``"none"`` when neither is given.
    """

    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def named_function(self) -> str | None:
        """The forced function name of a named ``tool_choice``, else None."""
        choice = self.tool_choice
        if isinstance(choice, dict):
            function = choice.get("function")
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                return str(function["name"])
        return None

    @property
    def forces_tool_calls(self) -> bool:
        """``required`` or a named tool: the response must carry tool calls."""
        return self.tool_choice == "required" or self.named_function is not None


class ParserTokenizer(Protocol):
    """What parsers may use from the tokenizer."""

    model_type: str | None
    special_ids: frozenset[int]
    """transformers' ``all_special_ids`` (engine parsers drop these tokens)."""

    def token_to_id(self, token: str) -> int | None: ...

    def id_to_token(self, token_id: int) -> str | None: ...

    def get_vocab(self) -> dict[str, int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


@dataclass(frozen=True)
class ToolCallOut:
    """One finished tool call of a one-shot message."""

    id: str
    name: str
    arguments: str


@dataclass
class ParsedMessage:
    """The assistant message fields of a one-shot response."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCallOut]


@dataclass
class FunctionDeltaOut:
    """``DeltaFunctionCall``: both keys are always serialized (null when None)."""

    name: str | None = None
    arguments: str | None = None


@dataclass
class ToolCallDeltaOut:
    """``DeltaToolCall``; ``function`` None serializes as ``"function": null``."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDeltaOut | None = None


@dataclass
class DeltaOut:
    """``DeltaMessage`` without role; an empty ``tool_calls`` list is omitted on the wire.

    ``""`` and None differ on the wire, so both are kept as produced.
    """

    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDeltaOut] = field(default_factory=list)


@dataclass
class ExtractedCalls:
    """A tool parser's one-shot result (``ExtractedToolCallInformation``)."""

    tools_called: bool
    calls: list[ToolCallOut]
    content: str | None
