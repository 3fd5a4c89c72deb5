"""The engine's first stage (vLLM's ``TokenIDScanner``): cut a record's text at marker tokens found by id.

Markers that are single tokens are recognised by token id in streaming (text
that merely spells them stays text). The record's text is cut where those
tokens' texts sit; a marker whose text has not arrived yet (held back by the
detokenizer) waits for a later record, and so does the text after it. Each
text run carries the number of ids behind it: ids whose text has not shown yet
still make an (empty) event, which can announce a tool call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from worker.core.parsing.tokenizer import check_token_id_range
from worker.core.parsing.types import ParserTokenizer

DROP = "__drop__"


@dataclass(slots=True)
class Text:
    text: str
    count: int = 0  # token ids behind the text (a bare count still makes an empty event)


@dataclass(slots=True)
class Mark:
    name: str
    text: str


Item = Text | Mark


def engine_id_markers(
    tokenizer: ParserTokenizer, markers: Mapping[str, str], by_id: Iterable[str]
) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """The parser engine's token-id map and its extra lexer literals.

    ``by_id`` names the markers recognised by token id. Every other special
    token the config does not spell vanishes: it maps to :data:`DROP` by id
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


class TokenIdScanner:
    def __init__(self, tokenizer: ParserTokenizer, id_map: dict[int, str]) -> None:
        self._tokenizer = tokenizer
        self._id_map = id_map
        self._texts: dict[int, str] = {}
        self.reset()

    def reset(self) -> None:
        self.deferred: list[Mark] = []
        self._deferred_counts: list[int] = []
        self._trailing = 0
        self._post_text = ""

    def _text_of(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text

    def scan(self, text: str, ids: Sequence[int]) -> list[Item]:
        prefix: list[Item] = []
        trailing = 0
        if self.deferred:
            prefix, text, trailing = self._resolve(text, len(ids))
        id_map = self._id_map
        if not id_map or not any(i in id_map for i in ids):
            if text:
                # vLLM decodes these ids one by one here too, so an id its tokenizer
                # cannot take fails the record in the same places.
                check_token_id_range(ids)
                prefix.append(Text(text, (trailing if prefix else 0) + len(ids)))
            return prefix
        results: list[Item] = []
        run: list[str] = []
        for token_id in ids:
            name = id_map.get(token_id)
            piece = self._text_of(token_id)
            if name is None:
                run.append(piece)
                continue
            if run and (joined := "".join(run)):
                results.append(Text(joined, len(run)))
            run = []
            results.append(Mark(name, piece))
        if run and (joined := "".join(run)):
            results.append(Text(joined, len(run)))
        if trailing:
            results.insert(0, Text("", trailing))
        if text:
            return prefix + self._align(text, results)
        # No text to check the per-token decoding against: markers wait.
        count = 0
        for item in results:
            if isinstance(item, Text):
                count += item.count
            else:
                self.deferred.append(item)
                self._deferred_counts.append(count)
                count = 0
        self._trailing += count
        return prefix

    def flush(self) -> list[Item]:
        if not self.deferred and not self._post_text:
            return []
        out: list[Item] = []
        if self._post_text:
            out.append(Text(self._post_text, self._deferred_counts[0] if self._deferred_counts else 0))
            self._post_text = ""
        out.extend(self.deferred)
        if self._trailing:
            out.append(Text("", self._trailing))
        self.deferred, self._deferred_counts, self._trailing = [], [], 0
        return out

    def _resolve(self, text: str, id_count: int) -> tuple[list[Item], str, int]:
        waiting, counts, trailing = self.deferred, self._deferred_counts, self._trailing
        self.deferred, self._deferred_counts, self._trailing = [], [], 0
        out: list[Item] = []
        rest = self._post_text + text
        self._post_text = ""
        for mark, count in zip(waiting, counts, strict=True):
            pos = rest.find(mark.text)
            if pos >= 0:
                if pos:
                    out.append(Text(rest[:pos], count))
                out.append(mark)
                rest = rest[pos + len(mark.text) :]
            else:
                # Only the marker gives a reliable cut: hold the text until it shows.
                if rest:
                    self._post_text += rest
                    count += id_count
                    rest = ""
                self.deferred.append(mark)
                self._deferred_counts.append(count)
        if self.deferred:
            self._trailing = trailing
            trailing = 0
        return out, rest, trailing

    def _align(self, text: str, results: list[Item]) -> list[Item]:
        if not results:
            return [Text(text)]
        joined = "".join(item.text for item in results)
        if not joined:
            return [Text(text), *results]
        pos = text.find(joined)
        if pos > 0:
            return [Text(text[:pos]), *results]
        if pos == 0:
            return results
        return self._rebuild(text, results)

    def _rebuild(self, text: str, results: list[Item]) -> list[Item]:
        """Per-token decoding differs from the record text (byte fallback, held-back text).

        Cut at the markers' rightmost positions instead.
        """
        marks = [item for item in results if isinstance(item, Mark)]
        if not marks:
            return [Text(text)]
        counts = [0] * (len(marks) + 1)
        group = 0
        for item in results:
            if isinstance(item, Mark):
                group += 1
            else:
                counts[group] += item.count
        positions = [-1] * len(marks)
        end = len(text)
        for k in range(len(marks) - 1, -1, -1):
            pos = text.rfind(marks[k].text, 0, end)
            if pos >= 0:
                positions[k] = pos
                end = pos
        out: list[Item] = []
        used = 0
        for k, mark in enumerate(marks):
            pos = positions[k]
            if pos >= used:
                if pos > used:
                    out.append(Text(text[used:pos], counts[k]))
                out.append(mark)
                used = pos + len(mark.text)
                continue
            later = any(p >= 0 for p in positions[k + 1 :])
            if not later and used < len(text) and mark.name != DROP:
                self._post_text += text[used:]
                used = len(text)
            self.deferred.append(mark)
            self._deferred_counts.append(counts[k])
        if used < len(text):
            out.append(Text(text[used:], counts[-1]))
        return out
