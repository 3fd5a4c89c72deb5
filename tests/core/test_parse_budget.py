"""The parse budget: a request whose tool calls vLLM re-reads at every record fails, valid ones never do.

Output shaped so (here a ``hermes`` call nested 300 deep, past the depth from which the body is
parsed whole) costs O(the call) per record in vLLM, without end. The worker answers as vLLM does
until the re-reads pass the budget, then fails the request with a 400; the count is of
characters, so the warm path, the evicted one and a replay from the carried state agree.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.golden_cases import derenderer_for, normalize, sample_config
from tests.parsing_helpers import WEATHER_REQUEST, sample_tokenizer, stream_summary, tool_parsing
from tests.stream_builders import chat_stream, written
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.parsing.composite import REREAD_TEXT_FACTOR
from worker.errors import ParseBudgetExceededError

JsonDict = dict[str, Any]
PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
]
DEEP = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"a": ' + "[" * 300 + ", ".join(map(str, range(400)))
)


def _records(text: str, model: str = "qwen3") -> list[JsonDict]:
    ids: list[int] = sample_tokenizer(model).backend.encode(text, add_special_tokens=False).ids
    request = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    return chat_stream("r", [[token] for token in ids], prompt_token_ids=PROMPT, chat_request=request)


def _config(window: int | None, model: str = "qwen3", parser: str = "hermes") -> JsonDict:
    return sample_config(
        parsers=True, reasoning_parser=None, parse_budget_window=window, model_dir=model, tool_parser=parser
    )


def _warm(
    records_: list[JsonDict],
    window: int | None,
    max_live_parsers: int = 10_000,
    config: JsonDict | None = None,
) -> list[JsonDict]:
    derenderer = derenderer_for(config or _config(window))
    processor = EnvelopeProcessor(derenderer, max_live_parsers=max_live_parsers)
    outputs = []
    for record in records_:
        result = processor.process(orjson.dumps(record))
        assert result.output is not None and result.internal_error is None
        outputs.append(written(result))
    return outputs


def _cold(records_: list[JsonDict], window: int | None, config: JsonDict | None = None) -> list[JsonDict]:
    """Each record carries the whole context and the last state to a fresh processor (vLLM's way)."""
    context: JsonDict = {}
    state: Any = None
    outputs = []
    for record in records_:
        body = dict(record["body"])
        context |= {k: v for k, v in body.items() if k != "generate_chunk"}
        body |= context | {"stream_state": state}
        result = EnvelopeProcessor(derenderer_for(config or _config(window))).process(
            orjson.dumps({**record, "body": body})
        )
        assert result.output is not None
        outputs.append(written(result))
        if "error" in result.output:
            break
        state = result.stream_state()
    return outputs


def _failed_at(outputs: list[JsonDict]) -> int:
    return next(i for i, output in enumerate(outputs) if "error" in output)


def test_a_call_read_whole_at_every_record_fails_its_request_with_a_400() -> None:
    records_ = _records(DEEP)
    budgeted = _warm(records_, 1024)
    at = _failed_at(budgeted)
    error = budgeted[at]["error"]
    assert (error["code"], error["type"]) == (400, "ParseBudgetExceededError"), error
    assert "parse budget" in error["message"]
    assert 30 < at < len(records_) - 100, at
    # Until then the same answers as without a budget (vLLM's, which goes on).
    unbounded = _warm(records_[: at + 1], 0)
    assert not any("error" in output for output in unbounded)
    assert normalize(budgeted[:at]) == normalize(unbounded[:at])
    # The request is over: its next record is a 409, not a continuation.
    assert budgeted[at + 1]["error"]["code"] == 409


def _steps(model: str, text: str) -> list[tuple[str, list[int]]]:
    """``text`` (ASCII) in 1-token records."""
    tokenizer = sample_tokenizer(model).backend
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    steps = [(tokenizer.decode([token], skip_special_tokens=False), [token]) for token in ids]
    assert "".join(piece for piece, _ in steps) == text
    return steps


def _stream(session: Any, steps: list[tuple[str, list[int]]]) -> None:
    for piece, chunk in steps:
        session.step(piece, chunk, None)


def test_the_default_budget_stops_the_deep_call() -> None:
    session = tool_parsing("qwen3", "hermes").new_stream(WEATHER_REQUEST, [1])
    steps = _steps("qwen3", DEEP + ", " + ", ".join(map(str, range(400, 3000))))
    with pytest.raises(ParseBudgetExceededError):
        _stream(session, steps)


def test_the_budget_grows_with_the_window() -> None:
    records_ = _records(DEEP)
    assert _failed_at(_warm(records_, 64)) < _failed_at(_warm(records_, 1024))


_ITEMS = ", ".join(map(str, range(300)))


@pytest.mark.parametrize(
    ("model", "parser", "text"),
    [
        ("qwen3", "hermes", DEEP),
        ("llama-3.1", "llama3_json", '<|python_tag|>{"name": 5, "parameters": {"a": [' + _ITEMS),
        ("llama-3", "pythonic", "[get_weather(a={**b, " + ", ".join(f"'k{i}': {i}" for i in range(300))),
    ],
    ids=["hermes", "llama3_json", "pythonic"],
)
def test_warm_evicted_and_cold_fail_at_the_same_record(model: str, parser: str, text: str) -> None:
    config = _config(32, model, parser)
    records_ = _records(text, model)[:200]
    warm = _warm(records_, 32, config=config)
    at = _failed_at(warm)
    assert normalize(_warm(records_, 32, max_live_parsers=0, config=config)) == normalize(warm)
    cold = _cold(records_, 32, config=config)
    assert len(cold) == at + 1
    assert normalize(cold) == normalize(warm[: at + 1])


#: Valid calls of the families that read some shapes whole, in 1-token records.
_VALID = [
    (
        "qwen3",
        "hermes",
        '<tool_call>\n{{"name": "get_weather", "arguments": {{"rows": [{}]}}}}\n</tool_call>',
        '{{"a": {0}, "b": [1, "x"]}}, ',
    ),
    (
        "llama-3.1",
        "llama3_json",
        '<|python_tag|>{{"name": "get_weather", "parameters": {{{}}}}}',
        '"k{0}": [{0}, "v"], ',
    ),
    (
        "llama-3.1",
        "llama3_json",
        "<|python_tag|>{}",
        '{{"name": "get_weather", "parameters": {{"k": {0}}}}}; ',
    ),
    ("llama-3", "pythonic", "[get_weather({})]", "k{0}='v {0}', "),
    ("llama-3", "pythonic", "[get_weather(rows=[{}])]", "{{'a': {0}}}, "),
    ("llama-3", "llama4_pythonic", "<|python_start|>[get_weather(rows=[{}])]<|python_end|>", "'v{0}', "),
    # Containers nested in a container argument (their finished elements are parsed once too).
    (
        "llama-3",
        "pythonic",
        "[get_weather(rows=[{}])]",
        "{{'n': {0}, 'at': {{'street': '" + "x" * 150 + "', 'tags': ['a', {{'k': 'v'}}]}}}}, ",
    ),
    ("llama-3", "pythonic", "[get_weather(data={{'fields': {{{}}}}})]", "'field_{0}': ['value {0}', {0}], "),
    # No read is made inside a triple-quoted argument (vLLM's completion cannot close it) or a tuple.
    (
        "llama-3",
        "pythonic",
        "[get_weather(code='''{}''')]",
        'def f{0}(x):\n    """Doc {0}."""\n    return x, ',
    ),
    ("llama-3", "pythonic", "[get_weather(size=({}))]", "({0}, 'px'), "),
    # An f-string before stops the reading of Python's strings only until its argument is done.
    ("llama-3", "pythonic", "[get_weather(city=f'Paris', code='''{}''')]", "def f{0}(x):\n    return x, "),
    # A finished triple-quoted argument is committed like any other.
    ("llama-3", "pythonic", "[get_weather(code='''" + "x = y\n" * 300 + "''', rows=[{}])]", "{0}, "),
    # Records that end in two of its quotes read the string incrementally, not the call.
    (
        "llama-3",
        "pythonic",
        "[get_weather(code='''{}''')]",
        "def f{0}(x):\n    y = ''  # a record ends here\n    return x or y, ",
    ),
    ("llama-3", "pythonic", '[get_weather(code="""{}""")]', 'def f{0}(x):\n    return ""  # "" \n, '),
    # An f-string's doubled braces, and a '#' in strings (no comment): read incrementally too.
    ("llama-3", "pythonic", "[get_weather(text=f'{}')]", "{{{{k{0}}}}}: }}}}{{{{ x\\n, "),
    ("llama-3", "pythonic", "[get_weather(colors=[{}])]", "'#{0:06x}', "),
    # After a docstring with an apostrophe the scan reads the rest inside out: no read is made.
    ("llama-3", "pythonic", "[get_weather(doc='''It's here.''', rows=[{}])]", "'v{0}', "),
    # Pretty-printed and nested: every record parses the levels' heads (their indentation too).
    (
        "llama-3",
        "pythonic",
        "[get_weather(data={{\n    'a': {{\n        'b': {{\n            'c': {{\n"
        "                'd': {{\n                    'rows': [\n{}\n]}}}}}}}}}})]",
        "                        {{\n                            'id': {0},\n"
        "                            'tags': ['x', '#y']\n                        }}, ",
    ),
]


@pytest.mark.parametrize(("model", "parser", "shape", "unit"), _VALID, ids=lambda v: str(v)[:24])
def test_valid_calls_stay_far_inside_the_budget(model: str, parser: str, shape: str, unit: str) -> None:
    """Valid output never meets the budget: here not even an eighth of the family's window."""
    text = shape.format("".join(unit.format(i) for i in range(3000 // len(unit) + 1))[:-2])
    session = tool_parsing(model, parser).new_stream(WEATHER_REQUEST, [1])
    composite = session._parser  # the budget's own counters
    tools = composite.tools
    assert tools is not None
    chars = 0
    for n, (piece, chunk) in enumerate(_steps(model, text), start=1):
        session.step(piece, chunk, None)
        chars += len(piece)
        allowed = REREAD_TEXT_FACTOR * chars + type(tools).reread_window // 8 * n
        assert tools.reread_chars() <= allowed, (n, tools.reread_chars(), chars)
    assert tools.reread_chars() > 0  # the family does count its whole reads


@pytest.mark.parametrize("parser", ["pythonic", "llama4_pythonic"])
def test_a_large_nested_dict_argument_streams_to_its_end(parser: str) -> None:
    """A dict nested in a dict argument used to be parsed again at every record until it closed,
    so past ~10 KB it met the default budget; its finished members are parsed once now (30 KB)."""
    inner = "{" + ", ".join(f"'field_{i}': 'value {i}'" for i in range(1200)) + "}"
    text = "[get_weather(data={'fields': " + inner + "})]"
    if parser == "llama4_pythonic":
        text = "<|python_start|>" + text + "<|python_end|>"
    session = tool_parsing("llama-3", parser).new_stream(WEATHER_REQUEST, [1])
    got = stream_summary(session, _steps("llama-3", text), names_once=True)
    assert got.names == {0: "get_weather"}
    fields = {f"field_{i}": f"value {i}" for i in range(1200)}
    assert orjson.loads(got.args[0]) == {"data": {"fields": fields}}
    assert got.finish == "tool_calls"
