"""Split a record's text at marker tokens recognised by id.

Markers that are single tokens are recognised by token id in streaming (text
that merely spells them stays text). The record's text is cut where those
tokens' texts sit; a marker whose text has not arrived yet (held back by the
detokenizer) waits for a later record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from worker.core.parsing.lexer import MarkerLexer, Piece
from worker.core.parsing.types import ParserTokenizer

DROP = "__drop__"


@dataclass(frozen=True)
class IdMarker:
    name: str
    text: str


Item = str | IdMarker


def engine_id_markers(
    tokenizer: ParserTokenizer, markers: Mapping[str, str], by_id: Iterable[str]
) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """The parser engine's token-id map and its extra lexer literals.

    ``by_id`` names the markers recognised by token id. Every other special
    token the grammar does not spell vanishes: it maps to :data:`DROP` by id
    and comes back as a ``(DROP, text)`` literal for the lexer.
    """
    vocab = tokenizer.get_vocab()
    id_map: dict[int, str] = {}
    for name in by_id:
        token_id = vocab.get(markers[name])
        if token_id is not None:
            id_map[token_id] = name
    configured = set(markers.values())
    drops: list[tuple[str, str]] = []
    for token_id in sorted(tokenizer.special_ids):
        text = tokenizer.id_to_token(token_id)
        if text is None or text in configured:
            continue
        id_map.setdefault(token_id, DROP)
        drops.append((DROP, text))
    return id_map, drops


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


class MarkerSplitter:
    """The engine front end of ``engine`` and ``_tool_engine``: :class:`IdScanner`, then :class:`MarkerLexer`.

    Records come out as pieces ``(marker name, text)``, name None for plain
    text (never empty). Once a record has carried ids, a marker that has a
    token id only counts when it came as that id: spelled out, it is text.
    (``_xml_engine`` keeps its own id splitter: it also counts the ids behind
    each text run, which its tool events need.)
    """

    def __init__(self, tokenizer: ParserTokenizer, markers: Mapping[str, str], by_id: Iterable[str]) -> None:
        id_map, drops = engine_id_markers(tokenizer, markers, by_id)
        #: whether special tokens outside the grammar are dropped (as :data:`DROP` markers)
        self.has_drops = bool(drops)
        self._by_id = frozenset(id_map.values())
        self._lexer = MarkerLexer([*markers.items(), *drops])
        self._scanner = IdScanner(tokenizer, id_map)
        self._had_ids = False

    def reset(self) -> None:
        self._had_ids = False
        self._lexer.reset()
        self._scanner.reset()

    def feed(self, text: str, ids: Sequence[int]) -> list[Piece]:
        if ids:
            self._had_ids = True
        out: list[Piece] = []
        for item in self._scanner.scan(text, ids):
            if isinstance(item, IdMarker):
                self._lexed(self._lexer.flush(), out)
                out.append((item.name, item.text))
            else:
                self._lexed(self._lexer.feed(item), out)
        return out

    def finish(self) -> list[Piece]:
        """Everything held back (markers waiting for their text, partial markers)."""
        out: list[Piece] = []
        for item in self._scanner.flush():
            if isinstance(item, IdMarker):
                self._lexed(self._lexer.flush(), out)
                out.append((item.name, item.text))
            elif item:
                self._lexed(self._lexer.feed(item), out)
        self._lexed(self._lexer.flush(), out)
        return out

    def _lexed(self, pieces: list[Piece], out: list[Piece]) -> None:
        for name, text in pieces:
            if name is None or (self._had_ids and name in self._by_id):
                if text:
                    out.append((None, text))
            else:
                out.append((name, text))
