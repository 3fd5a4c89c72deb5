"""``kimi_k2`` tool parser (no golden file): behaviour read from vLLM 0.33.0's source.

Tokenizer: the real Qwen3 tokenizer in ``samples/models/qwen3``. It has no
Kimi special tokens, so the Kimi markup (``<|tool_calls_section_begin|>``,
``<|tool_call_begin|>``, ``<|tool_call_argument_begin|>``, ...) is spelled as
plain text over several tokens and is matched by the engine's text lexer;
splitting the token list at every position therefore splits every marker at
every token boundary. Qwen3's own special tokens are dropped by the engine.
Where vLLM's streaming and one-shot disagree, the tests say so.
"""

from __future__ import annotations

import json
from typing import Any

from tests.parsing_helpers import SampleHarness, create_parsing, qwen3_encode, splits
from worker.core.parsing import ChatParsing, ParseRequest, TokenizerAdapter, adapter_for

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
BEGIN, ARG, END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def call(header: str, args: str) -> str:
    return f"{BEGIN}{header}{ARG}{args}{END}"


CALLS = (
    SECTION_BEGIN
    + call("functions.get_weather:0", '{"city": "Tokyo"}')
    + call("functions.get_time:1", '{"tz": "Asia/Tokyo"}')
    + SECTION_END
)
TEXT = "Let me look.\n" + CALLS


HARNESS = SampleHarness("qwen3", prompt=tuple(qwen3_encode("<|im_start|>assistant\n")))
encode, decode = HARNESS.encode, HARNESS.decode


def parsing(model_type: str | None = None, reasoning: str | None = None) -> ChatParsing:
    adapter: TokenizerAdapter = adapter_for(HARNESS.tokenizer)
    if model_type is not None:
        adapter.model_type = model_type
    return create_parsing(adapter, reasoning, "kimi_k2")


PARSING = parsing()


def request(choice: Any = "auto", messages: list[dict[str, Any]] | None = None) -> ParseRequest:
    return ParseRequest(tools=TOOLS, tool_choice=choice, messages=messages or [])


def stream(
    chunks: list[list[int]],
    req: ParseRequest | None = None,
    last: str = "stop",
    chat: ChatParsing = PARSING,
) -> dict[str, Any]:
    got = HARNESS.stream(chat, req or request(), chunks, last)
    ids = dict(got.ids)  # the last id sent per call
    return {
        "content": got.content,
        "calls": [(ids.get(i), got.names[i], got.args.get(i, "")) for i in sorted(got.names)],
        "finish": got.finish,
    }


def oneshot(text: str, req: ParseRequest | None = None, chat: ChatParsing = PARSING) -> dict[str, Any]:
    msg = HARNESS.oneshot(chat, req or request(), text)
    return {"content": msg.content, "calls": [(c.id, c.name, c.arguments) for c in msg.tool_calls]}


def test_stream_matches_oneshot_at_every_split() -> None:
    ids = encode(TEXT)
    want = oneshot(TEXT)
    assert want == {
        "content": "Let me look.\n",
        "calls": [
            ("functions.get_weather:0", "get_weather", '{"city": "Tokyo"}'),
            ("functions.get_time:1", "get_time", '{"tz": "Asia/Tokyo"}'),
        ],
    }
    for chunks in splits(ids):
        got = stream(chunks)
        assert got == {**want, "finish": "tool_calls"}, [len(c) for c in chunks]


def test_streamed_args_are_valid_json_equal_to_oneshot() -> None:
    got = stream([[i] for i in encode(TEXT)])
    for (_, _, streamed), (_, _, expected) in zip(got["calls"], oneshot(TEXT)["calls"], strict=True):
        assert json.loads(streamed) == json.loads(expected)


def test_header_ids_are_used_verbatim_whatever_the_history() -> None:
    """The model numbers its calls itself (its template counts the history); vLLM keeps that id."""
    history = [{"role": "assistant", "tool_calls": [{"id": "functions.get_time:0"}]}]
    text = SECTION_BEGIN + call("functions.get_time:7", "{}") + SECTION_END
    assert oneshot(text, request(messages=history))["calls"] == [("functions.get_time:7", "get_time", "{}")]
    assert stream([[i] for i in encode(text)], request(messages=history))["calls"] == [
        ("functions.get_time:7", "get_time", "{}")
    ]


