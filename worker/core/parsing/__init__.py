"""Reasoning and tool-call parsing for chat derender (vLLM 0.33.0 behaviour).

Entry point: :meth:`ChatParsing.create` once per server config, then per
request :meth:`ChatParsing.parse_full` (one-shot) or
:meth:`ChatParsing.new_stream` (one :class:`ChatStreamSession` per streamed
choice, kept alive across records; ``step`` once per record).

Adding a parser
---------------
Write its module and add one line per name to the tables in
:mod:`~worker.core.parsing.registry` (``"module:Class"``, imported on first use):

* a vLLM "parser engine" family: one module in ``families/`` holding its
  markers, :class:`~worker.core.parsing.engine.config.EngineConfig`, argument
  converter and streaming argument scanner, one
  :class:`~worker.core.parsing.engine.family.EngineFamily` subclass, and its
  reasoning and tool adapters (subclasses of
  :class:`~worker.core.parsing.engine.reasoning.EngineReasoningParser` and
  :class:`~worker.core.parsing.engine.tools.EngineToolParser` naming that
  family); override a hook only where vLLM's own class does;
* other reasoning parsers: subclass :class:`~worker.core.parsing.base.ReasoningParser`
  in ``reasoning/``;
* other tool parsers: subclass :class:`~worker.core.parsing.base.ToolParser` in
  ``tools/``, and set ``supports_required_and_named = False`` when vLLM's class
  has a ``structural_tag_model`` (strict tool calling then parses ``required``
  and named choices natively).

The checklist (golden cases, cost rows, compatibility notes) is in
``docs/parser-families.md``.

Constructors take ``(tokenizer, chat_template_kwargs)`` (reasoning) or
``(tokenizer, tools, chat_template_kwargs)`` (tools) and raise
:class:`ParserSetupError` when the tokenizer cannot serve them. ``stream``
gets one record's text and ids: keep what you need to stay O(delta); tool
parsers see only tool-phase text (reasoning already removed).

gpt-oss is the exception, as in vLLM: a ``model_type: gpt_oss`` model is parsed
by token id with the Harmony library (``families/harmony.py``), whatever the
flags say, instead of the composite of a reasoning and a tool parser.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from worker.core.parsing import harmony_switch
from worker.core.parsing.base import ReasoningParser, ToolParser
from worker.core.parsing.composite import CompositeParser
from worker.core.parsing.registry import reasoning_parsers, tool_parsers
from worker.core.parsing.stream import ChatStreamSession
from worker.core.parsing.tokenizer import TokenizerAdapter, adapter_for
from worker.core.parsing.tool_choice import (
    assemble_message,
    filter_parallel_calls,
    filter_parallel_delta,
    keeps_tool_calls,
    resolve_finish_reason,
)
from worker.core.parsing.types import (
    DeltaOut,
    FunctionDeltaOut,
    ParsedMessage,
    ParseRequest,
    ParserTokenizer,
    ToolCallDeltaOut,
    ToolCallOut,
)
from worker.errors import ConfigurationError, ParserSetupError

if TYPE_CHECKING:
    from worker.core.parsing.families.harmony import HarmonyChoiceParser

__all__ = [
    "ChatParsing",
    "ChatStreamSession",
    "DeltaOut",
    "FunctionDeltaOut",
    "ParseRequest",
    "ParsedMessage",
    "ParserSetupError",
    "ParserTokenizer",
    "ReasoningParser",
    "TokenizerAdapter",
    "ToolCallDeltaOut",
    "ToolCallOut",
    "ToolParser",
    "adapter_for",
    "filter_parallel_calls",
    "filter_parallel_delta",
    "keeps_tool_calls",
    "resolve_finish_reason",
]


#: Tool parser names vLLM 0.34 reads on its parser engine (``VllmBehaviour.llama3_json_on_engine``),
#: where 0.33 used the class the registry names.
ENGINE_READ_AT_034 = frozenset({"llama3_json", "llama4_json"})


class ChatParsing:
    """The parser configuration of one server (vLLM's composed ``Parser`` class)."""

    def __init__(
        self,
        tokenizer: ParserTokenizer,
        reasoning_cls: type[ReasoningParser] | None,
        tool_cls: type[ToolParser] | None,
        enable_auto_tool_choice: bool,
        reread_window: int | None = None,
        reasoning_streams_all: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.reasoning_cls = reasoning_cls
        self.tool_cls = tool_cls
        self.enable_auto_tool_choice = enable_auto_tool_choice
        self.reread_window = reread_window
        self.reasoning_streams_all = reasoning_streams_all
        #: vLLM's ``use_harmony``: the model's output is Harmony, parsed by token id.
        self.harmony = harmony_switch.serves(tokenizer)

    @classmethod
    def create(
        cls,
        tokenizer: ParserTokenizer,
        *,
        reasoning_parser: str | None,
        tool_parser: str | None,
        enable_auto_tool_choice: bool,
        reread_window: int | None = None,
        reasoning_streams_all: bool = False,
        llama3_json_on_engine: bool = False,
    ) -> ChatParsing | None:
        """None when no parser applies; ``ConfigurationError`` for unknown names or unusable tokenizers.

        ``reread_window``: the parse budget's characters per record (None: the tool family's own;
        0: none; see ``CompositeParser``). ``reasoning_streams_all``: vLLM 0.34's streaming rule
        for an engine reasoning parser without a tool parser (see ``CompositeParser``).
        ``llama3_json_on_engine``: vLLM 0.34's reader for ``ENGINE_READ_AT_034`` (``families/llama_json``);
        this is the one place a version picks a tool parser's reader.

        As in vLLM, a tool parser only counts with ``enable_auto_tool_choice``
        (its name is not even checked otherwise). A gpt-oss model (``model_type: gpt_oss``) is parsed
        with Harmony, and its reasoning parser defaults to ``openai_gptoss`` as in vLLM.
        """
        reasoning_parser, tool_parser = harmony_switch.harmony_names(tokenizer, reasoning_parser, tool_parser)
        if not reasoning_parser and not tool_parser:
            return None
        reasoning_cls: type[ReasoningParser] | None = None
        tool_cls: type[ToolParser] | None = None
        if reasoning_parser:
            known = reasoning_parsers()
            if reasoning_parser not in known:
                raise ConfigurationError(
                    f"unknown reasoning parser {reasoning_parser!r}; known: {', '.join(sorted(known))}"
                )
            reasoning_cls = known[reasoning_parser]
        if enable_auto_tool_choice and tool_parser:
            known_tools = tool_parsers()
            if tool_parser not in known_tools:
                raise ConfigurationError(
                    f"unknown tool parser {tool_parser!r}; known: {', '.join(sorted(known_tools))}"
                )
            tool_cls = known_tools[tool_parser]
            if llama3_json_on_engine and tool_parser in ENGINE_READ_AT_034:
                # Imported here, as the registry imports a family: only a server that reads it loads it.
                from worker.core.parsing.families.llama_json import Llama3JsonEngineParser

                tool_cls = Llama3JsonEngineParser
        if reasoning_cls is None and tool_cls is None:
            return None
        if harmony_switch.serves(tokenizer):
            from worker.core.parsing.families import harmony  # the library: only for a gpt-oss model

            # vLLM's HarmonyParser takes only its own two parsers (a ValueError at startup there).
            for cls_, name, own in (
                (reasoning_cls, reasoning_parser, harmony.GptOssReasoning),
                (tool_cls, tool_parser, harmony.GptOssTools),
            ):
                if cls_ is not None and cls_ is not own:
                    raise ConfigurationError(
                        f"parser {name} cannot parse a gpt-oss model: its output is Harmony "
                        f"(--reasoning-parser {harmony_switch.REASONING_NAME}, "
                        f"--tool-call-parser {harmony_switch.TOOL_NAME})"
                    )
        # Startup check with default settings, like vLLM's tokenizer validation.
        try:
            if reasoning_cls is not None:
                reasoning_cls(tokenizer, {})
            if tool_cls is not None:
                tool_cls(tokenizer, None, {})
        except ParserSetupError as exc:
            flags = []
            if tool_cls is not None:
                flags.append(f"tool parser {tool_parser}")
            if reasoning_cls is not None:
                flags.append(f"reasoning parser {reasoning_parser}")
            joined = " and ".join(flags)
            raise ConfigurationError(f"{joined} cannot be used with this tokenizer: {exc}") from exc
        return cls(
            tokenizer, reasoning_cls, tool_cls, enable_auto_tool_choice, reread_window, reasoning_streams_all
        )

    @property
    def auto_tools(self) -> bool:
        return self.enable_auto_tool_choice and self.tool_cls is not None

    def _parser(self, request: ParseRequest) -> CompositeParser | HarmonyChoiceParser:
        """Per-request parser; raises :class:`ParserSetupError` (vLLM: 500 one-shot, 400 streaming)."""
        if self.harmony:
            from worker.core.parsing.families.harmony import HarmonyChoiceParser

            return HarmonyChoiceParser(
                self.tokenizer,
                request,
                reasoning=self.reasoning_cls is not None,
                tools=self.tool_cls is not None,
            )
        kwargs: dict[str, Any] = dict(request.chat_template_kwargs)
        return CompositeParser(
            self.tokenizer,
            self.reasoning_cls,
            self.tool_cls,
            request,
            kwargs,
            self.reread_window,
            reasoning_streams_all=self.reasoning_streams_all,
        )

    def parse_full(
        self,
        text: str,
        token_ids: list[int],
        request: ParseRequest,
        prompt_token_ids: list[int] | None,
    ) -> ParsedMessage:
        """One-shot: parse the whole output and assemble the message fields."""
        parser = self._parser(request)
        if not isinstance(parser, CompositeParser):
            reasoning, content, calls = parser.parse(token_ids)
            return assemble_message(request, reasoning, content, calls, auto_tools=self.auto_tools)
        if prompt_token_ids is not None:
            parser.set_prompt_token_ids(prompt_token_ids)
        reasoning, content, calls = parser.parse(text, self.enable_auto_tool_choice)
        return assemble_message(request, reasoning, content, calls, auto_tools=self.auto_tools)

    def new_stream(self, request: ParseRequest, prompt_token_ids: list[int] | None) -> ChatStreamSession[Any]:
        """A live session for one streamed choice."""
        return ChatStreamSession(
            self._parser(request),
            request,
            prompt_token_ids,
            keep_tool_calls=keeps_tool_calls(request, auto_tools=self.auto_tools),
        )
