"""``deepseek_v31`` tool parser beyond the golden file.

Tokenizer: the real DeepSeek-V3 tokenizer in ``samples/models/deepseek-v3``,
where every marker (``<｜tool▁calls▁begin｜>``, ``<｜tool▁call▁begin｜>``,
``<｜tool▁sep｜>``, ``<｜tool▁call▁end｜>``, ``<｜tool▁calls▁end｜>``) is one token.
vLLM decides from token-id counts, so splitting the token list covers every
marker boundary. Where vLLM's streaming loses text that its one-shot parse
keeps, the tests assert vLLM's streaming behaviour and say so.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from tests.parsing_helpers import (
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_SEP,
    DEEPSEEK_V3,
    create_parsing,
)
from worker.core.parsing import ChatParsing, ParseRequest, adapter_for

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
B, E = DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALL_END
SEP = DEEPSEEK_SEP
CALLS = (
    "<｜tool▁calls▁begin｜>"
    + f'{B}get_weather{SEP}{{"city": "北京", "unit": "celsius"}}{E}'
    + f'{B}get_time{SEP}{{"tz": "Europe/Paris"}}{E}'
    + "<｜tool▁calls▁end｜>"
)
TEXT = "我来查询。" + CALLS


HARNESS = DEEPSEEK_V3
encode, token_id = HARNESS.encode, HARNESS.token_id


@cache
def parsing() -> ChatParsing:
    return create_parsing(adapter_for(HARNESS.tokenizer), None, "deepseek_v31")


def request(choice: str = "auto") -> ParseRequest:
    return ParseRequest(tools=TOOLS, tool_choice=choice)


def stream(chunks: list[list[int]], req: ParseRequest | None = None, last: str = "stop") -> dict[str, Any]:
    got = HARNESS.stream(parsing(), req or request(), chunks, last)
    return {"content": got.content, "calls": got.calls, "ids": [i for _, i in got.ids], "finish": got.finish}


def oneshot(text: str, req: ParseRequest | None = None) -> dict[str, Any]:
    msg = HARNESS.oneshot(parsing(), req or request(), text)
    return {"content": msg.content, "calls": [(c.name, c.arguments) for c in msg.tool_calls]}


def test_one_token_records_match_oneshot() -> None:
    got = stream([[i] for i in encode(TEXT)])
    want = oneshot(TEXT)
    assert got["calls"] == want["calls"]
    assert got["content"] == want["content"] == "我来查询。"
    assert got["finish"] == "tool_calls"
    assert len(set(got["ids"])) == 2 and all(i.startswith("chatcmpl-tool-") for i in got["ids"])


def test_streamed_args_are_valid_json_equal_to_oneshot() -> None:
    got = stream([[i] for i in encode(TEXT)])
    for (_, streamed), (_, expected) in zip(got["calls"], oneshot(TEXT)["calls"], strict=True):
        assert json.loads(streamed) == json.loads(expected)
        assert streamed == expected


def test_every_adjacent_token_pair_in_one_record() -> None:
    """Markers meet text at every boundary: two tokens share a record, the rest come one per record.

    vLLM's streaming agrees with its one-shot parse here. It does not when a
    record holds a call's end marker with closing text other than ``"}`` or
    with the next call's name: both quirks are asserted in the tests below.
    """
    ids = encode(TEXT)
    want = oneshot(TEXT)
    for k in range(len(ids) - 1):
        chunks = [[i] for i in ids[:k]] + [ids[k : k + 2]] + [[i] for i in ids[k + 2 :]]
        got = stream(chunks)
        assert got["calls"] == want["calls"], k
        assert got["content"] == want["content"]


def test_closing_record_without_quote_brace_drops_its_text() -> None:
    """vLLM quirk: the record that closes a call streams only up to its last ``"}``."""
    ids = encode(f'<｜tool▁calls▁begin｜>{B}get_time{SEP}{{"n": 5}}{E}<｜tool▁calls▁end｜>')
    end_at = ids.index(token_id(E))
    # '}' and the end marker arrive together: the brace is lost in streaming.
    chunks = (
        [[i] for i in ids[: end_at - 1]] + [ids[end_at - 1 : end_at + 1]] + [[i] for i in ids[end_at + 1 :]]
    )
    got = stream(chunks)
    assert got["calls"] == [("get_time", '{"n": 5')]
    assert oneshot(HARNESS.tokenizer.backend.decode(ids, skip_special_tokens=False))["calls"] == [
        ("get_time", '{"n": 5}')
    ]


