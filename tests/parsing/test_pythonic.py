"""``pythonic`` tool parser beyond the golden files.

Uses the real llama-3 tokenizer from ``samples/models`` (its calls are plain
text tokens), through the tool-only harness of ``tests.parsing_helpers``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.parsing_helpers import run_oneshot, run_stream, splits
from tests.parsing_helpers import sample_encode as encode
from worker.core.parsing.tools import _pythonic_common as common

CALLS = "[get_weather(city='Paris', unit=\"celsius\"), get_time(tz='Europe/Paris', n=-2, ok=true)]"


def test_every_split_streams_the_one_shot_calls() -> None:
    ids = encode("llama-3", CALLS)
    want = run_oneshot("llama-3", "pythonic", CALLS)
    assert want["calls"] == [
        ("get_weather", '{"city": "Paris", "unit": "celsius"}'),
        ("get_time", '{"tz": "Europe/Paris", "n": -2, "ok": true}'),
    ]
    for records in splits(ids):
        got = run_stream("llama-3", "pythonic", records)
        assert got["calls"] == want["calls"]
        for _, arguments in got["calls"]:
            json.loads(arguments)
        assert got["finish"] == "tool_calls"


def test_prose_stays_content_both_ways() -> None:
    text = "It is sunny. [get_weather(city='Paris')]"
    assert run_oneshot("llama-3", "pythonic", text) == {"content": text, "calls": []}
    got = run_stream("llama-3", "pythonic", [[i] for i in encode("llama-3", text)])
    assert got == {"content": text, "calls": [], "finish": "stop"}


def test_non_literal_arguments_are_never_evaluated() -> None:
    # Names, calls and f-strings with placeholders are rejected, not run.
    for text in ["[f(x=__import__('os').system('true'))]", "[f(x=y)]", "[f(x=f'{y}')]", "[f(x=b'1')]"]:
        assert run_oneshot("llama-3", "pythonic", text) == {"content": text, "calls": []}
        got = run_stream("llama-3", "pythonic", [[i] for i in encode("llama-3", text)])
        assert got["calls"] == [] or all(json.loads(a) is not None for _, a in got["calls"])


def test_broken_syntax_after_a_good_call() -> None:
    """vLLM: streaming sends the finished first call; one-shot keeps everything as content."""
    text = "[get_weather(city='Paris'), get_time(tz=)]"
    assert run_oneshot("llama-3", "pythonic", text) == {"content": text, "calls": []}
    got = run_stream("llama-3", "pythonic", [[i] for i in encode("llama-3", text)])
    assert got["calls"] == [("get_weather", '{"city": "Paris"}')]


def test_length_cut_streams_what_was_parsed() -> None:
    """vLLM disagrees here: streaming sent the partial call, one-shot returns the raw text."""
    text = "[get_weather(city='Paris'), get_time(tz='Europe/Pa"
    ids = encode("llama-3", text)
    got = run_stream("llama-3", "pythonic", [[i] for i in ids], finish="length")
    assert got["calls"] == [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "Europe/Pa')]
    assert got["finish"] == "length"
    assert run_oneshot("llama-3", "pythonic", text)["calls"] == []


def test_literal_forms() -> None:
    text = "[f(t=(1, 2), s={'x'}, d={'k': null}, e=f'v', g=+1.5, n=None)]"
    got = run_oneshot("llama-3", "pythonic", text)
    assert got["calls"] == [
        ("f", '{"t": [1, 2], "s": ["x"], "d": {"k": null}, "e": "v", "g": 1.5, "n": null}')
    ]


def test_dotted_names_only_stream() -> None:
    """vLLM quirk: its one-shot gate wants ``[name(``, so ``a.b(...)`` stays content there."""
    text = "[a.b(x=1)]"
    assert run_oneshot("llama-3", "pythonic", text)["calls"] == []
    got = run_stream("llama-3", "pythonic", [[i] for i in encode("llama-3", text)])
    assert got["calls"] == [("a.b", '{"x": 1}')]


@pytest.mark.parametrize(
    "text",
    [
        "[f(a=" + "(" * 5000 + ")]",
        "[f(a=" + "[" * 100000,
        "[f(a=1" + ", b=1" * 20000 + ")" + " " * 50000 + "x",
        "[f(" + "a=1)" * 30000,
        "[" + "f()," * 20000 + "g(x=1)]",
    ],
)
def test_adversarial_input_is_bounded(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """One-shot work is linear: the gate looks at each call name once, the text is parsed at most once."""
    parsed: list[int] = []
    names: list[int] = []
    closers: list[int] = []
    original_parse = common._parse

    class Counting:
        def __init__(self, pattern: Any, calls: list[int]) -> None:
            self.pattern, self.calls = pattern, calls

        def match(self, string: str, pos: int = 0) -> Any:
            self.calls.append(pos)
            return self.pattern.match(string, pos)

        def search(self, string: str, pos: int = 0) -> Any:
            self.calls.append(pos)
            return self.pattern.search(string, pos)

    def counting(source: str) -> Any:
        parsed.append(len(source))
        return original_parse(source)

    monkeypatch.setattr(common, "_parse", counting)
    monkeypatch.setattr(common, "_NAME_RE", Counting(common._NAME_RE, names))
    monkeypatch.setattr(common, "_CLOSE_LIST_RE", Counting(common._CLOSE_LIST_RE, closers))
    run_oneshot("llama-3", "pythonic", text)
    assert sum(parsed) <= len(text) and len(parsed) <= 1
    # Each name match consumes its name and '(' or '=': never more matches than half the text.
    assert len(names) <= len(text) // 2 + 2
    assert names == sorted(set(names))  # and never the same place twice
    assert len(closers) <= 1


def test_streaming_many_calls_does_not_reparse_finished_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[int] = []
    original = common._parse

    def counting(source: str) -> Any:
        parsed.append(len(source))
        return original(source)

    text = "[" + ", ".join(f"f(i={i}, s='{'x' * 50}')" for i in range(400)) + "]"
    ids = encode("llama-3", text)
    monkeypatch.setattr(common, "_parse", counting)
    got = run_stream("llama-3", "pythonic", [ids[k : k + 3] for k in range(0, len(ids), 3)])
    monkeypatch.undo()
    assert len(got["calls"]) == 400
    assert got["calls"] == run_oneshot("llama-3", "pythonic", text)["calls"]
    # Each parse sees the call in progress, never the finished ones: no parse is longer than a call
    # (plus its brackets), where re-reading finished calls would parse up to the whole text.
    longest_call = max(len(f"f(i={i}, s='{'x' * 50}')") for i in range(400))
    assert parsed and max(parsed) <= longest_call + 8
