"""A streamed call's id is pinned per index; an index the pin list cannot hold is vLLM's 400.

vLLM's ``deepseek_v31`` parser sends a call's name at index -1 when the call-begin token came
in a record before the calls-begin token: it counts that begin as old and never moves its call
index off -1. vLLM's derenderer then reads its pinned ids at index -1; on an empty list that is
an ``IndexError``, which its endpoint answers with 400 "invalid stream_state: derender failed".
Every parser's deltas go through the same pin step, so the pin rule is tested on its own too.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.golden_cases import derenderer_for
from tests.parsing_helpers import DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALLS_BEGIN, DEEPSEEK_SEP, DEEPSEEK_V3
from worker.core.derenderer import Derenderer, pin_tool_call_ids
from worker.core.envelope_processor import EnvelopeProcessor
from worker.errors import RequestError

PROMPT = [0, 128803, 6127, 128804]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _derenderer() -> Derenderer:
    return derenderer_for(
        {
            "model_dir": "deepseek-v3",
            "served_model_name": "test-model",
            "tool_parser": "deepseek_v31",
            "enable_auto_tool_choice": True,
        }
    )


def _record(seq: int, ids: list[int], *, state: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {
        "stream": True,
        "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": ids}]},
    }
    if seq == 0 or state is not None:
        body |= {
            "model": "test-model",
            "prompt_token_ids": PROMPT,
            "chat_request": {
                "model": "test-model",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": TOOLS,
            },
        }
    if state is not None:
        body["stream_state"] = state
    return orjson.dumps({"request_id": "r", "seq": seq, "endpoint": "chat", "body": body})


#: the call-begin token first, the calls-begin token a record later: the name goes out at index -1
FIRST = [DEEPSEEK_V3.token_id(DEEPSEEK_CALL_BEGIN)]
SECOND = [
    *DEEPSEEK_V3.encode("f"),
    DEEPSEEK_V3.token_id(DEEPSEEK_SEP),
    DEEPSEEK_V3.token_id(DEEPSEEK_CALLS_BEGIN),
]


def test_a_name_at_index_minus_one_with_no_pinned_id_is_vllms_400() -> None:
    processor = EnvelopeProcessor(_derenderer())
    first = processor.process(_record(0, FIRST))
    assert first.output is not None and "error" not in first.output
    failed = processor.process(_record(1, SECOND))
    assert failed.output is not None
    assert failed.internal_error is None  # vLLM's answer for this stream, not a bug of ours
    assert failed.output["error"]["code"] == 400
    assert failed.output["error"]["message"] == "invalid stream_state: derender failed"
    # As in vLLM, where the client keeps its last state: the failed record does not advance it.
    state = processor.requests["r"].sequences[0]
    assert state.output_token_ids == FIRST and state.last_tool_call_ids == []


def test_the_same_stream_from_carried_state_is_the_same_400() -> None:
    first = EnvelopeProcessor(_derenderer()).process(_record(0, FIRST))
    assert first.output is not None
    carried = first.stream_state()
    failed = EnvelopeProcessor(_derenderer()).process(_record(1, SECOND, state=carried))
    assert failed.output is not None and failed.internal_error is None
    assert failed.output["error"]["code"] == 400


def test_index_minus_one_with_a_pinned_id_takes_the_last_one_as_in_vllm() -> None:
    state = EnvelopeProcessor(_derenderer()).process(_record(0, FIRST)).stream_state()
    assert state is not None
    carried = state | {"last_tool_call_ids": ["chatcmpl-tool-pinned"]}
    out = EnvelopeProcessor(_derenderer()).process(_record(1, SECOND, state=carried))
    assert out.output is not None and "error" not in out.output
    [call] = out.output["body"]["chunk"]["choices"][0]["delta"]["tool_calls"]
    assert (call["index"], call["id"], call["function"]["name"]) == (-1, "chatcmpl-tool-pinned", "f")


def _calls(*pairs: tuple[int, str | None]) -> dict[str, Any]:
    return {"tool_calls": [{"index": i, "id": c} for i, c in pairs]}


@pytest.mark.parametrize(
    ("pinned", "delta", "want_ids", "want_pinned"),
    [
        ([], _calls((0, "a")), ["a"], ["a"]),
        (["a"], _calls((0, "b")), ["a"], ["a"]),  # a rebuilt session's fresh id gives way
        (["a"], _calls((1, "b"), (0, None)), ["b", None], ["a", "b"]),
        (["a", "b"], _calls((-1, "c")), ["b"], ["a", "b"]),  # Python's index, as vLLM reads it
        (["a", "b"], _calls((-2, "c")), ["a"], ["a", "b"]),
        ([], _calls((3, "c")), ["c"], ["c"]),  # appended, not placed: vLLM's order
    ],
)
def test_pin_rule(
    pinned: list[str], delta: dict[str, Any], want_ids: list[str | None], want_pinned: list[str]
) -> None:
    pin_tool_call_ids(delta, pinned)
    assert [c["id"] for c in delta["tool_calls"]] == want_ids
    assert pinned == want_pinned


@pytest.mark.parametrize(("pinned", "index"), [([], -1), (["a"], -2)])
def test_an_index_before_the_first_pinned_id_is_a_400(pinned: list[str], index: int) -> None:
    with pytest.raises(RequestError) as failed:
        pin_tool_call_ids(_calls((index, "z")), list(pinned))
    assert failed.value.code == 400


def test_a_400_leaves_the_pinned_ids_as_they_were() -> None:
    pinned = ["a"]
    with pytest.raises(RequestError):
        pin_tool_call_ids(_calls((1, "b"), (-3, "z")), pinned)
    assert pinned == ["a"]
