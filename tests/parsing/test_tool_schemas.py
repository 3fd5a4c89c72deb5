"""The engine tool parsers look tool schemas up in an index built once per request.

``glm45``, ``qwen3_coder``, ``qwen3_xml``, ``kimi_k2`` and ``mistral`` (v11+) check a call's
name against the request's tools and type its arguments by the tool's schema. Walking the
``tools`` list (or a schema's ``anyOf``/``enum``) per call or per argument event made a record's
cost grow with the number and size of the schemas; these tests count the walks.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import worker.core.parsing.engine.schema as schema_module
from tests.parsing_helpers import MistralV11StubTokenizer, qwen3_encode, qwen3_make, records, xml_request
from tests.parsing_helpers import qwen3 as qwen3_tokenizer
from worker.core.parsing import DeltaOut, ParseRequest
from worker.core.parsing.engine.schema import ToolSchemas, find_tool_properties, schema_types
from worker.core.parsing.families.mistral import MistralToolParser

N_TOOLS = 40
ARG_NAMES = ("path", "count", "mode")


def _tools() -> list[dict[str, Any]]:
    """``N_TOOLS`` tools; the called one, ``target``, is the last."""
    properties = {
        "path": {"type": "string"},
        "count": {"type": "integer"},
        "mode": {"anyOf": [{"type": "string"}, {"type": "null"}], "enum": ["a", "b", None]},
    }
    names = [f"tool_{i}" for i in range(N_TOOLS - 1)] + ["target"]
    return [
        {
            "type": "function",
            "function": {"name": n, "parameters": {"type": "object", "properties": properties}},
        }
        for n in names
    ]


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts every read of a tool entry and every schema-type walk (recursion included)."""
    counts: Counter[str] = Counter()

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            counts[name] += 1
            return real(*args)

        return wrapper

    monkeypatch.setattr(schema_module, "_function_of", counting("tool", schema_module._function_of))
    monkeypatch.setattr(schema_module, "schema_types", counting("types", schema_module.schema_types))
    return counts


def _xml_call(fmt: str, name: str, n_args: int) -> str:
    pairs = [(ARG_NAMES[i % 3], "7" if i % 3 == 1 else "a") for i in range(n_args)]
    if fmt == "glm45":
        body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs)
        return f"<tool_call>{name}{body}</tool_call>"
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in pairs)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def _kimi_calls(name: str, n_calls: int, n_args: int) -> str:
    args = json.dumps({f"k{i}": "v" for i in range(n_args)})
    calls = "".join(
        f"<|tool_call_begin|>functions.{name}:{n}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
        for n in range(n_calls)
    )
    return f"<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>"


def _stream_qwen3(parser: str, text: str, tools: list[dict[str, Any]]) -> list[DeltaOut | None]:
    """One token per record through a whole chat session."""
    req = xml_request(tools)
    session = qwen3_make(None, parser).new_stream(req, qwen3_encode("<|im_start|>assistant\n"))
    out = []
    recs = records(qwen3_tokenizer()[0], [[i] for i in qwen3_encode(text)])
    for n, (chunk, ids) in enumerate(recs):
        out.append(session.step(chunk, ids, "stop" if n == len(recs) - 1 else None)[0])
    return out


def _stream_mistral(
    name: str, n_calls: int, n_args: int, tools: list[dict[str, Any]]
) -> list[DeltaOut | None]:
    parser = MistralToolParser(MistralV11StubTokenizer(), tools, {})
    req = ParseRequest(tools=tools, tool_choice="auto")
    args = json.dumps({f"k{i}": "v" for i in range(n_args)})
    call = [("[TOOL_CALLS]", [9]), (name, [101]), ("[ARGS]", [32])] + [(c, [102]) for c in args]
    pieces = call * n_calls
    out = [parser.stream(text, ids, req) for text, ids in pieces]
    out.append(parser.finish_stream())
    return out


def _run(parser: str, name: str, n_calls: int, n_args: int) -> list[DeltaOut | None]:
    tools = _tools()
    if parser == "mistral":
        return _stream_mistral(name, n_calls, n_args, tools)
    if parser == "kimi_k2":
        text = _kimi_calls(name, n_calls, n_args)
    else:
        text = "".join(_xml_call(parser, name, n_args) for _ in range(n_calls))
    return _stream_qwen3(parser, "Sure. " + text, tools)


def _named(deltas: list[DeltaOut | None]) -> list[str]:
    return [
        c.function.name
        for d in deltas
        if d
        for c in d.tool_calls
        if c.function is not None and c.function.name
    ]


PARSERS = ["glm45", "qwen3_coder", "qwen3_xml", "kimi_k2", "mistral"]
#: distinct schemas the called tool's properties hold (each walked at most once per request)
SCHEMAS = 3 + 2  # path, count, mode and mode's two anyOf branches


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("name", ["target", "unknown"])
def test_the_tools_are_read_once_per_request_however_long_the_call(
    parser: str, name: str, walks: Counter[str]
) -> None:
    for n_calls, n_args in ((1, 2), (3, 12)):
        walks.clear()
        deltas = _run(parser, name, n_calls, n_args)
        # The calls really streamed (or, glm45 checking names, were refused): the lookups ran.
        assert _named(deltas) == ([] if name == "unknown" and parser == "glm45" else [name] * n_calls)
        assert walks["tool"] == N_TOOLS  # the index: each tool entry read once, at setup
        assert walks["types"] <= SCHEMAS


def test_the_index_answers_as_the_list_walk() -> None:
    tools: list[Any] = [
        "not a tool",
        {"type": "other", "function": {"name": "x", "parameters": {"properties": {"a": {}}}}},
        {"function": {"name": "x", "parameters": {"properties": {"b": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "x", "parameters": {"properties": {"c": {}}}}},
        {"type": "function", "function": {"name": "y", "parameters": {"properties": ["not", "a", "dict"]}}},
        {"type": "function", "function": {"name": "z", "parameters": None}},
        {"type": "function", "function": {"name": 3, "parameters": {}}},
    ]
    index = ToolSchemas(tools)
    for name in ("x", "y", "z", "w", "3"):
        assert index.properties(name) == find_tool_properties(tools, name)
    assert [index.has(n) for n in ("x", "y", "z", "w", "3")] == [True, True, True, False, False]
    schema = {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert index.types(schema) == schema_types(schema)
    assert index.types(schema) is index.types(schema)  # worked out once
    assert index.types("not a schema") == ["string"]
    assert index.string_keys("x") == set()  # b is an integer: nothing streams early
    assert index.string_keys("w") is None  # no schema: every key may
    assert ToolSchemas([{"function": {"name": "s", "parameters": {"properties": {"t": {}}}}}]).string_keys(
        "s"
    ) == {"t"}


def test_one_shot_calls_read_the_index_too(walks: Counter[str]) -> None:
    tools = _tools()
    text = "".join(_xml_call("qwen3_coder", "target", 6) for _ in range(5))
    req = xml_request(tools)
    message = qwen3_make(None, "qwen3_coder").parse_full(text, qwen3_encode(text), req, None)
    assert [c.name for c in message.tool_calls] == ["target"] * 5
    assert json.loads(message.tool_calls[0].arguments)["count"] == 7  # typed by the schema
    assert walks["tool"] == N_TOOLS and walks["types"] <= SCHEMAS
