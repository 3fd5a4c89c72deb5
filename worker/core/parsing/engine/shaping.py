"""The parser engine's output shaping, shared by the reasoning and the tool adapters.

vLLM's ``ParserEngine._events_to_delta`` and ``_strip_trailing_reasoning``
(vllm/parser/engine/parser_engine.py): content held after tool events and
whitespace-only content held until something else shows; trailing reasoning
whitespace held until more reasoning follows.
"""

from __future__ import annotations

from worker.core.parsing.types import DeltaOut


class ContentHold:
    """The parser engine's content shaping, shared by the reasoning and the tool adapters.

    ``held`` is content not sent yet: text that followed a tool event in its
    record (the tool adapters add it themselves) and, until non-whitespace
    content has been sent, whitespace-only content, which waits for what
    follows (or is dropped once tool calls exist, where the config says so).
    """

    __slots__ = ("held", "seen_text")

    def __init__(self) -> None:
        self.held = ""
        self.seen_text = False  # non-whitespace content sent

    def take(
        self,
        parts: list[str],
        carried: str,
        *,
        release: bool,
        calls_exist: bool = False,
        drop_ws_with_calls: bool = True,
        finished: bool,
    ) -> str:
        """This record's content from its text ``parts``.

        ``carried`` is what was held when the record began; with ``release``
        held text goes out now: the carried part first, text held during
        this record last.
        """
        if self.held and release:
            fresh = self.held[len(carried) :]
            if carried:
                parts.insert(0, carried)
            if fresh:
                parts.append(fresh)
            self.held = ""
        text = "".join(parts)
        if not self.seen_text and text:
            if text.strip():
                self.seen_text = True
            elif calls_exist:
                if drop_ws_with_calls:
                    text = ""
            elif not finished:
                self.held = text
                text = ""
        return text


def hold_trailing_reasoning_ws(
    delta: DeltaOut | None, held: str, *, reasoning_ended: bool
) -> tuple[DeltaOut | None, str]:
    """The parser engine's output shaping: trailing reasoning whitespace waits for more reasoning.

    ``held`` is the whitespace held so far; returns the delta to send (None
    when nothing is left of it) and the whitespace now held. Held whitespace
    is dropped by a delta without reasoning once ``reasoning_ended``.
    """
    if delta is not None and delta.reasoning is not None:
        combined = held + delta.reasoning
        trimmed = combined.rstrip()
        held = combined[len(trimmed) :]
        delta.reasoning = trimmed or None
        if delta.reasoning is None and delta.content is None and not delta.tool_calls:
            return None, held
    elif held and reasoning_ended:
        held = ""
    return delta, held
