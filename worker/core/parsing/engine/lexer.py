"""Incremental marker lexer with hold-back of partial markers.

Same observable behaviour as vLLM's parser-engine lexer: text that could still
grow into a marker stays buffered until the next feed proves otherwise (or the
stream ends); everything else comes out at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: Lexed pieces: ``(marker_name, text)``; ``marker_name`` None for plain text.
Piece = tuple[str | None, str]


class MarkerLexer:
    def __init__(self, markers: Iterable[tuple[str, str]]) -> None:
        self._by_first: dict[str, list[tuple[str, str]]] = {}
        #: each literal's first name: the longest literal matching at a position is found in C
        self._names: dict[str, str] = {}
        prefixes: set[str] = set()
        for name, literal in markers:
            if not literal:
                continue
            self._by_first.setdefault(literal[0], []).append((literal, name))
            self._names.setdefault(literal, name)
            prefixes.update(literal[:i] for i in range(1, len(literal)))
        self._literals = list(self._names)
        self._prefixes = frozenset(prefixes)
        self._first_chars = frozenset(self._by_first)
        self._longest = max(map(len, self._literals), default=0)
        by_length = sorted(self._literals, key=len, reverse=True)
        self._longest_at = re.compile("|".join(map(re.escape, by_length)) or "(?!)").match
        self._starts = re.compile(
            "[" + "".join(map(re.escape, sorted(self._first_chars))) + "]" if self._first_chars else "(?!)"
        )
        self.buffer = ""

    def reset(self) -> None:
        self.buffer = ""

    def feed(self, text: str) -> list[Piece]:
        if not self.buffer and self._first_chars.isdisjoint(text):
            return [(None, text)] if text else []
        self.buffer += text
        return self._drain(final=False)

    def flush(self) -> list[Piece]:
        pieces = self._drain(final=True) if self.buffer else []
        if self.buffer:
            pieces.append((None, self.buffer))
            self.buffer = ""
        return pieces

    def _drain(self, *, final: bool) -> list[Piece]:
        # One pass over the buffer by index: slicing off the rest after every piece made a record
        # with many markers quadratic (each marker copied everything after it).
        out: list[Piece] = []
        buf = self.buffer
        size = len(buf)
        pos = 0
        while pos < size:
            if self._next_start(buf, pos) == size:  # no marker can start in the rest
                out.append((None, buf[pos:]))
                pos = size
                break
            candidates = self._by_first.get(buf[pos], ())
            found = self._longest_at(buf, pos)
            best = (found[0], self._names[found[0]]) if found is not None else None
            # Could still become a (longer) marker: wait for more text.
            if not final and size - pos < self._longest:
                rest = buf[pos:]
                if rest in self._prefixes and (
                    best is None
                    or any(len(lit) > len(best[0]) and lit.startswith(rest) for lit, _ in candidates)
                ):
                    break
            if best is not None:
                out.append((best[1], best[0]))
                pos += len(best[0])
                continue
            end = self._content_end(buf, pos)
            out.append((None, buf[pos:end]))
            pos = end
        self.buffer = buf[pos:]
        return out

    def _next_start(self, buf: str, pos: int) -> int:
        """The first index ≥ ``pos`` holding a marker's first character (``len(buf)``: none)."""
        found = self._starts.search(buf, pos)
        return found.start() if found is not None else len(buf)

    def _content_end(self, buf: str, pos: int) -> int:
        """First index > ``pos`` where a marker (or its beginning) could start."""
        size = len(buf)
        i = pos
        while (i := self._next_start(buf, i + 1)) < size:
            rest = size - i
            for literal in self._literals:
                if buf.startswith(literal[: min(rest, len(literal))], i):
                    return i
        return size
