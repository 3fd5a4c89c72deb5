"""``llama3_json`` beyond the golden files.

Uses the real llama-3.1 tokenizer (``<|python_tag|>`` is a special token
there); the llama-3 tokenizer lacks it, so the parser refuses to start.
"""

from __future__ import annotations

import pytest

from tests.parsing_helpers import run_oneshot, run_stream, sample_tokenizer, splits
from tests.parsing_helpers import sample_encode as encode
from worker.core.parsing import ChatParsing, adapter_for
from worker.core.parsing.tools.llama3_json import partial_loads
from worker.errors import ConfigurationError

NAME = "llama3_json"
M = "llama-3.1"
TWO = (
    '{"name": "get_weather", "parameters": {"city": "São Paulo", "days": [1, 2.5], "x": null}}; '
    '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}'
)
CALLS = [
    ("get_weather", '{"city": "São Paulo", "days": [1, 2.5], "x": null}'),
    ("get_time", '{"tz": "Europe/Paris"}'),
]


def test_needs_python_tag_token() -> None:
    with pytest.raises(ConfigurationError):
        ChatParsing.create(
            adapter_for(sample_tokenizer("llama-3")),
            reasoning_parser=None,
            tool_parser=NAME,
            enable_auto_tool_choice=True,
        )


@pytest.mark.parametrize("prefix", ["", "<|python_tag|>"])
def test_every_split_streams_the_one_shot_calls(prefix: str) -> None:
    """Token by token, streaming equals one-shot. Coarse records lose calls in vLLM.

    vLLM reads an object's first record only to move to it, its name in a
    later record, its arguments after that: an object that arrives whole in
    its first record (or the last) never streams. We match that.
    """
    text = prefix + TWO
    assert run_oneshot(M, NAME, text)["calls"] == CALLS
    ids = encode(M, text)
    one_by_one = run_stream(M, NAME, [[i] for i in ids])
    assert one_by_one["calls"] == CALLS
    assert one_by_one["content"] is None
    names = [name for name, _ in CALLS]
    for records in splits(ids):
        got = run_stream(M, NAME, records)
        assert all(name in names for name, _ in got["calls"])
        assert got["content"] is None
    # Split inside each object: the cut records still carry every call in full.
    first_end = len(encode(M, prefix + TWO[: TWO.index(";")]))
    records = [ids[:3], ids[3:6], ids[6:first_end], ids[first_end : first_end + 4]]
    records += [ids[first_end + 4 : first_end + 8], ids[first_end + 8 : -1], ids[-1:]]
    assert run_stream(M, NAME, records)["calls"] == CALLS


def test_json_in_prose() -> None:
    """vLLM disagrees: one-shot turns quoted JSON into a call, streaming keeps it content."""
    text = 'Send {"name": "get_time", "parameters": {"tz": "UTC"}} to me.'
    assert run_oneshot(M, NAME, text)["calls"] == [("get_time", '{"tz": "UTC"}')]
    got = run_stream(M, NAME, [[i] for i in encode(M, text)])
    assert got == {"content": text, "calls": [], "finish": "stop"}


def test_broken_json() -> None:
    text = '{"name": "get_time", "parameters": {"tz": "UTC"]}'
    assert run_oneshot(M, NAME, text) == {"content": text, "calls": []}
    got = run_stream(M, NAME, [[i] for i in encode(M, text)])
    # The name and argument prefix were sent before the bad bracket; then records are skipped.
    assert got["calls"] == [("get_time", '{"tz": "')]


def test_length_cut_closes_the_arguments_when_streaming() -> None:
    text = '{"name": "get_time", "parameters": {"tz": "Europe/Pa'
    got = run_stream(M, NAME, [[i] for i in encode(M, text)], finish="length")
    assert got["calls"] == [("get_time", '{"tz": "Europe/Pa"}')]
    assert run_oneshot(M, NAME, text) == {"content": text, "calls": []}


@pytest.mark.parametrize(
    ("text", "allow_str", "value"),
    [
        ('{"a": "x', True, {"a": "x"}),
        ('{"a": "x', False, {}),
        ('{"a": [1, 2', False, {"a": [1, 2]}),
        ('{"a": 1.', True, {"a": 1}),
        ('{"a": tr', True, {"a": True}),
        ('{"a": "\\u00', True, {"a": ""}),
        ('{"a": 1}; {"b', True, {"a": 1}),
    ],
)
def test_partial_completion(text: str, allow_str: bool, value: object) -> None:
    assert partial_loads(text, allow_str)[0] == value