def test_generated_id_for_a_header_without_index() -> None:
    """A header without ``:N`` is taken as the name; the id is generated.

    Kimi model types get ``functions.NAME:K`` with K counted by the tool
    adapter's own engine from 0: in vLLM 0.33.0 the conversation's history
    count is only seeded into the outer parser, so two calls already in the
    history do not shift it. Other model types get a random id.
    """
    history = [{"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]}]
    text = SECTION_BEGIN + call("get_time", "") + SECTION_END
    kimi = parsing("kimi_k2")
    req = request(messages=history)
    assert oneshot(text, req, kimi)["calls"] == [("functions.get_time:0", "get_time", "{}")]
    assert stream([[i] for i in encode(text)], req, chat=kimi)["calls"] == [
        ("functions.get_time:0", "get_time", "")
    ]
    (call_id, _, _) = oneshot(text, req)["calls"][0]
    assert call_id.startswith("chatcmpl-tool-")


def test_name_found_only_in_arguments_streams_no_arguments() -> None:
    """vLLM quirk: with an unparsable header the call is announced only at its end, with empty arguments."""
    body = '{"name": "get_time", "tz": "UTC"}'
    text = SECTION_BEGIN + call("get_time", body) + SECTION_END
    got = stream([[i] for i in encode(text)])
    assert [(name, args) for _, name, args in got["calls"]] == [("get_time", "")]
    assert [(name, args) for _, name, args in oneshot(text)["calls"]] == [("get_time", body)]


def test_text_after_the_section_is_dropped_and_blank_content_too() -> None:
    text = "\n\n" + CALLS + "\nanything after"
    want = oneshot(text)
    assert want["content"] is None
    assert [c[1] for c in want["calls"]] == ["get_weather", "get_time"]
    got = stream([[i] for i in encode(text)])
    assert got["content"] is None
    assert got["calls"] == want["calls"]


def test_tool_choice_none_returns_content_without_markup() -> None:
    req = request("none")
    assert oneshot(TEXT, req) == {"content": "Let me look.\n", "calls": []}
    got = stream([[i] for i in encode(TEXT)], req)
    assert got == {"content": "Let me look.\n", "calls": [], "finish": "stop"}


def test_oneshot_coerces_argument_types_streaming_does_not() -> None:
    """vLLM quirk: one-shot re-serializes arguments to the tool schema's types."""
    text = SECTION_BEGIN + call("functions.get_weather:0", '{"city": "Tokyo", "days": "3"}') + SECTION_END
    assert oneshot(text)["calls"][0][2] == '{"city": "Tokyo", "days": 3}'
    assert stream([[i] for i in encode(text)])["calls"][0][2] == '{"city": "Tokyo", "days": "3"}'


def test_broken_json_passes_through_raw() -> None:
    args = '{"city": Tokyo}'
    text = SECTION_BEGIN + call("functions.get_weather:0", args) + SECTION_END
    assert oneshot(text)["calls"][0][2] == args
    assert stream([[i] for i in encode(text)])["calls"][0][2] == args


def test_length_cut_mid_arguments() -> None:
    """Both paths keep the open call; streaming releases the text it has, one-shot too."""
    text = SECTION_BEGIN + call("functions.get_weather:0", '{"city": "Tok')
    ids = encode(text)[:-3]  # cut inside the arguments, before the end marker
    cut = decode(ids)
    got = stream([[i] for i in ids], last="length")
    assert got["finish"] == "length"
    partial = cut.split(ARG)[1]
    assert got["calls"] == [("functions.get_weather:0", "get_weather", partial)]
    assert oneshot(cut)["calls"] == [("functions.get_weather:0", "get_weather", partial)]


def test_think_markup_without_reasoning_parser_is_content() -> None:
    text = "a</think>b" + CALLS
    assert oneshot(text)["content"] == "a</think>b"
    assert stream([[i] for i in encode(text)])["content"] == "a</think>b"


def test_required_parses_the_native_format() -> None:
    """Kimi has an xgrammar structural tag: strict tool calling parses ``required`` like ``auto``."""
    assert oneshot(CALLS, request("required"))["calls"] == oneshot(CALLS)["calls"]
    named = request({"type": "function", "function": {"name": "get_time"}})
    got = stream([[i] for i in encode(CALLS)], named)
    assert [c[1] for c in got["calls"]] == ["get_weather", "get_time"]
    assert got["finish"] == "stop"
