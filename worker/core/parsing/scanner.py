"""Split a record's text at marker tokens recognised by id.

Markers that are single tokens are recognised by token id in streaming (text
that merely spells them stays text). The record's text is cut where those
tokens' texts sit; a marker whose text has not arrived yet (held back by the
detokenizer) waits for a later record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from worker.core.parsing.types import ParserTokenizer

DROP = "__drop__"


@dataclass(frozen=True)
class IdMarker:
    name: str
    text: str


Item = str | IdMarker


class IdScanner:
    def __init__(self, tokenizer: ParserTokenizer, id_markers: dict[int, str]) -> None:
        self._tokenizer = tokenizer
        self._id_markers = id_markers
        self._texts: dict[int, str] = {}
        self._pending: list[IdMarker] = []
        self._pending_text = ""

    def reset(self) -> None:
        self._pending = []
        self._pending_text = ""

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def _text_of(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text

    def scan(self, text: str, ids: Sequence[int]) -> list[Item]:
        items: list[Item] = []
        if self._pending:
            items, text = self._resolve_pending(text)
        if not any(i in self._id_markers for i in ids):
            if text:
                items.append(text)
            return items
        pieces: list[Item] = []
        run: list[str] = []
        for token_id in ids:
            name = self._id_markers.get(token_id)
            if name is None:
                run.append(self._text_of(token_id))
                continue
            if run:
                joined = "".join(run)
                if joined:
                    pieces.append(joined)
                run = []
            pieces.append(IdMarker(name, self._text_of(token_id)))
        if run and (joined := "".join(run)):
            pieces.append(joined)
        if not text:
            # Nothing decoded yet: markers wait for their text to arrive.
            self._pending.extend(p for p in pieces if isinstance(p, IdMarker))
            return items
        return items + self._align(text, pieces)

    def flush(self) -> list[Item]:
        items: list[Item] = []
        if self._pending_text:
            items.append(self._pending_text)
            self._pending_text = ""
        items.extend(self._pending)
        self._pending = []
        return items

    def _resolve_pending(self, text: str) -> tuple[list[Item], str]:
        waiting, self._pending = self._pending, []
        rest = self._pending_text + text
        self._pending_text = ""
        items: list[Item] = []
        for marker in waiting:
            pos = rest.find(marker.text)
            if pos >= 0:
                if pos:
                    items.append(rest[:pos])
                items.append(marker)
                rest = rest[pos + len(marker.text) :]
            else:
                # Only the marker gives a reliable cut: hold the text until it shows.
                self._pending_text += rest
                rest = ""
                self._pending.append(marker)
        return items, rest

    def _align(self, text: str, pieces: list[Item]) -> list[Item]:
        joined = "".join(p.text if isinstance(p, IdMarker) else p for p in pieces)
        if joined:
            pos = text.find(joined)
            if pos == 0:
                return pieces
            if pos > 0:
                return [text[:pos], *pieces]
        # Per-token decoding differs from the record's text (byte fallback,
        # held-back text): cut at the markers' rightmost positions instead.
        markers = [p for p in pieces if isinstance(p, IdMarker)]
        positions = [-1] * len(markers)
        limit = len(text)
        for k in range(len(markers) - 1, -1, -1):
            pos = text.rfind(markers[k].text, 0, limit)
            if pos >= 0:
                positions[k] = pos
                limit = pos
        out: list[Item] = []
        used = 0
        for k, marker in enumerate(markers):
            pos = positions[k]
            if pos >= used:
                if pos > used:
                    out.append(text[used:pos])
                out.append(marker)
                used = pos + len(marker.text)
                continue
            later_found = any(p >= 0 for p in positions[k + 1 :])
            if not later_found and used < len(text) and marker.name != DROP:
                self._pending_text += text[used:]
                used = len(text)
            self._pending.append(marker)
        if used < len(text):
            out.append(text[used:])
        return out
