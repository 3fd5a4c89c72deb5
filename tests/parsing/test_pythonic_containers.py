"""The pythonic parsers' list and dict arguments: elements parsed once, output equal to the whole re-parse.

Inside an argument that is a list or dict display (``name=[...`` / ``name={...``), and in
the lists and dicts open in its last element, each element a comma follows is parsed once
and left out of later parses; anything not modelled (a repeated key, a set, a comprehension,
``*``/``**``, comments, a container that is only part of the value) parses that container
whole, as vLLM does. While a ``(`` is open inside the call (a tuple), no read is made.
``incremental = False`` is the reference: both read the same texts cut at random
points, with and without llama4's end marker, and every record's delta (ids aside)
and the end-of-stream remainder must be equal.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.parsing_helpers import (
    matches_whole_reread,
    pythonic_stream,
    records,
    sample_encode,
    sample_tokenizer,
    text_cuts,
    tool_parsing,
)
from worker.core.parsing import ParseRequest
from worker.core.parsing.tools import _pythonic_common as common
from worker.core.parsing.tools._pythonic_common import PythonicStream
from worker.core.parsing.tools.llama4_pythonic import END, START

TOOLS = [{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object"}}}]
CORPUS = [
    "[f(a=[1, 2.5, None, True, -3, 'x, y', \"q\"])]",
    "[f(n=1, a=['one', 'two', 'three, with a comma', [4, 5], {'k': [6]}], b=2)]",
    "[f(a={'k': 1, 'l': 'v', 'm': [1, 2], 'n': {'o': None}}), g(b=[1])]",
    "[f(a={'k': 1, 'l': 2, 'k': 3, 'z': 4})]",  # a repeated key keeps its first place
    "[f(a={'k': 1, 1: 2, True: 3, 1.0: 4, None: 5})]",  # keys equal in Python
    "[f(a={1, 2, 3}, b=4)]",  # a set
    "[f(a=[x for x in y], b=[1, *z, 2], c={**d, 'e': 1})]",
    "[f(a=[1, lambda: 2, 3], b={'k': lambda x: x, 'l': 1})]",
    "[f(a=[1, 2] + [3, 4], b=([5, 6]), c = [ 7 , 8 ] )]",
    "[f(a=[1, # a comment\n 2, 3])]",
    "[f(a=['''triple, quoted''', 'x'])]",
    "[f(a=['a long string element, with commas, and more text', 'b'])]",
    "[f(a=[1, 2, 3], a=[4, 5])]",  # a repeated keyword: ast keeps it, the last value wins in place
    "[f(a=1, b=2, a=3, c=[1, 2], c=[3])]",
    "[f(a={'k': 1, 'l'}), g(b=2)]",  # a set item after a dict item: a syntax error
    "[f(a=[[1, 2], [3, 4], [5, [6, 7]]], b={'x': {'y': [1, 2]}, 'z': 3})]",
    "[f(a=[1, 2, 3",
    "[f(a={'k': 'v', 'l': 'unterminated",
    "[f(a=[b'bytes', 2]), g(a={b'k': 1, 'l': 2})]",
    "[f(a=[1e999, -0.0, 0x10, 1_000, 2j])]",
    # a '(' open inside the call: every read fails until it closes (no read is made)
    "[f(a=(1, 2, (3, 'x)'), [4, (5,)]), b=(6), c=g(7, h=(8, 9)), d=((10)))]",
    "[f(a=1), g(b=(1, 2)), h(c=(3,",
    "[f(a=(1,), b=('s',), c=())]",
    # containers nested in the argument container: their finished elements are parsed once too
    "[f(a={'x': {'k0': 0, 'k1': [1, 2, {'z': 3, 'y': 4}], 'k2': 'v'}, 'x2': 5}, "
    "b=[[1, 2], [3, [4, 5, 6]], 7])]",
    "[f(a={'x': {'k': 1, 'l': 2, 'k': 3}, 'y': 1})]",  # a repeated key inside
    "[f(a={'x': 1, 'x': {'k': 1, 'l': 2}})]",  # the nested dict's key repeats a finished one
    "[f(a={1: 0, True: {'k': 1, 'l': 2}, 1.0: [3, 4]})]",  # keys equal in Python
    "[f(a={'x': [{1, 2}, {3}, 4], 'y': {'z': {5, 6}, 'w': 1}})]",  # sets inside
    "[f(a={'x': [1, 2, y for y in z]}), g(b=[[1, 2, *c], [3]])]",
    "[f(a={'x': {b'k': 1, 'l': 2}, 'y': {'k': b'v', 'l': 2}})]",
    "[f(a=[[1, 2, g(3)], [4, 5]], b=[[1, 2][0], [3, 4]])]",
    "[f(a={'a:b': {'c': 1, 'd': 2}, 'e,f': [1, 2]})]",
    "[f(a={'x': # c\n {'k': 1, 'l': 2}, 'y': [1, # d\n 2]})]",
    "[f(a={ 'x' :\n [ 1 ,\n 2 ] , 'y'\n:{'z' : 3 ,} })]",
    "[f(a={'x' 'y': [1, 2, 3], -1: [4, 5], f'k': [6, 7], (1, 2): [8, 9]})]",
    "[f(a=" + "[" * 20 + "1, 2, " * 3 + "]" * 20 + ")]",
    "[f(a={'" + "k" * 300 + "': [1, 2, 3], 'l': {'m': [4, 5]}})]",
    "[f(a=[{'k': [1, 2], 'l': [3, {'m': 4, 'n': [5, 6",
    # a '#' in a string is no comment: such elements are parsed once; after a comment, not
    "[f(c=['#f00', '#0f0', \"# h, 'x'\", {'#k': '#v', 'l': 1}], d='#', e=1), g(h='#')]",
    "[f(c=['#f00', '''#0f0''', r'#x', 1 # a comment, 'q\n, '#y', 2], d='#z', e=1)]",
    "[f(c=[f'#{x}', '#a', f'#b', '#c'], d=f'#', e='#')]",
    # heads are parsed again written anew (a string key's repr, blanks left out)
    "[f(a={\n" + " " * 80 + "'x': {\n" + " " * 90 + "\"it's\": [1,\n 2], 'y' 'z': {'q\"': 1, 2: 3}}})]",
    "[f(a={ 1 :\n{'k': 1, 'l': 2}, -2.5: [1, 2], None: {'m': [3,4]}, 'é\\u2028\\x00': [5, 6]})]",
    "[f(a={'\\ud800': [1, 2], '''t''': {'k': 1}, r'\\d': [3, 4], u'u': {'v': 5, 'w': 6}})]",
    "[f(a=\n" + " " * 70 + "[1, 2, 3], b =  {'k': [1, 2]})]",
    # blanks Python refuses (U+3000, VT) before a bracket: a head written anew must not hide them
    "[f(a=[1, \u3000[2, 3], 4], c=1)]",
    "[f(b\u3000={'k': 'v'}, c=1)]",
    "[f(b\x0b=[1, 2], c=1)]",
    "[f(a\xa0=[1], b=[1,\x1c[2]], c={'k':\u2028[3]})]",
    # a value that is more than its bracket: the head is not written anew (a review's fuzz)
    "[f(a={'k': -[1, 2], 'l': +{'m': 1}, 'n': not [3], 'o': 1 if 1 else [4], 'p': x or [5]})]",
    "[f(a={'k': lambda: {'m': 1}, 'l': 'a' in [6], 'm': 1 + [7]})]",
    "[f(a={'#k': [1, 2], # c, 'x'\n 'l': {'#m': [3]}}, b={1 # c\n: [2, 3]})]",
    "[f(doc='''It's''', a=[1, 'x, y', {'k': 'v'}], b=\"q\") # it's done, 'z'\n]",
    "[f(a=[1, \\\n[2, 3]], b\\\r\n=\x0c{'k': [1]})]",
]


def _random_value(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if depth < 4 and roll < 0.2:
        return "[" + ", ".join(_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))) + "]"
    if depth < 4 and roll < 0.35:
        items = [f"{_random_key(rng)}: {_random_value(rng, depth + 1)}" for _ in range(rng.randint(0, 4))]
        return "{" + ", ".join(items) + "}"
    return rng.choice(
        [
            "1",
            "-2.5e3",
            "None",
            "True",
            "null",
            "'s'",
            '"a, b"',
            "'x\\'y'",
            "(1, 2)",
            "{1}",
            "*x",
            "y",
            "(3,)",
            "g(4)",
            "'#f00'",  # a '#' in a string is no comment
            "'a # b, c'",
            "1 # a comment, 'with' a quote\n",
        ]
    )


def _random_key(rng: random.Random) -> str:
    return rng.choice(["'k'", "'l'", "'m'", "1", "True", "1.0", "None", '"k"', "**z"])


def _random_text(rng: random.Random) -> str:
    calls = []
    for _ in range(rng.randint(1, 2)):
        items = [_random_value(rng, 1) for _ in range(rng.randint(0, 12))]
        roll = rng.random()
        if roll < 0.15:
            container = "(" + ", ".join(items) + rng.choice([")", "", ",)"])
        elif roll < 0.5:
            container = "[" + ", ".join(items) + rng.choice(["]", "", ",]"])
        else:
            members = [f"{_random_key(rng)}: {item}" for item in items]
            container = "{" + ", ".join(members) + rng.choice(["}", "", ",}"])
        before = rng.choice(["", "n=1, ", "a=2, "])
        after = rng.choice(["", ", b=3", " + [1]", ", s='t'"])
        calls.append(
            f"{rng.choice(['f', 'write_file'])}({before}a{rng.choice(['=', ' = '])}{container}{after})"
        )
    text = "[" + ", ".join(calls) + "]"
    if rng.random() < 0.15:
        cut = rng.randrange(len(text))
        text = text[:cut] + rng.choice([",", "]", "}", ":", "'", " ", "#"]) + text[cut + rng.randint(0, 1) :]
    return text


def _dropped(stream: PythonicStream, _piece: str) -> bool:
    return stream._elem_ready  # an element left out of later parses


def _same(pieces: list[str], marker: str | None) -> int:
    return matches_whole_reread(
        pythonic_stream(marker), PythonicStream.step, PythonicStream.remaining_args, pieces, after=_dropped
    )


@pytest.mark.parametrize("marker", [None, END])
def test_corpus_in_one_character_records(marker: str | None) -> None:
    dropped = 0
    for text in CORPUS:
        dropped += _same(list(text + (marker or "")), marker)
    assert dropped > 0


@pytest.mark.parametrize("seed", range(8))
def test_random_splits_of_container_arguments(seed: int) -> None:
    rng = random.Random(seed)
    dropped = records = 0
    for _ in range(200):
        text = rng.choice(CORPUS) if rng.random() < 0.2 else _random_text(rng)
        marker = rng.choice([None, END])
        if marker and rng.random() < 0.8:
            text += marker
        if rng.random() < 0.2:
            text = text[: rng.randrange(1, len(text) + 1)]
        pieces = text_cuts(text, rng)
        dropped += _same(pieces, marker)
        records += len(pieces)
    assert dropped > records // 20, (dropped, records)


SHAPES = {
    "a list of numbers": "[write_file(n=1, a=[" + ", ".join(str(i) for i in range(400)) + "])]",
    "a list of strings": "[write_file(a=[" + ", ".join(f"'v{i}'" for i in range(250)) + "])]",
    "a dict": "[write_file(a={" + ", ".join(f"'k{i}': {i}" for i in range(250)) + "})]",
    "a list of lists": "[write_file(a=[" + ", ".join(f"[{i}, 'x']" for i in range(150)) + "], b=2)]",
    "a tuple": "[write_file(n=1, a=(" + ", ".join(f"({i}, 'x')" for i in range(150)) + "))]",
    "a dict of lists": "[write_file(a={'rows': [" + ", ".join(f"'v{i}'" for i in range(250)) + "]})]",
    "lists in lists in a dict": "[write_file(a={'x': [[" + ", ".join(str(i) for i in range(300)) + "]]})]",
    "colours ('#' in strings)": "[write_file(a=[" + ", ".join(f"'#{i:06x}'" for i in range(200)) + "])]",
    "a list under a '#' key": "[write_file(a={'#k': [" + ", ".join(f"'v{i}'" for i in range(200)) + "]})]",
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("name", "head", "tail"), [("pythonic", "", ""), ("llama4_pythonic", START, END)])
def test_container_arguments_cost_each_record_its_own_characters(
    monkeypatch: pytest.MonkeyPatch, name: str, head: str, tail: str, shape: str
) -> None:
    """Finished elements are parsed once: a record parses its own text plus a constant, never the list."""
    parsed: list[int] = []
    original = common._parse

    def counting(source: str) -> Any:
        parsed.append(len(source))
        return original(source)

    monkeypatch.setattr(common, "_parse", counting)
    text = head + SHAPES[shape] + tail
    ids = sample_encode("llama-3", text)
    session = tool_parsing("llama-3", name).new_stream(
        ParseRequest(tools=TOOLS, tool_choice="auto", parallel_tool_calls=None), [1]
    )
    parser = session._parser.tools
    calls: dict[int, list[str]] = {}
    inside = 0
    for piece, chunk in records(sample_tokenizer("llama-3"), [[i] for i in ids]):
        stream = getattr(parser, "_calls", None)
        before = stream.scanned if stream is not None else 0
        parsed.clear()
        delta, _ = session.step(piece, chunk, None)
        # The record that closes the container parses the argument whole, once.
        if stream is not None and len(stream._scanner.stack) >= 3:
            inside += 1
            work = stream.scanned - before
            assert work <= 3 * len(piece) + 80, (piece, work)
            assert sum(parsed) <= 2 * len(piece) + 80, (piece, parsed)
        for call in delta.tool_calls if delta else []:
            entry = calls.setdefault(call.index, ["", ""])
            entry[0] += (call.function.name or "") if call.function else ""
            entry[1] += (call.function.arguments or "") if call.function else ""
    expected = common.extract_calls(SHAPES[shape])
    assert expected is not None
    assert [tuple(calls[i]) for i in sorted(calls)] == [(call.name, call.arguments) for call in expected]
    assert json.loads(calls[0][1])["a"]  # the container streamed in full
    assert inside > len(ids) * 3 // 4


def _pretty(items: int) -> str:
    """A list six dicts deep, pretty-printed: the text before a bracket runs past 64 columns."""
    heads = "".join("{\n" + " " * 12 * depth + f"'level_{depth}': " for depth in range(1, 7))
    rows = ",\n".join(" " * 40 + f"'v{i}'" for i in range(items))
    return "[write_file(a=" + heads + "[\n" + rows + "]" + "}" * 6 + ")]"


def test_pretty_printed_nesting_is_read_in_linear_work() -> None:
    """Each level's head is parsed again written anew (``'level_3': {``), not as the text before
    its bracket, and parses read the heads from the first level on, before any element is
    committed: the work stays a constant multiple of the text (it grew with its square)."""
    ratios = []
    for items in (100, 400):
        text = _pretty(items)
        stream = pythonic_stream(None)(True)
        for at in range(0, len(text), 3):
            stream.step(text[at : at + 3])
        ratios.append(stream.scanned / len(text))
    assert max(ratios) < 16, ratios
    _same([_pretty(20)[at : at + 3] for at in range(0, len(_pretty(20)), 3)], None)


def _after_apostrophe(items: int) -> str:
    """A list after a docstring with an apostrophe: the quote-by-quote scan reads the rest of the
    call inside out (its strings as code, its commas in strings)."""
    return "[write_file(doc='''It's here.''', data=[" + ", ".join(f"'v{i}'" for i in range(items)) + "])]"


def test_arguments_after_a_triple_quote_the_scan_misreads_make_no_read() -> None:
    """Where the scan's string and Python's disagree at the end of the text (the completion adds a
    quote that opens a string in Python's reading, or leaves one open), vLLM's read fails: no
    record makes it (it grew with the call's square, and met the parse budget past ~2 KB)."""
    for items in (100, 400):
        text = _after_apostrophe(items)
        stream = pythonic_stream(None)(True)
        for at in range(0, len(text), 3):
            stream.step(text[at : at + 3])
        assert stream.scanned < 4 * len(text), (items, stream.scanned / len(text))
    _same([_after_apostrophe(30)[at : at + 3] for at in range(0, len(_after_apostrophe(30)), 3)], None)
    _same(list(_after_apostrophe(10)), END)


#: Found by an adversarial pass: a piece parsed alone is less deep than in the whole text, so near
#: CPython's limits (200 nested brackets; the recursion a long sign chain takes) it parsed where
#: vLLM's whole parse fails.
NEAR_LIMITS = [
    ["[f(a=[[" + "[" * 197 + "]" * 197 + ", [", "]]])]"],
    ["[f(a=[" + "[" * 198 + "]" * 198 + ", [", "]])]"],
    ["[f(a=" + "[" * 199 + "]" * 199 + ", b=[", "])]"],
    ["[f(a=[" + "-" * 990 + "1, [", "2])]"],
    ["[f(a=" + "-" * 990 + "1, b=[", "2])]"],
]


@pytest.mark.parametrize("pieces", NEAR_LIMITS, ids=range(len(NEAR_LIMITS)))
def test_nesting_near_pythons_limits_matches_the_whole_reread(pieces: list[str]) -> None:
    _same(pieces, None)


def test_a_hash_in_strings_after_an_f_string_is_still_text() -> None:
    """Python before 3.12 reads an f-string as any other string token, so Python's reading of
    strings goes on after one and a '#' in a later string does not stop elements being parsed
    once (3.12 reads quotes nested in its braces: there the reading stops at an f-string)."""
    text = "[write_file(s=f'a {{b}}', a=[" + ", ".join(f"'#{i:06x}'" for i in range(300)) + "])]"
    stream = pythonic_stream(None)(True)
    for at in range(0, len(text), 3):
        stream.step(text[at : at + 3])
    limit = 400 if common._NESTED_FSTRINGS else 16
    assert stream.scanned < limit * len(text), stream.scanned / len(text)
    _same([text[at : at + 3] for at in range(0, 600, 3)], None)
