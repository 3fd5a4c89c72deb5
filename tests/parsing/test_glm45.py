"""``glm45``/``glm47``: vLLM 0.33.0's ``Glm47MoeModelToolParser`` (GLM-4.5/4.6/4.7 tool calls).

There is no golden file and no GLM tokenizer in ``samples/models``, so these
tests run the GLM *text format* through the real Qwen3 tokenizer
(``samples/models/qwen3``). It is a faithful stand-in: like GLM's own
tokenizer it has ``<tool_call>``, ``</tool_call>``, ``<think>`` and
``</think>`` as single tokens (the markers vLLM's GLM grammar matches by
token id while streaming), and it spells ``<arg_key>``/``</arg_key>``/
``<arg_value>``/``</arg_value>`` with several ordinary tokens, which only
makes the text-matched markers straddle records more often than GLM's
tokenizer would (vLLM matches those by text with either tokenizer).

Expected deltas marked "vLLM" were produced by vLLM 0.33.0's own
``Glm47MoeParser`` engine code driven the way its tool adapter drives it,
on exactly these records; the every-split tests compare streaming with
one-shot where vLLM agrees and state where it does not.
"""

from __future__ import annotations

import json
from typing import Any

from tests.parsing_helpers import qwen3, splits
from tests.parsing_helpers import qwen3_encode as encode
from tests.parsing_helpers import qwen3_make as make
from tests.parsing_helpers import qwen3_oneshot as oneshot
from tests.parsing_helpers import xml_request as request
from tests.parsing_helpers import xml_stream as stream
from worker.core.parsing import DeltaOut, ParseRequest
from worker.core.parsing.registry import tool_parsers

WEATHER: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
CITY_P = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>P</arg_value></tool_call>"
THINK_THEN_CALL = (
    "<think>plan it</think>Let me check.<tool_call>get_weather\n"
    "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
)


def tool_level(pieces: list[str], tools: list[dict[str, Any]] | None = WEATHER, **kw: Any) -> list[Any]:
    """Feed the parser class itself one record per piece (no reasoning parser in front)."""
    cls = tool_parsers()["glm45"]
    parser = cls(qwen3()[1], tools, kw.get("kwargs", {}))
    parser.skip_reasoning_parsing = kw.get("skip_reasoning", True)
    req = ParseRequest(tools=tools, tool_choice="auto")
    ids: dict[str, str] = {}
    out = [_plain(parser.stream(piece, encode(piece), req), ids) for piece in pieces]
    out.append(("finish", _plain(parser.finish_stream(), ids)))
    return out


def _plain(delta: DeltaOut | None, ids: dict[str, str]) -> Any:
    if delta is None:
        return None
    calls = []
    for call in delta.tool_calls:
        entry: dict[str, Any] = {"index": call.index}
        if call.id is not None:
            entry["id"] = ids.setdefault(call.id, f"id{len(ids)}")
        if call.function is not None:
            if call.function.name is not None:
                entry["name"] = call.function.name
            if call.function.arguments is not None:
                entry["args"] = call.function.arguments
        calls.append(entry)
    return {
        k: v for k, v in (("content", delta.content), ("reasoning", delta.reasoning), ("calls", calls)) if v
    }


def test_registered_under_vllm_names() -> None:
    known = tool_parsers()
    assert known["glm45"] is known["glm47"]
    assert known["glm45"].engine_based and not known["glm45"].supports_required_and_named


def test_oneshot_with_reasoning_parser() -> None:
    got = oneshot(make("glm45", "glm45"), request(WEATHER), THINK_THEN_CALL)
    assert got == {
        "reasoning": "plan it",
        "content": "Let me check.",
        "calls": [("get_weather", '{"city": "Paris", "days": 3}')],
    }


def test_stream_matches_oneshot_at_every_split() -> None:
    parsing = make("glm45", "glm45")
    req = request(WEATHER)
    want = oneshot(parsing, req, THINK_THEN_CALL)
    for chunks in splits(encode(THINK_THEN_CALL)):
        assert stream(parsing, req, chunks) == {**want, "finish": "tool_calls"}, [len(c) for c in chunks]


