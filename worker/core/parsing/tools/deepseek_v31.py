"""``deepseek_v31``: vLLM's ``DeepSeekV31ToolParser`` (a legacy, non-engine parser).

Format: ``<｜tool▁calls▁begin｜>`` then per call
``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>``, closed by
``<｜tool▁calls▁end｜>``; arguments are passed through raw (never re-serialized).

vLLM re-scans the whole output on every delta and decides what to do from the
counts of call begin/end *token ids* before and after the delta. We keep those
counts and the text since the last call-begin marker instead, which is all the
decisions read, and reproduce its quirks:

* before the calls-begin token id shows up, every record is content as is;
  afterwards a record that neither opens nor closes a call is content with the
  section markers cut out (so the markers' records stream ``""``);
* a new call is announced only when its name is complete (``<｜tool▁sep｜>``
  seen) and the announcing record streams nothing else;
* a record holding a call's end *and* the next call's begin loses the end of
  the closing call's arguments (only the new name is streamed);
* a call closed by a record streams the text up to the last ``"}`` of the
  record, or nothing when the record has no ``"}``.

One-shot: every complete begin…end call counts, content is the text before the
calls-begin marker, and the calls-begin marker alone is enough for "tools
called" (possibly with no calls). DeepSeek-V3.1 has a structural tag, so with
strict tool calling ``required``/named choices parse like ``auto``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from worker.core.parsing.base import ToolParser
from worker.core.parsing.deltas import args_delta, name_delta
from worker.core.parsing.ids import random_tool_call_id
from worker.core.parsing.types import (
    DeltaOut,
    ExtractedCalls,
    ParseRequest,
    ToolCallOut,
)
from worker.errors import ParserSetupError

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

#: vLLM's call pattern; ``find_calls`` returns what its ``findall`` does.
CALL_RE = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>([\s\S]*?)<｜tool▁call▁end｜>")
# The name runs up to the last separator of the portion's first line.
_PORTION_RE = re.compile(r"(.*)<｜tool▁sep｜>([\s\S]*)")


def _next(text: str, marker: str, start: int, last: int) -> int:
    """``text.find(marker, start)``, given ``last``, its answer for an earlier start (-2: none yet)."""
    return last if last == -1 or last >= start else text.find(marker, start)


def find_calls(text: str) -> list[tuple[str, str]]:
    """``CALL_RE.findall(text)`` in time linear in the text.

    The regex retries from every call-begin marker and, for each, scans to the
    end of the text for a call end, so output of call-begin/separator pairs
    with no call end costs it cubic time. A match at a begin marker takes the
    first separator after it, when the name before that separator has no
    newline (``.`` stops there), and then the first call end after the
    separator; with no such separator or call end no later begin marker can
    match either. The next separator, newline and call end are searched from
    ever later positions, so each search resumes where the last one found
    its answer: every character is examined once per marker.
    """
    calls: list[tuple[str, str]] = []
    sep = newline = end = -2
    begin = text.find(CALL_BEGIN)
    while begin >= 0:
        name_start = begin + len(CALL_BEGIN)
        sep = _next(text, SEP, name_start, sep)
        if sep < 0:
            break
        newline = _next(text, "\n", name_start, newline)
        if 0 <= newline < sep:
            begin = text.find(CALL_BEGIN, begin + 1)
            continue
        args_start = sep + len(SEP)
        end = _next(text, CALL_END, args_start, end)
        if end < 0:
            break
        calls.append((text[name_start:sep], text[args_start:end]))
        begin = text.find(CALL_BEGIN, end + len(CALL_END))
    return calls


def _after_last(text: str, marker: str) -> str:
    pos = text.rfind(marker)
    return text if pos < 0 else text[pos + len(marker) :]


class DeepSeekV31ToolParser(ToolParser):
    supports_required_and_named = False

    def setup(self) -> None:
        tokenizer = self.tokenizer
        vocab = tokenizer.get_vocab()
        self._calls_begin_id = vocab.get(CALLS_BEGIN)
        self._calls_end_id = vocab.get(CALLS_END)
        if self._calls_begin_id is None or self._calls_end_id is None:
            raise ParserSetupError("the tokenizer has no DeepSeek-V3.1 tool call start/end tokens")
        self._call_begin_id = vocab.get(CALL_BEGIN)
        self._call_end_id = vocab.get(CALL_END)
        self._section_seen = False  # calls-begin id seen in the output ids
        self._begins = 0  # call begin / end ids seen so far
        self._ends = 0
        # Text of the output after its last call-begin marker (all of it before one).
        self._tail = ""
        self._portion: tuple[str, str] | None = None  # parse of ``_tail`` while ``_portion_ok``
        self._portion_ok = False
        self._tool_id = -1
        self._name_sent = False
        self._prev_args: list[str] = []  # last parsed arguments per call
        self._streamed: list[str] = []  # arguments streamed per call

    # -- one-shot ------------------------------------------------------

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        if CALLS_BEGIN not in text:
            return ExtractedCalls(False, [], text)
        calls = [
            ToolCallOut(id=random_tool_call_id(), name=name, arguments=args)
            for name, args in find_calls(text)
        ]
        content = text[: text.find(CALLS_BEGIN)]
        return ExtractedCalls(True, calls, content or None)

    # -- streaming -----------------------------------------------------

    def _advance_tail(self, delta_text: str) -> None:
        # Only the last len(marker)-1 characters of the old tail can start a marker.
        keep = len(CALL_BEGIN) - 1
        head = self._tail[:-keep] if len(self._tail) > keep else ""
        window = self._tail[len(head) :] + delta_text
        pos = window.rfind(CALL_BEGIN)
        if pos >= 0:
            self._tail = window[pos + len(CALL_BEGIN) :]
            self._portion_ok = False
            return
        old_len = len(self._tail)
        self._tail = head + window
        # The portion regex only changes its answer when a new separator shows
        # up; otherwise the arguments just grow by the new text.
        if self._portion_ok and SEP not in self._tail[max(0, old_len - len(SEP) + 1) :]:
            if self._portion is not None:
                self._portion = (self._portion[0], self._portion[1] + self._tail[old_len:])
        else:
            self._portion_ok = False

    def _parse_portion(self, portion: str) -> tuple[str, str] | None:
        """``(name, arguments)`` of the text after the last call-begin marker, cached for the tail."""
        if portion is not self._tail:
            match = _PORTION_RE.match(portion)
            return (match.group(1), match.group(2)) if match else None
        if not self._portion_ok:
            match = _PORTION_RE.match(portion)
            self._portion = (match.group(1), match.group(2)) if match else None
            self._portion_ok = True
        return self._portion

    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        prev_begins, prev_ends = self._begins, self._ends
        for token_id in delta_ids:
            if token_id == self._call_begin_id:
                self._begins += 1
            elif token_id == self._call_end_id:
                self._ends += 1
            elif token_id == self._calls_begin_id:
                self._section_seen = True
        self._advance_tail(delta_text)
        if not self._section_seen:
            return DeltaOut(content=delta_text)
        delta = delta_text.replace(CALLS_BEGIN, "").replace(CALLS_END, "")
        try:
            return self._step(delta, len(delta_ids), prev_begins, prev_ends)
        except IndexError:
            # vLLM indexes its per-call lists with the same (possibly stale or -1)
            # call index and swallows the error: the record streams nothing.
            return None

    def _step(self, delta: str, n_ids: int, prev_begins: int, prev_ends: int) -> DeltaOut | None:
        begins, ends = self._begins, self._ends
        if begins == ends and prev_ends == ends and CALL_END not in delta:
            return DeltaOut(content=delta)
        portion: str | None = None
        text_portion: str | None = None
        if CALL_END in delta:
            # vLLM joins the record's text twice here; only the part after the
            # last call-begin marker matters, which is the tail plus the record.
            portion = _after_last(self._tail + delta, CALL_BEGIN).split(CALL_END)[0].rstrip()
            delta = delta.split(CALL_END)[0].rstrip()
            text_portion = delta.lstrip()
        if begins > ends and begins > prev_begins:
            portion = self._tail if n_ids > 1 else None
            text_portion = None
            self._tool_id += 1
            self._name_sent = False
            self._streamed.append("")
        elif begins > ends and begins == prev_begins:
            portion = self._tail
            text_portion = None
        elif begins == ends and ends >= prev_ends:
            if not self._prev_args:
                return None
            if self._prev_args[self._tool_id]:
                end = delta.rfind('"}')
                if end < 0:
                    return None
                diff = delta[:end] + '"}'
                self._streamed[self._tool_id] += diff
                return self._args_delta(diff)
        else:
            return DeltaOut(content=delta.replace(CALL_BEGIN, "").replace(CALL_END, ""))

        name: str | None = None
        args: str | None = None
        if portion:
            parsed = self._parse_portion(portion)
            if parsed is None:
                return None
            name, args = parsed
        if not self._name_sent:
            if not name:
                return None
            self._name_sent = True
            return DeltaOut(tool_calls=[name_delta(self._tool_id, name)])
        if portion is None:
            return DeltaOut(content=delta) if text_portion is not None else None
        if len(self._prev_args) <= self._tool_id:
            self._prev_args.append("")
        prev = self._prev_args[self._tool_id]
        cur = args or ""
        out: DeltaOut | None = None
        if cur and not prev:
            out = self._args_delta(cur)
            self._streamed[self._tool_id] = cur
        elif cur and prev and len(cur) > len(prev) and cur.startswith(prev):
            out = self._args_delta(cur[len(prev) :])
            self._streamed[self._tool_id] = cur
        if self._tool_id == len(self._prev_args) - 1:
            self._prev_args[self._tool_id] = cur
        else:
            self._prev_args.append(cur)
        return out

    def _args_delta(self, text: str) -> DeltaOut:
        return DeltaOut(tool_calls=[args_delta(self._tool_id, text)])

    def remaining_unstreamed_args(self) -> str:
        if not self._prev_args:
            return ""
        index = len(self._prev_args) - 1
        expected = self._prev_args[index]
        actual = self._streamed[index] if index < len(self._streamed) else ""
        return expected[len(actual) :] if expected.startswith(actual) else ""
