"""``hermes``: vLLM's ``Hermes2ProToolParser`` (``<tool_call>{json}</tool_call>``).

Streaming: text before the first ``<tool_call>`` is content (a partial tag is
held back); nothing after the first tag is ever content again. Each call
streams its name once (with a fresh id) and then the raw text after
``"arguments":`` as it grows; a complete call's closing brace is not
streamed. A call whose name never appears blocks all later calls.
One-shot: every region must be JSON with ``name`` and ``arguments`` or the
whole output stays content. Hermes has a structural tag, so with strict tool
calling ``required``/named choices are parsed like ``auto``.

vLLM re-reads the open call whole at every record (finds its end tag, strips it,
searches its name and arguments, parses it as JSON). Here :class:`_OpenBody` reads
each character of an open call once and answers the same questions; the whole
re-read stays as the reference (``incremental = False``) and for calls nested
``_DEEP_AT`` levels deep or more, where json's ``RecursionError`` may decide.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from worker.core.parsing.base import ToolParser
from worker.core.parsing.deltas import args_delta, name_delta
from worker.core.parsing.ids import random_tool_call_id
from worker.core.parsing.tools._json_document import JsonDocument
from worker.core.parsing.tools._partial_json import is_json
from worker.core.parsing.types import (
    DeltaOut,
    ExtractedCalls,
    ParseRequest,
    ToolCallDeltaOut,
    ToolCallOut,
)


def partial_tag_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ends ``text``."""
    # Such a prefix starts with the tag's first character: try those in the window, leftmost first.
    at = text.find(tag[0], max(0, len(text) - len(tag) + 1))
    while at >= 0:
        if tag.startswith(text[at:]):
            return len(text) - at
        at = text.find(tag[0], at + 1)
    return 0


START = "<tool_call>"
END = "</tool_call>"
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_NAME_RE = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGS_RE = re.compile(r'"arguments"\s*:\s*')


_SHALLOW = 200  # brackets: far below the nesting at which json's parse raises RecursionError
#: Nesting from which the open call is parsed whole (json's RecursionError may decide there).
_DEEP_AT = _SHALLOW
_BLANK_RUN = re.compile(r"\s*")  # what the patterns' \s* take


def _is_json(text: str, shallow: bool = False) -> bool:
    """Whether stripped ``text`` is one JSON document (``RecursionError`` past json's nesting limit,
    as vLLM's parse raises it: see ``stream``). ``shallow``: it holds fewer than ``_SHALLOW``
    brackets."""
    if text[0] == "{" and text[-1] != "}" and shallow:
        # An object ends with its brace, so this open call's body cannot be one yet; too few
        # brackets to reach the nesting limit, so the parse could not raise either.
        return False
    return is_json(text)


class _Call:
    __slots__ = ("name", "streamed")

    def __init__(self) -> None:
        self.name: str | None = None
        self.streamed = 0  # length of the arguments text sent


class _KeyFinder:
    r"""The first ``"key"\s*:`` in a growing text, as ``re.search`` finds it (with
    ``string_value``: ``"key"\s*:\s*"([^"]+)"``, hermes's name), each character looked at a
    bounded number of times. While a candidate runs to the end of the text no later one can
    match, so the search waits on it. Positions are relative to ``base``."""

    __slots__ = ("_at", "_literal", "_pos", "_resume", "_stage", "_string_value", "end", "value_start")

    def __init__(self, key: str, string_value: bool) -> None:
        self._literal = f'"{key}"'
        self._string_value = string_value
        self._pos = 0  # no match starts before this
        self._at = -1  # the candidate in progress
        self._stage = 0  # 0: blanks then ":", 1: blanks then '"', 2: the value up to '"'
        self._resume = 0  # where the candidate's scan goes on
        self.value_start = -1
        self.end = -1  # the match's end (after ":", or after the value's closing quote)

    def search(self, text: str, base: int, end: int) -> None:
        """Go on over ``text[base:end]`` (``end`` absolute)."""
        while self.end < 0:
            if self._at < 0:
                hit = text.find(self._literal, base + self._pos, end)
                if hit < 0:
                    self._pos = max(self._pos, end - base - len(self._literal) + 1)
                    return
                self._at, self._stage = hit - base, 0
                self._resume = self._at + len(self._literal)
            pos = base + self._resume
            if self._stage == 2:
                close = text.find('"', pos, end)
                if close < 0:
                    self._resume = end - base
                    return
                if close - base > self.value_start:
                    self.end = close + 1 - base
                else:
                    self._fail()  # "" is no name
                continue
            blanks = _BLANK_RUN.match(text, pos, end)
            assert blanks is not None
            pos = blanks.end()
            if pos == end:
                self._resume = pos - base
                return
            if text[pos] != (":" if self._stage == 0 else '"'):
                self._fail()
                continue
            self._resume = pos + 1 - base
            if not self._string_value:
                self.end = self._resume
            elif self._stage == 1:
                self.value_start = self._resume
            self._stage += 1

    def _fail(self) -> None:
        self._pos, self._at = self._at + 1, -1


