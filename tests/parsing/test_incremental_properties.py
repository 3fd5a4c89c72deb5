"""Property tests of the incremental tool-call readers (``llama3_json``, ``pythonic``, ``llama4_pythonic``).

For calls of every argument shape (many short arguments, numbers, nested lists
and objects, deep nesting, strings with escapes, several calls), cut into
records at arbitrary points:

* the incremental reader gives every record the same delta as the whole
  re-read of vLLM's semantics (``incremental = False``, the reference), and the
  same end-of-stream remainder, also with duplicate keys, both argument keys
  and syntax errors at random places (``llama3_json``);
* for one call, the deltas concatenate to the one-shot extraction's call (name
  and arguments JSON), the first record holding only the call's first character
  (vLLM drops a call that arrives whole in the record that starts it; with
  several calls its streaming can drop one, which the first property covers).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parsing_helpers import delta_without_ids, sample_tokenizer
from worker.core.parsing import ParseRequest, adapter_for
from worker.core.parsing.tools._pythonic_common import PythonicStream, extract_calls
from worker.core.parsing.tools.llama3_json import Llama3JsonToolParser
from worker.core.parsing.tools.llama4_pythonic import END

REQUEST = ParseRequest(tools=None, tool_choice="auto", parallel_tool_calls=None)
TOKENIZER = adapter_for(sample_tokenizer("llama-3.1"))

_TEXT = st.text(alphabet=st.sampled_from([*'ab "\\\n\t{}[],:=é😀\u2028', "\x01"]), max_size=12)
_KEYS = st.text(alphabet=st.sampled_from(list("abk_1")), min_size=1, max_size=4)
_SCALARS = st.one_of(
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    _TEXT,
    st.booleans(),
    st.none(),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(_KEYS, inner, max_size=5), st.tuples(inner, inner)
    ),
    max_leaves=25,
)
#: Arguments objects; deep nesting and many short arguments are drawn on purpose, not left to chance.
_ARGS = st.one_of(
    st.dictionaries(_KEYS, _VALUES, max_size=8),
    st.dictionaries(_KEYS, st.integers(-1000, 1000), min_size=10, max_size=40),
    st.integers(1, 60).map(lambda depth: {"a": json.loads("[" * depth + "1" + "]" * depth), "b": "x"}),
)


def _cuts(text: str, sizes: list[int]) -> list[str]:
    """The text in records of the drawn sizes (cycled), the first record one character."""
    pieces, pos, turn = [text[:1]], 1, 0
    while pos < len(text):
        size = sizes[turn % len(sizes)]
        pieces.append(text[pos : pos + size])
        pos, turn = pos + size, turn + 1
    return pieces


def _json_run(pieces: list[str], incremental: bool) -> tuple[list[Any], str]:
    parser = Llama3JsonToolParser(TOKENIZER, None, {})
    parser.incremental = incremental
    out = [delta_without_ids(parser.stream(piece, [0], REQUEST)) for piece in pieces]
    return out, parser.remaining_unstreamed_args()


def _python_run(pieces: list[str], marker: str | None, incremental: bool) -> tuple[list[Any], str]:
    stream = PythonicStream(marker)
    stream.incremental = incremental
    out = [delta_without_ids(stream.step(piece)) for piece in pieces]
    return out, stream.remaining_args()


def _joined(deltas: list[Any], remaining: str) -> list[tuple[str, str]]:
    """(name, arguments) per call index, as a client concatenates the stream."""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for call in (delta or {}).get("tool_calls") or []:
            entry = calls.setdefault(call["index"], ["", ""])
            function = call.get("function") or {}
            entry[0] += function.get("name") or ""
            entry[1] += function.get("arguments") or ""
    if calls:
        calls[max(calls)][1] += remaining
    return [(name, args) for name, args in (calls[i] for i in sorted(calls))]


@settings(max_examples=80, deadline=None)
@given(
    calls=st.lists(_ARGS, min_size=1, max_size=3),
    ascii_only=st.booleans(),
    key=st.sampled_from(["parameters", "arguments"]),
    tag=st.booleans(),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    stop=st.floats(0.0, 1.0),
)
def test_llama3_json_any_records_match_the_whole_reread(
    calls: list[Any], ascii_only: bool, key: str, tag: bool, sizes: list[int], stop: float
) -> None:
    objects = [
        json.dumps({"name": f"f{i}", key: args}, ensure_ascii=ascii_only) for i, args in enumerate(calls)
    ]
    text = ("<|python_tag|>" if tag else "") + "; ".join(objects)
    if stop < 0.3:  # cut short, as a stream stopped by max_tokens is
        text = text[: max(1, int(len(text) * stop / 0.3))]
    pieces = _cuts(text, sizes)
    got = _json_run(pieces, True)
    assert got == _json_run(pieces, False)
    if len(calls) == 1 and stop >= 0.3 and not tag:
        extracted = Llama3JsonToolParser(TOKENIZER, None, {}).extract_tool_calls(text, REQUEST)
        assert _joined(*got) == [(call.name, call.arguments) for call in extracted.calls]


def _members(pairs: list[tuple[str, Any]], ascii_only: bool) -> str:
    """An object's text with its members as drawn: the same key may come again."""
    members = (f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=ascii_only)}" for k, v in pairs)
    return "{" + ", ".join(members) + "}"


