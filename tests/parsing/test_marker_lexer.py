"""The parser engine's marker lexer: what it cuts, whatever the chunking, and in linear work.

An adversarial pass found a one-shot record of many markers quadratic (40,000 ``<tool_call>``
tokens: 4–6 s): every marker copied the rest of the buffer. The work is counted here, not timed.
"""

from __future__ import annotations

from typing import SupportsIndex

from hypothesis import given
from hypothesis import strategies as st

from worker.core.parsing.engine.lexer import MarkerLexer, Piece

MARKERS = [
    ("open", "<tool_call>"),
    ("close", "</tool_call>"),
    ("think", "<think>"),
    ("lt", "<"),
    ("nl", "\n"),
]
ALPHABET = "<>/_toolcahink \né"


def longest_first(text: str, markers: list[tuple[str, str]]) -> list[Piece]:
    """The reference: at each position the longest marker that matches, else one character of text."""
    out: list[Piece] = []
    i = 0
    while i < len(text):
        matches = [(len(lit), name, lit) for name, lit in markers if lit and text.startswith(lit, i)]
        if matches:
            _, name, literal = max(matches)
            out.append((name, literal))
            i += len(literal)
        else:
            if out and out[-1][0] is None:
                out[-1] = (None, out[-1][1] + text[i])
            else:
                out.append((None, text[i]))
            i += 1
    return out


def merged(pieces: list[Piece]) -> list[Piece]:
    """Adjacent text pieces joined (where text is cut depends on the chunking)."""
    out: list[Piece] = []
    for name, text in pieces:
        if name is None and out and out[-1][0] is None:
            out[-1] = (None, out[-1][1] + text)
        elif name is not None or text:
            out.append((name, text))
    return out


@given(st.text(alphabet=ALPHABET, max_size=60), st.lists(st.integers(0, 60), max_size=8))
def test_pieces_are_the_longest_markers_whatever_the_chunking(text: str, cuts: list[int]) -> None:
    lexer = MarkerLexer(MARKERS)
    pieces: list[Piece] = []
    start = 0
    for cut in sorted(min(c, len(text)) for c in cuts):
        pieces += lexer.feed(text[start:cut])
        start = cut
    pieces += lexer.feed(text[start:])
    pieces += lexer.flush()
    assert merged(pieces) == longest_first(text, MARKERS)


class CountingStr(str):
    """A string whose slices and ``startswith`` calls add the characters they cover to a shared count."""

    def __new__(cls, value: str, counter: list[int] | None = None) -> CountingStr:
        made = super().__new__(cls, value)
        made.counter = counter if counter is not None else [0]
        return made

    counter: list[int]

    def __getitem__(self, key: SupportsIndex | slice) -> str:
        got = super().__getitem__(key)
        self.counter[0] += len(got)
        return CountingStr(got, self.counter)

    def startswith(
        self,
        prefix: str | tuple[str, ...],
        start: SupportsIndex | None = None,
        end: SupportsIndex | None = None,
        /,
    ) -> bool:
        self.counter[0] += max(map(len, prefix)) if isinstance(prefix, tuple) else len(prefix)
        return super().startswith(prefix, start, end)


def test_a_record_of_many_markers_is_read_in_linear_work() -> None:
    text = "<tool_call>{}</tool_call>\n" * 4_000
    counted = CountingStr(text)
    lexer = MarkerLexer(MARKERS)
    lexer.buffer = counted  # one record's text, as one feed leaves it
    pieces = lexer.flush()
    assert "".join(piece for _, piece in pieces) == text
    # Each character is sliced into its piece once and compared against a few markers.
    assert counted.counter[0] <= 8 * len(text), f"{counted.counter[0]:,} characters for {len(text):,}"