class _OpenBody:
    """What hermes asks of an open call's body at every record, each character read once:
    where its blanks end on either side, its name, where its arguments start, whether it is
    one JSON document. Positions are relative to the body's start (the tail is cut between
    records)."""

    __slots__ = (
        "_complete",
        "_doc_fed",
        "_raw",
        "args",
        "args_start",
        "doc",
        "index",
        "lead",
        "name",
        "rend",
        "searched",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.searched = 0  # raw characters searched for the end tag
        self._raw = 0  # raw characters taken
        self.lead = -1  # the first non-blank
        self.rend = 0  # the end of the last non-blank: the stripped body is raw[lead:rend]
        self.doc = JsonDocument(_DEEP_AT)
        self._doc_fed = 0
        self.name = _KeyFinder("name", True)
        self.args = _KeyFinder("arguments", False)
        self.args_start = -1  # the arguments' first non-blank
        self._complete: tuple[int, int] = (-1, 0)  # (rend, arguments' length) once complete

    def take(self, text: str, base: int, avail: int) -> None:
        """Read the raw body up to ``avail`` (relative; a partial end tag after it is held)."""
        if avail > self._raw:
            piece = text[base + self._raw : base + avail]
            kept = len(piece.rstrip())
            if kept:
                if self.lead < 0:
                    self.lead = self._doc_fed = self._raw + len(piece) - len(piece.lstrip())
                self.rend = self._raw + kept
            self._raw = avail
        if self.lead < 0:
            return
        self.doc.feed(text, base + self._doc_fed, base + self.rend)
        self._doc_fed = self.rend
        if self.name.end < 0:
            self.name.search(text, base, base + avail)
        if self.args_start < 0:
            self.args.search(text, base, base + avail)
            if self.args.end >= 0:
                after = _BLANK_RUN.match(text, base + self.args.end, base + avail)
                assert after is not None
                if after.end() < base + avail:
                    self.args_start = after.end() - base
                else:
                    self.args.end = after.end() - base  # blanks so far: go on from there

    def args_length(self, text: str, base: int) -> int:
        """The length of the arguments text vLLM would send now: to the body's end, or once the
        body is one JSON document, without its last closing brace and the blanks before it."""
        if self.args_start < 0:
            return 0
        if not self.doc.complete:
            return self.rend - self.args_start
        if self._complete[0] != self.rend:
            end = self.rend
            if text[base + end - 1] == "}":
                end -= 1
                while end > self.args_start and text[base + end - 1].isspace():
                    end -= 1
            self._complete = (self.rend, end - self.args_start)
        return self._complete[1]


class HermesToolParser(ToolParser):
    supports_required_and_named = False
    #: False: re-read the open call whole at every record, as vLLM does (the tests' reference).
    incremental = True

    def setup(self) -> None:
        self._in_calls = False  # first <tool_call> seen: content is over
        self._held = ""  # content tail that may be a partial <tool_call>
        self._tail = ""  # text from the current call region (or search point) on
        self._brackets = (0, 0)  # the tail's { and [ up to an index: counted once per character
        self._calls: list[_Call] = []
        self._closed = 0  # regions already final
        self._open: _OpenBody | None = None  # the open call's body, read so far
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
            tail, self._tail = self._tail, ""
            tail += delta_text  # CPython appends in place to a string only this name holds
            self._tail = tail
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

    def _saved(self) -> tuple[str, int, list[tuple[str | None, int]]]:
        """What ``_scan_calls`` may change: the tail, the closed count and the open calls."""
        return self._tail, self._closed, [(c.name, c.streamed) for c in self._calls[self._closed :]]

    def _restore(self, saved: tuple[str, int, list[tuple[str | None, int]]]) -> None:
        self._tail, self._closed, calls = saved
        self._brackets = (0, 0)
        # _open stays: its positions are from its body's start, which the restored tail holds
        # unchanged (the same text, before this record's cuts).
        del self._calls[self._closed :]
        for name, streamed in calls:
            call = _Call()
            call.name, call.streamed = name, streamed
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
            base = start + len(START)
            index = self._closed
            opened = self._open if self._open is not None and self._open.index == index else None
            end = self._tail.find(END, base + max(0, opened.searched - len(END) + 1) if opened else base)
            if end >= 0:
                if opened is not None:
                    self._open = None
                self._reread += end - base
                named = self._update_call(index, self._tail[base:end].strip(), True, deltas)
            else:
                # A partial end tag never reaches back into the start tag (no ">" in it).
                avail = len(self._tail) - base - partial_tag_overlap(self._tail, END)
                if self.incremental and opened is None:
                    opened = self._open = _OpenBody(index)
                if opened is not None:
                    opened.searched = len(self._tail) - base
                    opened.take(self._tail, base, avail)
                if opened is not None and not opened.doc.deep:
                    named = self._update_open(index, opened, base, deltas)
                else:
                    self._reread += avail
                    body = self._tail[base : base + avail].strip()
                    complete = _is_json(body, self._shallow()) if body else False
                    named = self._update_call(index, body, complete, deltas)
            if not named:
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

    def _call(self, index: int) -> _Call:
        if index >= len(self._calls):
            self._calls.append(_Call())
        return self._calls[index]

    def _update_open(self, index: int, body: _OpenBody, base: int, deltas: list[ToolCallDeltaOut]) -> bool:
        """``_update_call`` for an open call from what ``body`` read."""
        call = self._call(index)
        if call.name is None:
            if body.name.end < 0:
                return False
            call.name = self._tail[base + body.name.value_start : base + body.name.end - 1]
            deltas.append(name_delta(index, call.name))
        size = body.args_length(self._tail, base)
        if size > call.streamed:
            start = base + body.args_start
            deltas.append(args_delta(index, self._tail[start + call.streamed : start + size]))
            call.streamed = size
        return True

    def _update_call(self, index: int, body: str, complete: bool, deltas: list[ToolCallDeltaOut]) -> bool:
        call = self._call(index)
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
            if len(args) > call.streamed:
                deltas.append(args_delta(index, args[call.streamed :]))
                call.streamed = len(args)
        return True

    def remaining_unstreamed_args(self) -> str:
        # vLLM compares the last call's arguments with what it sent: they are the same text
        # once any was sent, and "{}" is due when none was.
        if not self._calls:
            return ""
        return "" if self._calls[-1].streamed else "{}"
