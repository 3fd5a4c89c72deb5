"""``qwen3_xml``: the same vLLM class as ``qwen3_coder``, here beside the ``qwen3`` reasoning parser.

Tokenizer: the real Qwen3 tokenizer in ``samples/models/qwen3``; ``<think>``,
``</think>``, ``<tool_call>`` and ``</tool_call>`` are single special tokens,
the ``<function=``/``<parameter=`` markup spans several ordinary tokens, so a
split at every token position splits every marker. Expectations where
streaming and one-shot differ are vLLM's actual behaviour (see
``test_qwen3_coder``).
"""

from __future__ import annotations

import pytest

from tests.parsing_helpers import qwen3_encode as encode
from tests.parsing_helpers import qwen3_make as make
from tests.parsing_helpers import qwen3_oneshot as oneshot
from tests.parsing_helpers import splits
from tests.parsing_helpers import xml_request as request
from tests.parsing_helpers import xml_stream as stream

THINK_THEN_CALL = (
    "<think>\nI need the tests.\n</think>\n\nRunning them.\n"
    "<tool_call>\n<function=run_tests>\n<parameter=path>\ntests/\n</parameter>\n"
    "<parameter=max_failures>\n2\n</parameter>\n</function>\n</tool_call>"
)
CALL = ("run_tests", '{"path": "tests/", "max_failures": 2}')
PATH_T_CALL = (
    "<tool_call>\n<function=run_tests>\n<parameter=path>\nt\n</parameter>\n</function>\n</tool_call>"
)


def test_oneshot_reasoning_content_and_call() -> None:
    got = oneshot(make("qwen3", "qwen3_xml"), request(), THINK_THEN_CALL)
    assert got == {"reasoning": "\nI need the tests.\n", "content": "Running them.", "calls": [CALL]}


def test_stream_matches_oneshot_at_every_split() -> None:
    parsing = make("qwen3", "qwen3_xml")
    req = request()
    want = oneshot(parsing, req, THINK_THEN_CALL)
    for chunks in splits(encode(THINK_THEN_CALL)):
        got = stream(parsing, req, chunks)
        sizes = [len(c) for c in chunks]
        assert got["reasoning"] == want["reasoning"], sizes
        assert got["calls"] == want["calls"] == [CALL], sizes
        assert got["finish"] == "tool_calls"
        # vLLM quirks: one-shot strips the content; streaming sends the
        # blank line after </think> first, unless </think> and the blank
        # line share a record, when it is held and flushed only at the end.
        assert got["content"] in ("\n\nRunning them.\n", "Running them.\n\n\n"), sizes


def test_tool_call_inside_reasoning_ends_it() -> None:
    parsing = make("qwen3", "qwen3_xml")
    req = request()
    text = "<think>\nstraight to it\n" + PATH_T_CALL
    want = {"reasoning": "\nstraight to it\n", "content": None, "calls": [("run_tests", '{"path": "t"}')]}
    assert oneshot(parsing, req, text) == want
    for chunks in splits(encode(text)):
        assert stream(parsing, req, chunks) == {**want, "finish": "tool_calls"}


def test_without_reasoning_parser_think_markup_is_content() -> None:
    parsing = make(None, "qwen3_xml")
    req = request()
    text = "<think>\nhmm\n</think>\n\nOK.<tool_call>\n<function=run_tests>\n</function>\n</tool_call>"
    want = {"reasoning": None, "content": "<think>\nhmm\n</think>\n\nOK.", "calls": [("run_tests", "{}")]}
    assert oneshot(parsing, req, text) == want
    for chunks in splits(encode(text)):
        assert stream(parsing, req, chunks) == {**want, "finish": "tool_calls"}


def test_stray_think_end_in_content_is_swallowed() -> None:
    """With a reasoning parser, the tool phase drops a second ``</think>``."""
    parsing = make("qwen3", "qwen3_xml")
    req = request()
    text = "<think>a</think>b</think>c"
    assert oneshot(parsing, req, text) == {"reasoning": "a", "content": "bc", "calls": []}
    for chunks in splits(encode(text)):
        got = stream(parsing, req, chunks)
        assert (got["reasoning"], got["content"], got["calls"]) == ("a", "bc", [])


def test_enable_thinking_false_starts_in_content() -> None:
    parsing = make("qwen3", "qwen3_xml")
    req = request(kwargs={"enable_thinking": False})
    text = "Sure.\n" + PATH_T_CALL
    want = {"reasoning": None, "content": "Sure.", "calls": [("run_tests", '{"path": "t"}')]}
    assert oneshot(parsing, req, text) == want
    got = stream(parsing, req, [[i] for i in encode(text)])
    assert got == {**want, "content": "Sure.\n", "finish": "tool_calls"}


@pytest.mark.parametrize("finish", ["length"])
def test_broken_call_cut_in_parameter_name(finish: str) -> None:
    """Cut inside ``<parameter=NAME``: the half-open tag holds; the call closes empty at the end."""
    parsing = make("qwen3", "qwen3_xml")
    req = request()
    text = "<think>x</think><tool_call>\n<function=run_tests>\n<parameter=pa"
    assert oneshot(parsing, req, text)["calls"] == [("run_tests", "{}")]
    for chunks in splits(encode(text)):
        got = stream(parsing, req, chunks, finish=finish)
        assert got["calls"] == [("run_tests", "{}")]
        assert got["content"] is None