_PAIRS = st.lists(st.tuples(st.sampled_from(["a", "b", "k"]), _VALUES), max_size=8)
#: Text that breaks JSON where it lands; some of it the completion mends (array tails, blanks).
_BREAKS = st.sampled_from([",", ",,", " x", "}", "]", "{", "[", '"', ":", " 1", " -", "\u3000", "1.", "\\"])


@settings(max_examples=150, deadline=None)
@given(
    pairs=_PAIRS,
    nested=st.lists(st.tuples(st.sampled_from(["a", "b"]), _PAIRS), max_size=3),
    again=st.sampled_from(["", "parameters", "arguments"]),
    name_last=st.booleans(),
    breaks=st.lists(st.tuples(st.floats(0.0, 1.0), _BREAKS), max_size=2),
    ascii_only=st.booleans(),
    tag=st.booleans(),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    stop=st.floats(0.0, 1.0),
)
def test_llama3_json_duplicate_keys_and_syntax_errors_match_the_whole_reread(
    pairs: list[tuple[str, Any]],
    nested: list[tuple[str, list[tuple[str, Any]]]],
    again: str,
    name_last: bool,
    breaks: list[tuple[float, str]],
    ascii_only: bool,
    tag: bool,
    sizes: list[int],
    stop: float,
) -> None:
    inner = [f"{json.dumps(k)}: {_members(members, ascii_only)}" for k, members in nested]
    args = _members(pairs, ascii_only)
    args = args[:-1] + (", " if pairs and inner else "") + ", ".join(inner) + "}"
    text = '{"parameters": ' + args
    if again:  # the arguments key again: it restarts them, or both keys fail every read
        text += f', "{again}": ' + _members(pairs[::-1], ascii_only)
    text = text + ', "name": "f"}' if name_last else '{"name": "f", ' + text[1:] + "}"
    for where, piece in breaks:
        cut = int(len(text) * where)
        text = text[:cut] + piece + text[cut:]
    text = ("<|python_tag|>" if tag else "") + text
    if stop < 0.3:
        text = text[: max(1, int(len(text) * stop / 0.3))]
    pieces = _cuts(text, sizes)
    assert _json_run(pieces, True) == _json_run(pieces, False)


def _python_literal(value: Any) -> str:
    """The value as a model writes it in a pythonic call (JSON's names for the constants, at random)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_python_literal(k)}: {_python_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_python_literal(v) for v in value) + ",)"
    if isinstance(value, list):
        return "[" + ", ".join(_python_literal(v) for v in value) + "]"
    return repr(value)


@settings(max_examples=80, deadline=None)
@given(
    calls=st.lists(_ARGS.filter(lambda args: all(k.isidentifier() for k in args)), min_size=1, max_size=3),
    marker=st.sampled_from([None, END]),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    stop=st.floats(0.0, 1.0),
)
def test_pythonic_any_records_match_the_whole_reparse(
    calls: list[dict[str, Any]], marker: str | None, sizes: list[int], stop: float
) -> None:
    text = (
        "["
        + ", ".join(
            f"f{i}(" + ", ".join(f"{k}={_python_literal(v)}" for k, v in args.items()) + ")"
            for i, args in enumerate(calls)
        )
        + "]"
    )
    if stop < 0.3:
        text = text[: max(1, int(len(text) * stop / 0.3))]
    elif marker:
        text += marker
    pieces = _cuts(text, sizes)
    got = _python_run(pieces, marker, True)
    assert got == _python_run(pieces, marker, False)
    if stop >= 0.3 and len(calls) == 1 and all(k[0].isalpha() for k in calls[0]):
        # One call whose first argument vLLM's one-shot gate accepts (a name starting with a letter).
        extracted = extract_calls(text[: len(text) - len(marker or "")])
        assert extracted is not None
        assert _joined(*got) == [(call.name, call.arguments) for call in extracted]
