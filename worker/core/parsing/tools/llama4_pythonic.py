"""``llama4_pythonic``: vLLM's ``Llama4PythonicToolParser``.

The ``pythonic`` format, optionally wrapped as
``<|python_start|>[...]<|python_end|>``. Streaming: the output is content
until it starts with ``[`` or with the whole ``<|python_start|>`` (so a
wrapper spelled over several records streams its first pieces as content,
as vLLM does); after the wrapper, calls stream like ``pythonic``, with a
trailing ``<|python_end|>`` ignored. One-shot: a leading wrapper is removed
(and every ``<|python_end|>`` with it) before the pythonic parse.
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.core.parsing.base import ToolParser
from worker.core.parsing.tools._pythonic_common import PYTHONIC_REREAD_WINDOW, PythonicStream, extract_calls
from worker.core.parsing.types import DeltaOut, ExtractedCalls, ParseRequest

START = "<|python_start|>"
END = "<|python_end|>"


class Llama4PythonicToolParser(ToolParser):
    reread_window = PYTHONIC_REREAD_WINDOW

    def setup(self) -> None:
        self._head = ""  # text while it may still become the start wrapper
        self._decided = False
        self._calls: PythonicStream | None = None

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        source = text
        if source.startswith(START):
            source = source[len(START) :].replace(END, "")
        calls = extract_calls(source)
        if calls is None:
            return ExtractedCalls(False, [], source)  # vLLM hands back the unwrapped text
        return ExtractedCalls(True, calls, None)

    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        if self._decided:
            if self._calls is None:
                return DeltaOut(content=delta_text)
            return self._calls.step(delta_text)
        self._head += delta_text
        head = self._head
        if head.startswith("["):
            self._decided = True
            self._calls = PythonicStream(END)
            return self._calls.step(head)
        if head.startswith(START):
            self._decided = True
            self._calls = PythonicStream(END)
            return self._calls.step(head[len(START) :])
        if not START.startswith(head):
            self._decided = True  # can never become a call list
            self._head = ""
        # Not a call list (yet): vLLM streams the record as content meanwhile.
        return DeltaOut(content=delta_text)

    def remaining_unstreamed_args(self) -> str:
        return self._calls.remaining_args() if self._calls is not None else ""

    def reread_chars(self) -> int:
        return self._calls.scanned if self._calls is not None else 0
