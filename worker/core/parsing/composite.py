"""The reasoning + tool pipeline of one request (vLLM's ``DelegatingParser``)."""

from __future__ import annotations

from typing import Any, Final

from worker.core.parsing.base import ReasoningParser, ToolParser
from worker.core.parsing.forced import named_stream_delta, parse_required_array, required_stream_delta
from worker.core.parsing.types import DeltaOut, ParseRequest, ParserTokenizer, ToolCallOut
from worker.errors import ParseBudgetExceededError

#: The parse budget (README, "The parse budget"): a tool parser may re-read this many times the
#: tool-phase text (a call read whole a few times: at its name, its close, a finish) plus a window
#: of characters per record (``--parse-budget-window``, else its family's ``reread_window``).
REREAD_TEXT_FACTOR: Final = 8


class CompositeParser:
    def __init__(
        self,
        tokenizer: ParserTokenizer,
        reasoning_cls: type[ReasoningParser] | None,
        tool_cls: type[ToolParser] | None,
        request: ParseRequest,
        chat_template_kwargs: dict[str, Any],
        reread_window: int | None = None,
        *,
        reasoning_streams_all: bool = False,
    ) -> None:
        self.request = request
        self.reasoning = reasoning_cls(tokenizer, chat_template_kwargs) if reasoning_cls else None
        self.tools = tool_cls(tokenizer, request.tools, chat_template_kwargs) if tool_cls else None
        #: The parse budget's window: None takes the tool family's own; 0 is no budget.
        if reread_window is None:
            reread_window = tool_cls.reread_window if tool_cls is not None else 0
        self.reread_window = reread_window
        self.engine_based = (self.reasoning is None or self.reasoning.engine_based) and (
            self.tools is None or self.tools.engine_based
        )
        if self.reasoning is None and self.tools is not None:
            self.tools.skip_reasoning_parsing = True
        # vLLM 0.34 (``reasoning_streams_all``): with no tool parser to take reasoning markers, an
        # engine grammar that reopens reasoning in content streams the whole output, content
        # included (its whitespace and partial-character holds apply), as one-shot parsing does.
        self._reasoning_streams_all = (
            reasoning_streams_all
            and self.tools is None
            and bool(getattr(self.reasoning, "opens_reasoning_in_content", False))
        )
        # streaming state
        self._reasoning_ended = False
        self._prompt_checked = False
        self._name_returned = False
        # tool-phase text so far; kept only for the forced ``required`` path
        self._tool_text = ""
        self._tool_chars = 0  # tool-phase text the tool parser was given, and in how many records
        self._tool_records = 0

    # -- one-shot ------------------------------------------------------

    def set_prompt_token_ids(self, prompt_token_ids: list[int]) -> None:
        if self.reasoning is not None:
            self.reasoning.set_prompt_token_ids(prompt_token_ids)

    def parse(
        self, text: str, enable_auto_tools: bool
    ) -> tuple[str | None, str | None, list[ToolCallOut] | None]:
        reasoning: str | None
        content: str | None
        if self.reasoning is None:
            reasoning, content = None, text
        else:
            reasoning, content = self.reasoning.extract_reasoning(text)
        calls, content = self._extract_calls(content, enable_auto_tools)
        return reasoning, content, calls

    def _extract_calls(
        self, content: str | None, enable_auto_tools: bool
    ) -> tuple[list[ToolCallOut] | None, str | None]:
        tools, request = self.tools, self.request
        if tools is None:
            return [], content
        if request.tool_choice == "none":
            if self.engine_based:
                return [], tools.extract_tool_calls(content or "", request).content
            return [], content
        forced_ok = tools.supports_required_and_named
        named = request.named_function
        required = request.tool_choice == "required"
        auto = enable_auto_tools and (
            request.tool_choice in ("auto", None) or (not forced_ok and (named is not None or required))
        )
        blank = content is None or not content.strip()
        if named is not None and forced_ok:
            if blank:
                return [], None
            return [ToolCallOut(id="", name=named, arguments=content or "")], None
        if required and forced_ok:
            parsed = parse_required_array(content or "") or []
            return [ToolCallOut(id="", name=n, arguments=a) for n, a in parsed], None
        if auto:
            info = tools.extract_tool_calls(content if content is not None else "", request)
            if info.tools_called:
                new_content = info.content
                if new_content and new_content.strip() == "":
                    new_content = None
                return list(info.calls), new_content
            if (required or named is not None) and blank:
                return [], None
            if self.engine_based:
                return None, info.content or None
            return None, content
        return [], content

    # -- streaming -----------------------------------------------------

    def parse_delta(
        self,
        delta_text: str,
        delta_ids: list[int],
        prompt_token_ids: list[int] | None,
        finished: bool,
    ) -> DeltaOut | None:
        reasoning = self.reasoning
        if not self._prompt_checked and prompt_token_ids is not None:
            self._prompt_checked = True
            self.set_prompt_token_ids(prompt_token_ids)
            if reasoning is None or reasoning.is_reasoning_end(prompt_token_ids):
                self._reasoning_ended = True
            else:
                reasoning.adjust_initial_state_from_prompt(prompt_token_ids)

        current_ids = delta_ids
        delta: DeltaOut | None = None
        transitioned = False
        text = delta_text

        if reasoning is not None and (not self._reasoning_ended or self._reasoning_streams_all):
            delta = reasoning.stream(delta_text, delta_ids)
            if reasoning.ended_in_stream(delta_ids) and not self._reasoning_streams_all:
                self._reasoning_ended = True
                transitioned = True
                current_ids = reasoning.content_ids(delta_ids)
                flushed = reasoning.finish_stream() if reasoning.engine_based else None
                text = ((delta.content if delta else None) or "") + (
                    (flushed.content if flushed else None) or ""
                )
                if self.engine_based:
                    if self.tools is not None:
                        if delta:
                            delta.content = None
                    elif text:
                        if delta is None:
                            delta = DeltaOut()
                        delta.content = text

        if self.tools is not None and self._reasoning_ended:
            carried_reasoning = delta.reasoning if delta else None
            delta = self._tool_step(text, current_ids)
            if carried_reasoning:
                if delta is None:
                    delta = DeltaOut(reasoning=carried_reasoning)
                elif not delta.reasoning:
                    delta.reasoning = carried_reasoning

        in_reasoning = reasoning is not None and (not self._reasoning_ended or self._reasoning_streams_all)
        in_tools = self.tools is not None and self._reasoning_ended
        if delta is None and not transitioned and not in_reasoning and not in_tools:
            delta = DeltaOut(content=text)

        if finished:
            delta = self._finalize(delta)
        if self.reread_window and self.tools is not None:
            self._check_budget(self.tools)

        if delta is not None and not self.request.include_reasoning:
            delta.reasoning = None
            if not delta.content and not delta.tool_calls:
                delta = None
        return delta

    def _check_budget(self, tools: ToolParser) -> None:
        reread = tools.reread_chars()
        allowed = REREAD_TEXT_FACTOR * self._tool_chars + self.reread_window * self._tool_records
        if reread > allowed:
            raise ParseBudgetExceededError(
                f"the tool parser re-read {reread} characters of {self._tool_chars} characters of "
                f"tool-call text in {self._tool_records} records, past the parse budget of "
                f"{REREAD_TEXT_FACTOR}x the text plus {self.reread_window} per record; vLLM re-reads "
                "output shaped so at every record, so the request is failed to bound its cost"
            )

    def _tool_step(self, text: str, ids: list[int]) -> DeltaOut | None:
        tools, request = self.tools, self.request
        assert tools is not None
        self._tool_chars += len(text)
        self._tool_records += 1
        forced_ok = tools.supports_required_and_named
        if request.tool_choice == "none":
            if self.engine_based:
                result = tools.stream(text, ids, request)
                if result:
                    result.tool_calls = []
                return result
            return DeltaOut(content=text) if text else None
        named = request.named_function
        if forced_ok and named is not None:
            result, self._name_returned = named_stream_delta(text, named, self._name_returned)
            return result
        if forced_ok and request.tool_choice == "required":
            previous = self._tool_text
            self._tool_text += text
            result, self._name_returned = required_stream_delta(previous, self._tool_text)
            return result
        return tools.stream(text, ids, request)

    def _finalize(self, delta: DeltaOut | None) -> DeltaOut | None:
        # Arguments parsed but not yet streamed ride on the last call delta.
        if self.tools is not None and delta and delta.tool_calls:
            last = delta.tool_calls[-1]
            if last.function is not None:
                remaining = self.tools.remaining_unstreamed_args()
                last.function.arguments = (last.function.arguments or "") + remaining
        for parser in (self.reasoning, self.tools):
            if parser is None or not parser.engine_based:
                continue
            if parser is self.reasoning and self._reasoning_ended and not self._reasoning_streams_all:
                continue  # its leftovers belong to markup the tool phase consumed
            flushed = parser.finish_stream()
            if flushed is None:
                continue
            if delta is None:
                delta = flushed
                continue
            if flushed.content:
                delta.content = (delta.content or "") + flushed.content
            if flushed.reasoning:
                delta.reasoning = (delta.reasoning or "") + flushed.reasoning
            if flushed.tool_calls:
                delta.tool_calls = delta.tool_calls + flushed.tool_calls
        if self.reasoning is not None and not self._reasoning_ended:
            promoted = self.reasoning.fallback_content()
            if promoted:
                if delta is None:
                    delta = DeltaOut()
                delta.content = (delta.content or "") + promoted
        return delta