def test_streamed_arguments_are_valid_json_equal_to_oneshot() -> None:
    parsing = make(None, "glm45")
    req = request(WEATHER)
    text = (
        'Two.<tool_call>get_weather<arg_key>city</arg_key><arg_value>São "Paulo"\n</arg_value></tool_call>'
        "<tool_call> get_weather \n<arg_key>days</arg_key><arg_value>7</arg_value></tool_call>"
    )
    want = oneshot(parsing, req, text)
    assert want["calls"] == [
        ("get_weather", '{"city": "São \\"Paulo\\"\\n"}'),
        ("get_weather", '{"days": 7}'),
    ]
    for chunks in splits(encode(text)):
        got = stream(parsing, req, chunks)
        assert got["calls"] == want["calls"], [len(c) for c in chunks]
        assert [json.loads(a) for _, a in got["calls"]] == [{"city": 'São "Paulo"\n'}, {"days": 7}]


def test_record_by_record_like_vllm() -> None:
    pieces = [
        "Let me check.",
        "<tool_call>",
        " get_weather\n",
        "<arg_key>city</arg_key>\n<arg_",
        "value>Paris\n",
        "</arg_value>",
        "\n<arg_key>days</arg_key>",
        "<arg_value>3</arg_value>\n",
        "</tool_call>",
    ]
    # vLLM: the name goes out (stripped) with the first <arg_key>; a string
    # value streams verbatim as it grows; the integer waits for </tool_call>.
    assert tool_level(pieces) == [
        {"content": "Let me check."},
        None,
        None,
        {"calls": [{"index": 0, "id": "id0", "name": "get_weather"}]},
        {"calls": [{"index": 0, "args": '{"city": "Paris\\n'}]},
        None,
        None,
        {"calls": [{"index": 0, "args": '", "days": '}]},
        {"calls": [{"index": 0, "args": "3}"}]},
        ("finish", None),
    ]


def test_keys_are_stripped_values_verbatim_and_typed() -> None:
    pieces = [
        "<tool_call>",
        "get_weather",
        "<arg_key>",
        " city ",
        "</arg_key>",
        "<arg_value>",
        "\nParis\n",
        "</arg_value>",
        "<arg_key>days</arg_key><arg_value> 4 </arg_value>",
        "</tool_call>",
    ]
    # vLLM: no newline trimming (unlike qwen3); " 4 " is an integer by the schema.
    assert tool_level(pieces) == [
        None,
        None,
        {"calls": [{"index": 0, "id": "id0", "name": "get_weather"}]},
        None,
        None,
        {"calls": [{"index": 0, "args": '{"city": "'}]},
        {"calls": [{"index": 0, "args": "\\nParis\\n"}]},
        None,
        {"calls": [{"index": 0, "args": '", "days": '}]},
        {"calls": [{"index": 0, "args": "4}"}]},
        ("finish", None),
    ]


def test_uncoercible_value_stays_a_string() -> None:
    pieces = ["<tool_call>", "get_weather", "<arg_key>", "days", "</arg_key>", "<arg_value>", "soon"]
    pieces += ["</arg_value>", "</tool_call>"]
    got = tool_level(pieces)
    assert got[5] == {"calls": [{"index": 0, "args": '{"days": '}]}
    assert got[8] == {"calls": [{"index": 0, "args": '"soon"}'}]}


