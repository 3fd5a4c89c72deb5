"""``hermes``: vLLM's ``Hermes2ProToolParser`` (``<tool_call>{json}</tool_call>``).

Streaming: text before the first ``<tool_call>`` is content (a partial tag is
held back); nothing after the first tag is ever content again. Each call
streams its name once (with a fresh id) and then the raw text after
``"arguments":`` as it grows; a complete call's closing brace is not
streamed. A call whose name never appears blocks all later calls.
One-shot: every region must be JSON with ``name`` and ``arguments`` or the
whole output stays content. Hermes has a structural tag, so with strict tool
calling ``required``/named choices are parsed like ``auto``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from worker.core.parsing.base import ToolParser
from worker.core.parsing.deltas import args_delta, name_delta
from worker.core.parsing.ids import random_tool_call_id
from worker.core.parsing.registry import tool_parser
from worker.core.parsing.types import (
    DeltaOut,
    ExtractedCalls,
    ParseRequest,
    ToolCallDeltaOut,
    ToolCallOut,
)


def partial_tag_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ends ``text``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


START = "<tool_call>"
END = "</tool_call>"
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_NAME_RE = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGS_RE = re.compile(r'"arguments"\s*:\s*')


_SHALLOW = 200  # brackets: far below the nesting at which json's parse raises RecursionError


def _is_json(text: str, shallow: bool = False) -> bool:
    """Whether stripped ``text`` is one JSON document (``RecursionError`` past json's nesting limit,
    as vLLM's parse raises it: see ``stream``). ``shallow``: it holds fewer than ``_SHALLOW``
    brackets."""
    if text[0] == "{" and text[-1] != "}" and shallow:
        # An object ends with its brace, so this open call's body cannot be one yet; too few
        # brackets to reach the nesting limit, so the parse could not raise either.
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class _Call:
    __slots__ = ("args", "name", "streamed")

    def __init__(self) -> None:
        self.name: str | None = None
        self.args: str | None = None  # last extracted arguments text
        self.streamed = ""


@tool_parser("hermes", "qwen3_json")
class HermesToolParser(ToolParser):
    supports_required_and_named = False

    def setup(self) -> None:
        self._in_calls = False  # first <tool_call> seen: content is over
        self._held = ""  # content tail that may be a partial <tool_call>
        self._tail = ""  # text from the current call region (or search point) on
        self._brackets = (0, 0)  # the tail's { and [ up to an index: counted once per character
        self._calls: list[_Call] = []
        self._closed = 0  # regions already final
        self._blocked = False

    # -- one-shot ------------------------------------------------------

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        if START not in text:
            return ExtractedCalls(False, [], text)
        try:
            calls: list[ToolCallOut] = []
            for closed, open_ in _CALL_RE.findall(text):
                parsed = json.loads(closed if closed else open_)
                calls.append(
                    ToolCallOut(
                        id=random_tool_call_id(),
                        name=parsed["name"],
                        arguments=json.dumps(parsed["arguments"], ensure_ascii=False),
                    )
                )
        except Exception:  # noqa: BLE001 - vLLM: any failure keeps the whole output as content
            return ExtractedCalls(False, [], text)
        content = text[: text.find(START)]
        return ExtractedCalls(True, calls, content or None)

    # -- streaming -----------------------------------------------------

    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        content: str | None = None
        if not self._in_calls:
            text = self._held + delta_text
            pos = text.find(START)
            if pos < 0:
                keep = partial_tag_overlap(text, START)
                content, self._held = text[: len(text) - keep], text[len(text) - keep :]
            else:
                content, self._held = text[:pos], ""
                self._in_calls = True
                self._tail = text[pos:]
                self._brackets = (0, 0)
            content = content or None
        else:
            self._tail += delta_text
        deltas: list[ToolCallDeltaOut] = []
        if self._in_calls and not self._blocked:
            saved = self._saved()
            try:
                deltas = self._scan_calls()
            except RecursionError:
                # An open call nested past what Python's json reads: vLLM's hermes swallows the
                # failure, so the record sends nothing (its content included) and no call moves.
                self._restore(saved)
                return None
        if content or deltas:
            return DeltaOut(content=content, tool_calls=deltas)
        return None

    def _saved(self) -> tuple[str, int, list[tuple[str | None, str | None, str]]]:
        """What ``_scan_calls`` may change: the tail, the closed count and the open calls."""
        return self._tail, self._closed, [(c.name, c.args, c.streamed) for c in self._calls[self._closed :]]

    def _restore(self, saved: tuple[str, int, list[tuple[str | None, str | None, str]]]) -> None:
        self._tail, self._closed, calls = saved
        self._brackets = (0, 0)
        del self._calls[self._closed :]
        for name, args, streamed in calls:
            call = _Call()
            call.name, call.args, call.streamed = name, args, streamed
            self._calls.append(call)

    def _scan_calls(self) -> list[ToolCallDeltaOut]:
        deltas: list[ToolCallDeltaOut] = []
        while True:
            start = self._tail.find(START)
            if start < 0:
                # Between regions: only a partial start tag matters later.
                keep = partial_tag_overlap(self._tail, START)
                self._tail = self._tail[len(self._tail) - keep :] if keep else ""
                self._brackets = (0, 0)
                return deltas
            body_start = start + len(START)
            end = self._tail.find(END, body_start)
            index = self._closed
            if end >= 0:
                body = self._tail[body_start:end].strip()
                complete = True
            else:
                raw = self._tail[body_start:]
                overlap = partial_tag_overlap(raw, END)
                if overlap:
                    raw = raw[:-overlap]
                body = raw.strip()
                complete = _is_json(body, self._shallow()) if body else False
            if not self._update_call(index, body, complete, deltas):
                if end >= 0:
                    self._blocked = True  # a closed call without a name stops everything
                self._cut(start)
                return deltas
            if end < 0:
                self._cut(start)
                return deltas
            self._closed += 1
            self._cut(end + len(END))

    def _cut(self, start: int) -> None:
        if start:
            self._tail = self._tail[start:]
            self._brackets = (0, 0)

    def _shallow(self) -> bool:
        count, upto = self._brackets
        count += self._tail.count("{", upto) + self._tail.count("[", upto)
        self._brackets = (count, len(self._tail))
        return count < _SHALLOW

    def _update_call(self, index: int, body: str, complete: bool, deltas: list[ToolCallDeltaOut]) -> bool:
        if index >= len(self._calls):
            self._calls.append(_Call())
        call = self._calls[index]
        if call.name is None:
            match = _NAME_RE.search(body)
            if not match:
                return False
            call.name = match.group(1)
            deltas.append(name_delta(index, call.name))
        args_match = _ARGS_RE.search(body)
        if args_match:
            args = body[args_match.end() :]
            if complete:
                args = args.rstrip()
                if args.endswith("}"):
                    args = args[:-1].rstrip()
            if len(args) > len(call.streamed):
                diff = args[len(call.streamed) :]
                call.streamed = args
                call.args = args
                deltas.append(args_delta(index, diff))
        return True

    def remaining_unstreamed_args(self) -> str:
        if not self._calls:
            return ""
        call = self._calls[-1]
        expected = call.args if call.args is not None else "{}"
        if expected.startswith(call.streamed):
            return expected[len(call.streamed) :]
        return ""