def test_end_and_next_begin_in_one_record_loses_previous_tail() -> None:
    """vLLM quirk (visible in the golden file too): only the new call's name streams."""
    text = TEXT
    ids = encode(text)
    sep_id = token_id(SEP)
    first_end = ids.index(token_id(E))
    second_sep = [i for i, t in enumerate(ids) if t == sep_id][1]
    chunks = [[i] for i in ids[: first_end - 1]] + [ids[first_end - 1 : second_sep + 1]]
    chunks += [[i] for i in ids[second_sep + 1 :]]
    got = stream(chunks)
    assert got["calls"][0] == ("get_weather", '{"city": "北京", "unit": "celsius')
    assert got["calls"][1] == oneshot(text)["calls"][1]


def test_length_cut_keeps_streamed_prefix_but_oneshot_only_complete_calls() -> None:
    ids = encode(TEXT)
    end_id = token_id(E)
    cut = ids[: ids.index(end_id, ids.index(end_id) + 1) - 2]
    got = stream([[i] for i in cut], last="length")
    assert got["finish"] == "length"
    assert got["calls"][0] == ("get_weather", '{"city": "北京", "unit": "celsius"}')
    assert got["calls"][1][0] == "get_time" and not got["calls"][1][1].endswith("}")
    want = oneshot(HARNESS.tokenizer.backend.decode(cut, skip_special_tokens=False))
    assert want["calls"] == [("get_weather", '{"city": "北京", "unit": "celsius"}')]


def test_broken_json_streams_raw_and_oneshot_keeps_it_raw() -> None:
    """Arguments are never parsed: broken JSON passes through both paths unchanged."""
    text = f'<｜tool▁calls▁begin｜>{B}get_weather{SEP}{{"city": Paris"}}{E}<｜tool▁calls▁end｜>'
    assert oneshot(text)["calls"] == [("get_weather", '{"city": Paris"}')]
    got = stream([[i] for i in encode(text)])
    assert got["calls"] == [("get_weather", '{"city": Paris"}')]


def test_content_only_and_section_marker_alone() -> None:
    assert oneshot("just text") == {"content": "just text", "calls": []}
    assert stream([[i] for i in encode("just text")])["content"] == "just text"
    # The calls-begin marker alone counts as "tools called" with no calls.
    text = "hi<｜tool▁calls▁begin｜>"
    assert oneshot(text) == {"content": "hi", "calls": []}


def test_required_parses_the_native_format() -> None:
    req = request("required")
    text = CALLS
    assert oneshot(text, req)["calls"] == oneshot(text)["calls"]
    assert stream([[i] for i in encode(text)], req)["calls"] == oneshot(text)["calls"]


def test_every_two_record_split_streams_prefixes_of_the_oneshot_calls() -> None:
    """Two records at every cut: vLLM's counting may lose text but never invents any.

    A record holding whole calls is judged by its token counts alone, so its
    leading content, call text and even whole calls can vanish (vLLM's behaviour).
    """
    ids = encode(TEXT)
    want = oneshot(TEXT)
    for k in range(1, len(ids)):
        got = stream([ids[:k], ids[k:]])
        assert len(got["calls"]) <= len(want["calls"]), k
        for name, args in got["calls"]:
            # A record holding several begin markers counts as one new call, so
            # a later call can stream at an earlier index.
            assert any(name == n and a.startswith(args) for n, a in want["calls"]), k
        assert "我来查询。".startswith(got["content"] or ""), k
