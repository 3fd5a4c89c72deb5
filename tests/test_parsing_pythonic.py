"""``pythonic`` tool parser beyond the golden files.

Uses the real llama-3 tokenizer from ``samples/models`` (its calls are plain
text tokens). Also holds the small stream harness the llama3_json and
llama4_pythonic tests share.
"""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from worker.core.model_dir import LoadedTokenizer, load_tokenizer
from worker.core.parsing import ChatParsing, ParseRequest, adapter_for

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
REQUEST = ParseRequest(tools=TOOLS, tool_choice="auto", parallel_tool_calls=None)


@cache
def tokenizer(model_dir: str) -> LoadedTokenizer:
    return load_tokenizer(ROOT / "samples" / "models" / model_dir)


def encode(model_dir: str, text: str) -> list[int]:
    ids: list[int] = tokenizer(model_dir).backend.encode(text, add_special_tokens=False).ids
    return ids


def parsing(model_dir: str, name: str) -> ChatParsing:
    made = ChatParsing.create(
        adapter_for(tokenizer(model_dir)),
        reasoning_parser=None,
        tool_parser=name,
        enable_auto_tool_choice=True,
    )
    assert made is not None
    return made


def run_stream(model_dir: str, name: str, chunks: list[list[int]], finish: str = "stop") -> dict[str, Any]:
    """Records through a session (text = cumulative-decode diff); the summed output."""
    lt = tokenizer(model_dir)
    session = parsing(model_dir, name).new_stream(REQUEST, [1])
    seen: list[int] = []
    emitted = ""
    content = ""
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    reason = None
    for n, chunk in enumerate(chunks):
        seen.extend(chunk)
        text = lt.backend.decode(seen, skip_special_tokens=False)
        new = "" if text.endswith("\ufffd") else text[len(emitted) :]
        if new:
            emitted = text
        delta, reason = session.step(new, chunk, finish if n == len(chunks) - 1 else None)
        if delta is None:
            continue
        content += delta.content or ""
        for call in delta.tool_calls:
            assert call.function is not None
            if call.function.name is not None:
                assert call.index not in names, "a call's name is sent once"
                names[call.index] = call.function.name
            args[call.index] = args.get(call.index, "") + (call.function.arguments or "")
    return {
        "content": content or None,
        "calls": [(names[i], args.get(i, "")) for i in sorted(names)],
        "finish": reason,
    }


def run_oneshot(model_dir: str, name: str, text: str) -> dict[str, Any]:
    message = parsing(model_dir, name).parse_full(text, encode(model_dir, text), REQUEST, [1])
    return {"content": message.content, "calls": [(c.name, c.arguments) for c in message.tool_calls]}


def splits(ids: list[int]) -> list[list[list[int]]]:
    """The id list cut in two at every position (plus one record per id)."""
    out = [[ids[:k], ids[k:]] for k in range(1, len(ids))]
    out.append([[i] for i in ids])
    return out


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
def test_adversarial_input_is_bounded(text: str) -> None:
    start = time.perf_counter()
    run_oneshot("llama-3", "pythonic", text)
    assert time.perf_counter() - start < 2.0


def test_streaming_many_calls_does_not_reparse_finished_ones() -> None:
    text = "[" + ", ".join(f"f(i={i}, s='{'x' * 50}')" for i in range(400)) + "]"
    ids = encode("llama-3", text)
    start = time.perf_counter()
    got = run_stream("llama-3", "pythonic", [ids[k : k + 3] for k in range(0, len(ids), 3)])
    assert len(got["calls"]) == 400
    assert got["calls"] == run_oneshot("llama-3", "pythonic", text)["calls"]
    assert time.perf_counter() - start < 10.0
