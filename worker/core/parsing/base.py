"""Base classes every reasoning and tool parser module implements.

Parsers are per request (per choice when streaming): they may keep state across
``stream`` calls. All ``stream`` methods receive only the new text and ids of one
record; a parser that needs history keeps what it needs itself, so the warm path
stays proportional to the delta.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from worker.core.parsing.types import DeltaOut, ExtractedCalls, ParseRequest, ParserTokenizer


class ReasoningParser(ABC):
    """Splits model output into reasoning and content."""

    #: True for parsers that mirror vLLM's "parser engine" adapters: the
    #: composite then confirms the end of reasoning by asking the parser, and
    #: flushes it when reasoning ends.
    engine_based: ClassVar[bool] = False

    def __init__(self, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.chat_template_kwargs = chat_template_kwargs

    @abstractmethod
    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        """Whether these (prompt) ids leave reasoning closed."""

    def set_prompt_token_ids(self, prompt_token_ids: Sequence[int]) -> None:
        """See the rendered prompt before parsing (default: ignore it)."""
        return None

    def adjust_initial_state_from_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        """Streaming hook when the prompt leaves reasoning open (default: nothing)."""
        return None

    @abstractmethod
    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        """One-shot split into ``(reasoning, content)``."""

    @abstractmethod
    def stream(self, delta_text: str, delta_ids: Sequence[int]) -> DeltaOut | None:
        """Classify one record's text while reasoning may still be open."""

    @abstractmethod
    def ended_in_stream(self, delta_ids: Sequence[int]) -> bool:
        """After :meth:`stream`: did reasoning end with this record?"""

    @abstractmethod
    def content_ids(self, delta_ids: list[int]) -> list[int]:
        """The ids of this record that follow the end of reasoning."""

    def finish_stream(self) -> DeltaOut | None:
        """Flush text held back for markup (engine parsers only)."""
        return None

    def fallback_content(self) -> str | None:
        """Content added to a stream's last chunk when reasoning never ended (vLLM's
        ``get_streaming_fallback_content``; default: none)."""
        return None


class ToolParser(ABC):
    """Extracts tool calls from content (reasoning already removed)."""

    engine_based: ClassVar[bool] = False
    #: The parse budget's default window for this family (``CompositeParser``): characters per
    #: record its valid output may read again beyond 8 times its text.
    reread_window: ClassVar[int] = 32
    #: False for parsers with an xgrammar structural tag: vLLM's strict tool
    #: calling (on by default) then parses ``required``/named choices with the
    #: parser's native format, exactly like ``auto``.
    supports_required_and_named: ClassVar[bool] = True

    def __init__(
        self,
        tokenizer: ParserTokenizer,
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any],
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.chat_template_kwargs = chat_template_kwargs
        #: Set by the composite when no reasoning parser is configured
        #: (engine tool parsers then keep reasoning markup as content).
        self.skip_reasoning_parsing = False
        self._reread = 0
        self.setup()

    def setup(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """The family's own state, made once ``tokenizer``, ``tools`` and ``chat_template_kwargs`` are
        set (families override this, not ``__init__``)."""

    @abstractmethod
    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        """One-shot extraction from the whole content."""

    @abstractmethod
    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        """One record of tool-phase text; the parser accumulates what it needs."""

    def remaining_unstreamed_args(self) -> str:
        """Arguments of the last call parsed but not streamed yet (appended at finish)."""
        return ""

    def reread_chars(self) -> int:
        """Characters handed to reads of more than the record's own text (vLLM's re-reads).

        A family that reads some shapes whole at every record counts what it hands to those
        reads; the composite bounds the sum (README, "The parse budget"). Families that read
        each character once count nothing.
        """
        return self._reread

    def finish_stream(self) -> DeltaOut | None:
        """Flush buffered state at the end of the stream (engine parsers only)."""
        return None
