"""``llama4_pythonic`` beyond the golden files.

Uses the real llama-3 tokenizer, which spells ``<|python_start|>`` /
``<|python_end|>`` as plain text tokens (the format's text form).
"""

from __future__ import annotations

import json

from tests.parsing_helpers import run_oneshot, run_stream, splits
from tests.parsing_helpers import sample_encode as encode

NAME = "llama4_pythonic"
WRAPPED = "<|python_start|>[get_weather(city='Zürich'), get_time(tz='Asia/Tokyo')]<|python_end|>"
CALLS = [("get_weather", '{"city": "Zürich"}'), ("get_time", '{"tz": "Asia/Tokyo"}')]


def test_every_split_of_the_wrapper() -> None:
    assert run_oneshot("llama-3", NAME, WRAPPED)["calls"] == CALLS
    for records in splits(encode("llama-3", WRAPPED)):
        got = run_stream("llama-3", NAME, records)
        assert got["calls"] == CALLS
        for _, arguments in got["calls"]:
            json.loads(arguments)
        # vLLM quirk: pieces of the start wrapper in records before it is whole stream as content.
        assert got["content"] is None or "<|python_start|>".startswith(got["content"])


def test_bare_list_and_prose() -> None:
    bare = "[get_weather(city='Zürich')]"
    assert run_stream("llama-3", NAME, [[i] for i in encode("llama-3", bare)])["calls"] == CALLS[:1]
    prose = "Sure: <|python_start|>[get_weather(city='Zürich')]"
    assert run_oneshot("llama-3", NAME, prose) == {"content": prose, "calls": []}
    assert run_stream("llama-3", NAME, [[i] for i in encode("llama-3", prose)])["content"] == prose


def test_broken_call_stays_content_one_shot() -> None:
    text = "<|python_start|>[get_weather(city=)]<|python_end|>"
    got = run_oneshot("llama-3", NAME, text)
    assert got["calls"] == []
    streamed = run_stream("llama-3", NAME, [[i] for i in encode("llama-3", text)])
    assert streamed["calls"] == []
