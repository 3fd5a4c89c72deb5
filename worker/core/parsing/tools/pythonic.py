"""``pythonic``: vLLM's ``PythonicToolParser`` (``[name(arg=value, ...), ...]``).

Llama 3.2 / Llama 4 style calls written as a Python list of calls, read with
``ast`` only (see :mod:`._pythonic_common`). One-shot: the whole output must
be such a list or it stays content. Streaming: output that does not start
with ``[`` streams as content; otherwise each call streams its name and
arguments together once they parse, then argument growth, holding back the
closers a completion of the partial text invented. No structural tag, so
``required``/named choices use vLLM's generic JSON handling.
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.core.parsing.base import ToolParser
from worker.core.parsing.tools._pythonic_common import PYTHONIC_REREAD_WINDOW, PythonicStream, extract_calls
from worker.core.parsing.types import DeltaOut, ExtractedCalls, ParseRequest


class PythonicToolParser(ToolParser):
    reread_window = PYTHONIC_REREAD_WINDOW

    def setup(self) -> None:
        self._started = False  # seen any text (decides content vs calls for good)
        self._calls: PythonicStream | None = None

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        calls = extract_calls(text)
        if calls is None:
            return ExtractedCalls(False, [], text)
        return ExtractedCalls(True, calls, None)

    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        if not self._started and delta_text:
            self._started = True
            if delta_text.startswith("["):
                self._calls = PythonicStream()
        if self._calls is None:
            return DeltaOut(content=delta_text)
        return self._calls.step(delta_text)

    def remaining_unstreamed_args(self) -> str:
        return self._calls.remaining_args() if self._calls is not None else ""

    def reread_chars(self) -> int:
        return self._calls.scanned if self._calls is not None else 0
