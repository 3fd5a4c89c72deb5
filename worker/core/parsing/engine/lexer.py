"""Incremental marker lexer with hold-back of partial markers.

Same observable behaviour as vLLM's parser-engine lexer: text that could still
grow into a marker stays buffered until the next feed proves otherwise (or the
stream ends); everything else comes out at once.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Lexed pieces: ``(marker_name, text)``; ``marker_name`` None for plain text.
Piece = tuple[str | None, str]


class MarkerLexer:
    def __init__(self, markers: Iterable[tuple[str, str]]) -> None:
        self._by_first: dict[str, list[tuple[str, str]]] = {}
        self._literals: list[str] = []
        prefixes: set[str] = set()
        for name, literal in markers:
            if not literal:
                continue
            self._by_first.setdefault(literal[0], []).append((literal, name))
            self._literals.append(literal)
            prefixes.update(literal[:i] for i in range(1, len(literal)))
        self._prefixes = frozenset(prefixes)
        self._first_chars = frozenset(self._by_first)
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
        out: list[Piece] = []
        while self.buffer:
            buf = self.buffer
            if self._first_chars.isdisjoint(buf):
                out.append((None, buf))
                self.buffer = ""
                break
            candidates = self._by_first.get(buf[0], ())
            best: tuple[str, str] | None = None
            for literal, name in candidates:
                if buf.startswith(literal) and (best is None or len(literal) > len(best[0])):
                    best = (literal, name)
            # Could still become a (longer) marker: wait for more text.
            if (
                buf in self._prefixes
                and not final
                and (
                    best is None
                    or any(len(lit) > len(best[0]) and lit.startswith(buf) for lit, _ in candidates)
                )
            ):
                break
            if best is not None:
                out.append((best[1], best[0]))
                self.buffer = buf[len(best[0]) :]
                continue
            end = self._content_end(buf)
            out.append((None, buf[:end]))
            self.buffer = buf[end:]
        return out

    def _content_end(self, buf: str) -> int:
        """First index ≥ 1 where a marker (or its beginning) could start."""
        size = len(buf)
        for i in range(1, size):
            if buf[i] not in self._first_chars:
                continue
            rest = size - i
            for literal in self._literals:
                n = min(rest, len(literal))
                if buf[i : i + n] == literal[:n]:
                    return i
        return size
