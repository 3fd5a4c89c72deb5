"""``_partial_json.partial_loads`` against the ``partial_json_parser`` library vLLM 0.33.0 calls.

The llama3_json differential tests take ``_partial_json`` itself as the whole-re-read reference,
so they cannot see it drift from the library. Here the reference is vLLM's ``partial_json_loads``
on the real library (flags ``Allow.ALL`` once the name was sent, else without ``Allow.STR``): the
same value and consumed length, or both raise.
"""

from __future__ import annotations

import json
import random
from functools import cache
from typing import Any

import partial_json_parser
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from partial_json_parser.core.options import Allow

from tests.golden_cases import load_cases
from tests.parsing_helpers import decode_with, sample_tokenizer
from worker.core.parsing.tools._partial_json import partial_loads, reads_no_container


def vllm_partial_json_loads(text: str, allow_str: bool) -> tuple[Any, int]:
    """vLLM 0.33.0's ``partial_json_loads`` (tool_parsers/utils.py) with the llama3_json flags."""
    flags = Allow.ALL if allow_str else Allow.ALL & ~Allow.STR
    try:
        return partial_json_parser.loads(text, flags), len(text)
    except json.JSONDecodeError as exc:
        if "Extra data" in exc.msg:
            return json.JSONDecoder().raw_decode(text)
        raise


def _outcome(read: Any, text: str, allow_str: bool) -> tuple[str, int] | None:
    try:
        value, consumed = read(text, allow_str)
    except Exception:  # noqa: BLE001 - vLLM's caller gives up on any failure alike
        return None
    return repr(value), consumed  # repr: NaN equals itself, True differs from 1


def assert_same(text: str, allow_str: bool) -> None:
    expected = _outcome(vllm_partial_json_loads, text, allow_str)
    assert _outcome(partial_loads, text, allow_str) == expected, (text, allow_str)


# Characters the completion treats specially, blanks json.loads rejects among them.
_NOISE = [*'{}[]",:\\ -+.eE01tfnNIlu', "\u3000", "\x0b", "\n", "\t", "\xa0", "; ", "tru", "1e", "1."]

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(alphabet=st.sampled_from([*'ab "\\/é\n\t\u3000\x0b{}[],:', "\U0001f642"]), max_size=6)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text('abk"\\', max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
_calls = st.builds(
    lambda name, args, key: {"name": name, key: args},
    st.sampled_from(["f", "get_weather", 'q"x', "a\\b"]),
    st.dictionaries(st.text("abc", min_size=1, max_size=2), _values, max_size=3),
    st.sampled_from(["parameters", "arguments"]),
)


def _dump(value: Any, ascii_only: bool, compact: bool) -> str:
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps(value, ensure_ascii=ascii_only, separators=separators)


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(0, 3)):
        at = rng.randint(0, len(text))
        kind = rng.random()
        if kind < 0.5:
            text = text[:at] + rng.choice(_NOISE) + text[at:]
        elif kind < 0.8:
            text = text[:at] + text[at + 1 :]
        else:
            text = text[:at] + rng.choice(_NOISE) + text[at + 1 :]
    return text


@st.composite
def _texts(draw: st.DrawFn) -> str:
    calls = draw(st.lists(_calls, min_size=1, max_size=2))
    ascii_only, compact = draw(st.booleans()), draw(st.booleans())
    text = "; ".join(_dump(call, ascii_only, compact) for call in calls)
    if draw(st.booleans()):
        text += draw(st.sampled_from(["; ", ";", " ", "x", "}", "] ", "\u3000", " {", '; {"na']))
    text = _mutate(random.Random(draw(st.integers(0, 2**32))), text)
    return text[: draw(st.integers(0, len(text)))]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_texts(), allow_str=st.booleans())
@example(text='{"name": "f", "parameters": {"a": [1, "', allow_str=False)
@example(text='{"name": "f"\u3000,', allow_str=True)
@example(text='{"name": "f"\u3000,', allow_str=False)
@example(text='{"name": "f", "parameters": {"a": "x\\"y', allow_str=False)
@example(text='{"a": [1, 2], "b": "c\\\\', allow_str=False)
@example(text='[1, "x", tru', allow_str=False)
@example(text='{"a": -', allow_str=True)
@example(text='{"a": 1e', allow_str=True)
@example(text='{"a": 1}; {"b": 2}', allow_str=True)
@example(text='{"a": "\\u30', allow_str=True)
def test_matches_the_library(text: str, allow_str: bool) -> None:
    assert_same(text, allow_str)


def test_seeded_mutations_match_the_library() -> None:
    """A fixed sweep of mutated prefixes (hypothesis shrinks toward few mutations)."""
    rng = random.Random(20260330)
    bases = [
        '{"name": "get_weather", "parameters": {"city": "São Paulo", "days": [1, 2.5, -3e2], "x": null}}',
        '{"name": "f", "arguments": {"q": "say \\"hi\\" \\\\ there", "n": [true, false, {"k": "v"}]}}',
        '{"name": "g", "parameters": {"a": [[1, "x"], {"b": ["\\u00e9", 1.0]}], "c": "\\n"}}; {"name": "h"}',
    ]
    for _ in range(3000):
        text = _mutate(rng, rng.choice(bases))
        text = text[: rng.randint(0, len(text))]
        assert_same(text, rng.random() < 0.5)


@cache
def _golden_texts() -> list[str]:
    tokenizer = sample_tokenizer("llama-3.1")
    texts = set()
    for case in load_cases():
        if case.file != "parsers_llama3_json":
            continue
        ids = [
            token
            for record in case.input
            for choice in record["body"].get("generate_chunk", {}).get("choices", [])
            for token in choice.get("token_ids", [])
        ]
        text = decode_with(tokenizer, ids)
        for special in ("<|python_tag|>", "<|eot_id|>", "<|eom_id|>"):
            text = text.replace(special, "")
        if text:
            texts.add(text)
    return sorted(texts)


@pytest.mark.parametrize("allow_str", [True, False])
def test_golden_prefixes_match_the_library(allow_str: bool) -> None:
    texts = _golden_texts()
    assert texts
    for text in texts:
        # Every prefix, read from the start and from each later object (vLLM skips "; ").
        starts = [0] + [at + 2 for at in range(len(text)) if text.startswith("; ", at)]
        for start in starts:
            for end in range(start, len(text) + 1):
                assert_same(text[start:end], allow_str)


_PROSE_HEADS = ["x", "The", "I have", "Note", "1", "-", "nul", "tr", "fa", "NaN", ";", ",", ":", "\u3000x"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=st.sampled_from(_PROSE_HEADS), tail=_texts(), lead=st.sampled_from(["", " ", "\n\t", "\u3000"]))
@example(head="f", tail="", lead="")  # undecided: "f" may become "false", a scalar
def test_reads_no_container_holds_for_the_library(head: str, tail: str, lead: str) -> None:
    """Where ``reads_no_container`` says so, the library gives no object, array or string, with
    or without incomplete strings, and neither does any longer text."""
    text = lead + head + tail
    assert reads_no_container(text, 0) == (head.lstrip()[:1] not in '{["')
    for cut in range(len(lead) + 1, len(text) + 1):
        for allow_str in (True, False):
            try:
                value, _ = vllm_partial_json_loads(text[:cut], allow_str)
            except Exception:  # noqa: BLE001 - a failed read is what the claim allows
                continue
            assert not isinstance(value, dict | list | str), (text[:cut], allow_str, value)
