"""``qwen3_coder``: vLLM 0.33.0's ``Qwen3EngineToolParser`` beyond the golden file.

Tokenizer: the real Qwen3 tokenizer in ``samples/models/qwen3`` (the family's
own): ``<tool_call>``/``</tool_call>`` are single special tokens there, while
``<function=``, ``<parameter=`` and their closers are spelled by several
ordinary tokens, so splitting a generation at every token position splits
those markers at every possible place.

Expectations where streaming and one-shot differ are vLLM's actual
behaviour, checked against vLLM's own parser-engine code (its
``Qwen3Parser``/``Glm47MoeParser`` run under the tool adapter's calls) on
these and on thousands of generated outputs.

The harness (shared with the ``qwen3_xml`` and ``glm45`` tests) is the
XML-tool one of ``tests.parsing_helpers``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.parsing_helpers import qwen3_encode as encode
from tests.parsing_helpers import qwen3_make as make
from tests.parsing_helpers import qwen3_oneshot as oneshot
from tests.parsing_helpers import qwen3_stream_deltas as stream_deltas
from tests.parsing_helpers import splits
from tests.parsing_helpers import xml_request as request
from tests.parsing_helpers import xml_stream as stream
from worker.core.parsing.registry import tool_parsers

# -- qwen3_coder ---------------------------------------------------------------

VALUE = 'def is_less(a, b):\n    """a < b, naïve <= is "wrong"."""\n    return a < b'
TWO_CALLS = (
    "I'll save it, then run the tests.\n"
    "<tool_call>\n<function=write_file>\n"
    "<parameter=path>\nsrc/compare.py\n</parameter>\n"
    f"<parameter=content>\n{VALUE}\n</parameter>\n"
    "</function>\n</tool_call>\n"
    "<tool_call>\n<function=run_tests>\n"
    "<parameter=path>\ntests/\n</parameter>\n"
    "<parameter=max_failures>\n3\n</parameter>\n"
    "<parameter=verbose>\ntrue\n</parameter>\n"
    "</function>\n</tool_call>"
)
EXPECTED_CALLS = [
    ("write_file", json.dumps({"path": "src/compare.py", "content": VALUE}, ensure_ascii=False)),
    ("run_tests", '{"path": "tests/", "max_failures": 3, "verbose": true}'),
]


def test_registered_under_vllm_names() -> None:
    known = tool_parsers()
    assert known["qwen3_coder"] is known["qwen3_xml"]
    assert known["qwen3_coder"].__name__ == "Qwen3EngineToolParser"
    assert known["qwen3_coder"].engine_based and not known["qwen3_coder"].supports_required_and_named


def test_oneshot_two_calls() -> None:
    got = oneshot(make(None, "qwen3_coder"), request(), TWO_CALLS)
    assert got == {"reasoning": None, "content": "I'll save it, then run the tests.", "calls": EXPECTED_CALLS}


def test_stream_matches_oneshot_at_every_split() -> None:
    parsing = make(None, "qwen3_coder")
    req = request()
    want = oneshot(parsing, req, TWO_CALLS)
    for chunks in splits(encode(TWO_CALLS)):
        got = stream(parsing, req, chunks)
        assert got["calls"] == want["calls"], [len(c) for c in chunks]
        assert got["finish"] == "tool_calls"
        # vLLM quirk: one-shot strips the content; streaming already sent its
        # trailing newline, and the newline between the calls streams too
        # unless it lands in a record that also carries call deltas up to the end.
        assert got["content"] in (want["content"] + "\n", want["content"] + "\n\n"), [len(c) for c in chunks]


def test_streamed_arguments_are_valid_json_equal_to_oneshot() -> None:
    parsing = make(None, "qwen3_coder")
    req = request()
    for chunks in ([[i] for i in encode(TWO_CALLS)], [encode(TWO_CALLS)]):
        got = stream(parsing, req, chunks)
        for (name, args), (want_name, want_args) in zip(got["calls"], EXPECTED_CALLS, strict=True):
            assert name == want_name
            assert args == want_args
            assert json.loads(args) == json.loads(want_args)


def test_typed_values_wait_for_their_closing_tag() -> None:
    """An integer streams only once closed (its JSON could still change); strings stream as they grow."""
    parsing = make(None, "qwen3_coder")
    pieces = [
        "<tool_call>\n<function=run_tests>\n<parameter=path>\nte",
        "sts/",
        "\n</parameter>\n<parameter=max_failures>\n1",
        "2",
        "\n</parameter>\n</function>\n</tool_call>",
    ]
    deltas, _ = stream_deltas(parsing, request(), [encode(p) for p in pieces])
    args = [
        "".join(c.function.arguments or "" for c in d.tool_calls if c.function) if d else None for d in deltas
    ]
    assert args == ['{"path": "te', "sts/", '", "max_failures": ', None, "12}"]


def test_hermes_style_json_in_tool_call_vanishes() -> None:
    """Broken call: no ``<function=`` inside ``<tool_call>`` — no call and no content, both ways."""
    parsing = make(None, "qwen3_coder")
    req = request()
    text = 'ok <tool_call>\n{"name": "run_tests", "arguments": {"path": "x"}}\n</tool_call> done'
    assert oneshot(parsing, req, text) == {"reasoning": None, "content": "ok  done", "calls": []}
    for chunks in splits(encode(text)):
        got = stream(parsing, req, chunks)
        assert got == {"reasoning": None, "content": "ok  done", "calls": [], "finish": "stop"}


def test_unclosed_function_name_streams_raw_name() -> None:
    """``<function=NAME`` without ``>`` ends at ``</tool_call>``: streaming keeps the raw name."""
    parsing = make(None, "qwen3_coder")
    req = request()
    text = "<tool_call>\n<function=run_tests\n</tool_call>"
    assert oneshot(parsing, req, text)["calls"] == [("run_tests", "{}")]
    got = stream(parsing, req, [[i] for i in encode(text)])
    assert got["calls"] == [("run_tests\n", "{}")]


def test_cut_inside_a_value_leaves_streamed_json_open() -> None:
    """``length`` inside a value: the stream is never closed; one-shot drops the open parameter."""
    parsing = make(None, "qwen3_coder")
    req = request()
    text = "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
    text += "<parameter=content>\nx = 1 <"
    assert oneshot(parsing, req, text)["calls"] == [("write_file", '{"path": "a.py"}')]
    for chunks in splits(encode(text)):
        got = stream(parsing, req, chunks, finish="length")
        assert got["calls"] == [("write_file", '{"path": "a.py", "content": "x = 1 <')]
        assert got["finish"] == "length"


def test_cut_between_parameters_closes_streamed_json() -> None:
    parsing = make(None, "qwen3_coder")
    req = request()
    text = "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<para"
    assert oneshot(parsing, req, text)["calls"] == [("write_file", '{"path": "a.py"}')]
    for chunks in splits(encode(text)):
        assert stream(parsing, req, chunks, finish="length")["calls"] == [("write_file", '{"path": "a.py"}')]


def test_content_after_a_call_is_lost_oneshot_but_streams() -> None:
    """vLLM quirk: one-shot keeps only text before tool markup; streaming shows the rest."""
    parsing = make(None, "qwen3_coder")
    req = request()
    text = "Saving.\n<tool_call>\n<function=write_file>\n<parameter=path>\na\n</parameter>\n"
    text += "</function>\n</tool_call>\nDone."
    assert oneshot(parsing, req, text) == {
        "reasoning": None,
        "content": "Saving.",
        "calls": [("write_file", '{"path": "a"}')],
    }
    got = stream(parsing, req, [[i] for i in encode(text)])
    assert got["content"] == "Saving.\n\nDone."
    assert got["calls"] == [("write_file", '{"path": "a"}')]


def test_function_without_tool_call_wrapper() -> None:
    parsing = make(None, "qwen3_coder")
    req = request()
    text = "<function=run_tests>\n<parameter=path>\nt\n</parameter>\n</function>"
    assert oneshot(parsing, req, text)["calls"] == [("run_tests", '{"path": "t"}')]
    assert stream(parsing, req, [[i] for i in encode(text)])["calls"] == [("run_tests", '{"path": "t"}')]


def test_tool_choice_none_drops_the_markup() -> None:
    parsing = make(None, "qwen3_coder")
    req = request(choice="none")
    text = "Sure.<tool_call>\n<function=run_tests>\n</function>\n</tool_call>"
    assert oneshot(parsing, req, text) == {"reasoning": None, "content": "Sure.", "calls": []}
    got = stream(parsing, req, [[i] for i in encode(text)])
    assert got == {"reasoning": None, "content": "Sure.", "calls": [], "finish": "stop"}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "run_tests"}}])
def test_forced_choices_parse_the_native_format(choice: str | dict[str, Any]) -> None:
    parsing = make(None, "qwen3_coder")
    req = request(choice=choice)
    text = "<tool_call>\n<function=run_tests>\n<parameter=path>\nt\n</parameter>\n</function>\n</tool_call>"
    assert oneshot(parsing, req, text)["calls"] == [("run_tests", '{"path": "t"}')]
    got = stream(parsing, req, [[i] for i in encode(text)])
    assert got["calls"] == [("run_tests", '{"path": "t"}')]
    assert got["finish"] == ("stop" if isinstance(choice, dict) else "tool_calls")
