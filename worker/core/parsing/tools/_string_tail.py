"""The string a partial tool call ends in, decoded incrementally (``llama3_json`` and the pythonic parsers).

A long call is mostly one long string argument. While the text ends inside it,
the parsers' completion only changes that string: its text is kept up to the
end (less what the completion cuts: a truncated escape, trailing blanks) and
closed. Characters more than a short window behind the end are final, so they
are decoded once, up to the last whole-escape boundary, into ``stable`` (their
JSON text); each record only adds its own characters and re-reads the short
tail after ``done``.

The two families differ only in the escape rule (how long the escape at a
backslash is, and where a boundary may fall) and how a piece of the literal is
decoded; a subclass gives those two, the scan is shared.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

#: Characters behind the end that the completion may still cut or read (an
#: escape window of at most 9, a trailing backslash, the last character).
WINDOW = 12


def slice_parts(parts: Sequence[str], low: int, high: int | None = None) -> str:
    """``"".join(parts)[low:high]`` without building the whole."""
    out = []
    base = 0
    for part in parts:
        end = base + len(part)
        if low < end and (high is None or high > base):
            out.append(part[max(low - base, 0) : None if high is None else high - base])
        base = end
    return "".join(out)


class AppendOnlyText:
    """Text that grows at its end (the start of an arguments JSON), kept in pieces and sliced by offset.

    Only :meth:`truncate` cuts it back (a duplicate key; a pythonic level that closes).
    """

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.ends: list[int] = []
        self.length = 0

    def add(self, piece: str) -> None:
        if piece:
            self.parts.append(piece)
            self.length += len(piece)
            self.ends.append(self.length)

    def truncate(self, size: int) -> None:
        """Keep ``text[:size]`` (a duplicate key rewrites a member in the middle of the JSON)."""
        index = bisect_right(self.ends, size)
        base = self.ends[index - 1] if index else 0
        cut = self.parts[index][: size - base] if size > base else ""
        del self.parts[index:], self.ends[index:]
        self.length = base
        self.add(cut)

    def between(self, low: int, high: int) -> str:
        """``text[low:high]``, reading only the pieces from ``low`` on."""
        index = bisect_right(self.ends, low)
        base = self.ends[index - 1] if index else 0
        return slice_parts(self.parts[index:], low - base, high - base)


class StringTail:
    """Incremental decode of a string literal's text that starts at ``body`` and runs to the end.

    ``stable`` is the JSON text (no quotes) of the characters before ``done``,
    which no later record can change; ``valid`` is False once that text holds
    something the reader rejects (then every read of the call fails for good).
    ``scanned`` counts the characters handled, for the bounded-work tests.
    """

    def __init__(self, body: int, end: int) -> None:
        self.done = body  # start of the text not yet decoded into ``stable``
        self.end = end  # end of the text the completion keeps
        self.stable = ""
        self.valid = True
        self.scanned = 0

    def unit(self, text: str, slash: int) -> int:
        """Length of the escape at ``slash``: 0 when it cannot be known yet, -1 when malformed."""
        raise NotImplementedError

    def splits_after(self, text: str, slash: int, unit: int) -> bool:
        """Whether a boundary may fall right after this escape (JSON: not between surrogates)."""
        return True

    def decode(self, piece: str) -> str | None:
        """The JSON text of a whole-escape piece of the literal; None when the reader rejects it."""
        raise NotImplementedError

    def plain_end(self, text: str, low: int, at: int) -> int:
        """Where a piece may end in the escape-free run ``text[low:at]``: from ``low`` to ``at``."""
        return at

    def next_mark(self, text: str, pos: int, target: int) -> int:
        """Where the next escape starts in ``text[pos:target]``; -1 when none does."""
        return text.find("\\", pos, target)

    def advance(self, text: str) -> None:
        """Move ``done`` to the last whole-escape boundary before the window and decode up to it."""
        target = self.end - WINDOW
        pos = good = self.done
        if target <= pos:
            return
        self.scanned += target - pos
        while pos < target:
            slash = self.next_mark(text, pos, target)
            plain = self.plain_end(text, pos, target if slash == -1 else slash)
            if plain > pos:
                good = plain
            if slash == -1:
                break
            unit = self.unit(text, slash)
            if unit < 0:
                self.valid = False
                break
            if unit == 0 or slash + unit > target:
                break
            pos = slash + unit
            if self.splits_after(text, slash, unit):
                good = pos
        if good > self.done and self.valid:
            decoded = self.decode(text[self.done : good])
            if decoded is None:
                self.valid = False  # the completion keeps this text from now on: every read fails
            else:
                self.stable += decoded
        self.done = good

    def extend(self, text: str, end: int) -> None:
        """The text now runs to ``end``: count the new characters and decode what became final."""
        if end > self.end:
            self.scanned += end - self.end
            self.end = end
        self.advance(text)