def test_call_without_arguments_and_unknown_tool() -> None:
    """A bare name closes with ``{}``; a name not among the tools makes the whole call vanish."""
    pieces = ["<tool_call>", "get_weather", "</tool_call>"]
    pieces += ["<tool_call>nope<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "after"]
    assert tool_level(pieces) == [
        None,
        None,
        {"calls": [{"index": 0, "id": "id0", "name": "get_weather", "args": "{}"}]},
        None,
        {"content": "after"},
        ("finish", None),
    ]
    parsing = make(None, "glm45")
    req = request(WEATHER)
    text = "".join(pieces)
    # vLLM quirk: one-shot loses text that follows tool markup.
    assert oneshot(parsing, req, text) == {
        "reasoning": None,
        "content": None,
        "calls": [("get_weather", "{}")],
    }
    assert oneshot(parsing, req, "<tool_call>nope</tool_call>ok") == {
        "reasoning": None,
        "content": "ok",
        "calls": [],
    }


def test_without_tools_any_name_is_accepted() -> None:
    got = tool_level(["<tool_call>nope<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"], tools=None)
    assert got == [
        {"calls": [{"index": 0, "id": "id0", "name": "nope", "args": '{"a": "1"}'}]},
        ("finish", None),
    ]


def test_cut_inside_a_value() -> None:
    """``length`` inside a value: the stream stays open; one-shot drops the open argument."""
    parsing = make(None, "glm45")
    req = request(WEATHER)
    text = "Hi<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris, Fr"
    assert oneshot(parsing, req, text) == {
        "reasoning": None,
        "content": "Hi",
        "calls": [("get_weather", "{}")],
    }
    for chunks in splits(encode(text)):
        got = stream(parsing, req, chunks, finish="length")
        assert got["calls"] == [("get_weather", '{"city": "Paris, Fr')]
        assert (got["content"], got["finish"]) == ("Hi", "length")


def test_broken_markup_cut_in_a_tag() -> None:
    """A dangling ``<arg_val`` is held while it could be a tag, then lands in the (open) value."""
    parsing = make(None, "glm45")
    req = request(WEATHER)
    text = "<tool_call>get_weather<arg_key>city</arg_key><arg_val"
    assert oneshot(parsing, req, text)["calls"] == [("get_weather", "{}")]
    for chunks in splits(encode(text)):
        assert stream(parsing, req, chunks, finish="length")["calls"] == [("get_weather", "{}")]


def test_think_in_content_reopens_reasoning_in_the_tool_phase() -> None:
    # vLLM: with a reasoning parser configured the tool engine keeps its
    # reasoning grammar; trailing reasoning whitespace is held and then lost.
    assert tool_level(["b", "<think>", "c", "  ", "</think>", "d"], skip_reasoning=False) == [
        {"content": "b"},
        None,
        {"reasoning": "c"},
        None,
        None,
        {"content": "d"},
        ("finish", None),
    ]
    # Without one, the think markers are plain text.
    assert tool_level(["b", "<think>", "c"]) == [
        {"content": "b"},
        {"content": "<think>"},
        {"content": "c"},
        ("finish", None),
    ]


def test_no_reasoning_parser_keeps_think_text() -> None:
    parsing = make(None, "glm45")
    req = request(WEATHER)
    text = "<think>a</think>b<tool_call>get_weather</tool_call>"
    want = {"reasoning": None, "content": "<think>a</think>b", "calls": [("get_weather", "{}")]}
    assert oneshot(parsing, req, text) == want
    for chunks in splits(encode(text)):
        assert stream(parsing, req, chunks) == {**want, "finish": "tool_calls"}


def test_thinking_disabled() -> None:
    parsing = make("glm45", "glm45")
    req = request(WEATHER, kwargs={"enable_thinking": False})
    text = "<think>a</think>b<tool_call>get_weather</tool_call>"
    want = {"reasoning": None, "content": "<think>a</think>b", "calls": [("get_weather", "{}")]}
    assert oneshot(parsing, req, text) == want
    for chunks in splits(encode(text)):
        assert stream(parsing, req, chunks) == {**want, "finish": "tool_calls"}


def test_tool_choice_none_drops_the_markup() -> None:
    parsing = make("glm45", "glm45")
    req = request(WEATHER, choice="none")
    text = "<think>x</think>Sure." + CITY_P
    assert oneshot(parsing, req, text) == {"reasoning": "x", "content": "Sure.", "calls": []}
    got = stream(parsing, req, [[i] for i in encode(text)])
    assert got == {"reasoning": "x", "content": "Sure.", "calls": [], "finish": "stop"}


def test_forced_choices_parse_the_native_format() -> None:
    parsing = make("glm45", "glm45")
    text = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>P</arg_value></tool_call>"
    for choice, finish in (
        ("required", "tool_calls"),
        ({"type": "function", "function": {"name": "get_weather"}}, "stop"),
    ):
        req = request(WEATHER, choice=choice)
        assert oneshot(parsing, req, text)["calls"] == [("get_weather", '{"city": "P"}')]
        got = stream(parsing, req, [[i] for i in encode(text)])
        assert (got["calls"], got["finish"]) == ([("get_weather", '{"city": "P"}')], finish)
