"""Adversarial records against ordinary ones of the same token count (bounded work per record).

Each shape's cost is printed beside an ordinary record (or stream) with as many
tokens, as a median of rounds with its spread, and the ratio (target: every
ratio <= 4):

* an undecodable byte run: one record of byte tokens that never complete a
  character (vLLM's window never advances on it), vs ordinary text;
* a max-size completion record (``max_model_len`` minus the prompt), vs the
  same count in a chat record;
* many logprob positions at ``--max-logprobs`` candidates, vs the same tokens
  without logprobs, and per entry it carries vs per ordinary token (its work
  is linear in its entries: positions x (1 + candidates));
* gpt-oss (Harmony): a long argument, a header that never reaches ``<|message|>``, a recipient that
  never ends and 10,000 calls, in 1-token records: last decile vs first;
* long tool calls in 1-token records through each tool parser: the mean cost
  of the last decile's records vs the first decile's (flat = O(delta)); for
  ``llama3_json`` and the pythonic parsers also calls of many short arguments,
  short strings, numbers, nested and deep containers and many calls, and the
  shapes they used to re-read whole (a ``llama3_json`` name after the
  arguments, duplicate keys, both argument keys, a syntax error, a number
  ending in a point before a delimiter; pythonic
  list and dict arguments) or still do (a syntax error in an array's tail after a
  string, which the completion may still mend); vLLM 0.34's ``llama3_json`` reader (the parser
  engine) on the long argument and the same ``llama3_json`` shapes;
* the parse budget (``--shapes budget``): shapes vLLM re-reads whole at every record, run to
  the end without the budget and until the request fails with it (CPU seconds, last decile);
* the parser families' hostile shapes in 1-token records, last decile vs first: a DSML
  block (``deepseek_v4``, ``deepseek_v32``) whose parameter never closes, a DSML block of
  10,000 calls, and a ``<think>`` that never closes (``deepseek_v4``, ``kimi_k2``,
  ``nemotron_v3`` reasoning);
* one-shot (non-streaming) records whose tool markup never closes, at 1,000,
  2,000 and 4,000 tokens, vs ordinary text through the same parser: the call
  and argument patterns vLLM matches the whole output against
  (``deepseek_v31`` call-begin/separator pairs without a call end, ``glm45``
  argument values without ``</arg_value>``, pre-v11 ``mistral`` ``[{`` runs
  after a payload JSON rejects).

``python -m benchmarks adversarial [--rounds N] [--tokens N] [--shapes records|parsers|oneshot|budget]
[--only TEXT]...`` (``--only``: the parser rows whose label holds TEXT, e.g. ``"list argument"``);
prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.model_dir import load_tokenizer
from worker.core.parsing import ChatParsing, ParseRequest, adapter_for
from worker.core.parsing.registry import tool_parsers
from worker.core.vllm_version import VllmVersion
from worker.errors import ParseBudgetExceededError
from worker.runtime.composition import load_derenderer
from worker.settings import ModelSettings

MODELS = Path(__file__).resolve().parent.parent / "samples" / "models"
PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
JsonDict = dict[str, Any]

#: (parser, model dir, call text with {} where the long argument goes, tools)
_STRING_TOOL = {
    "type": "function",
    "function": {
        "name": "write_file",
        "parameters": {
            "type": "object",
            "properties": {"content": {"type": "string"}, "n": {"type": "integer"}},
        },
    },
}
_GLM_CALL = "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>{}</arg_value>\n</tool_call>"
_ARGS = '{{"content": "{}"}}'
_QWEN_CALL = "<tool_call>\n<function=write_file>\n"
_DS = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write_file<｜tool▁sep｜>{{"content": "{}"}}'
_DSML = "｜DSML｜"
_DSML_INVOKE = f'<{_DSML}invoke name="write_file">\n<{_DSML}parameter name="content" string="true">'
_DSML_CALL = _DSML_INVOKE + "{}" + f"</{_DSML}parameter>\n</{_DSML}invoke>\n"
PARSER_SHAPES: list[tuple[str, str, str]] = [
    ("hermes", "qwen3", '<tool_call>\n{{"name": "write_file", "arguments": ' + _ARGS + "}}\n</tool_call>"),
    ("llama3_json", "llama-3.1", '<|python_tag|>{{"name": "write_file", "parameters": ' + _ARGS + "}}"),
    ("mistral", "mistral-7b-v0.3", '[TOOL_CALLS] [{{"name": "write_file", "arguments": ' + _ARGS + "}}]"),
    ("deepseek_v31", "deepseek-v3", _DS + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    (
        "kimi_k2",
        "qwen3",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0<|tool_call_argument_begin|>"
        '{{"content": "{}"}}<|tool_call_end|><|tool_calls_section_end|>',
    ),
    ("pythonic", "llama-3", '[write_file(content="{}")]'),
    ("llama4_pythonic", "llama-3", '<|python_start|>[write_file(content="{}")]<|python_end|>'),
    ("glm45", "qwen3", _GLM_CALL),
    (
        "qwen3_coder",
        "qwen3",
        "<tool_call>\n<function=write_file>\n<parameter=content>\n{}\n</parameter>\n</function>\n</tool_call>",
    ),
    ("deepseek_v4", "deepseek-v4", f"<{_DSML}tool_calls>\n" + _DSML_CALL + f"</{_DSML}tool_calls>"),
    ("deepseek_v32", "deepseek-v3", f"<{_DSML}function_calls>\n" + _DSML_CALL + f"</{_DSML}function_calls>"),
]
#: The families' hostile shapes: (label, reasoning parser, tool parser, model, text prefix, repeated
#: unit with {} for a counter, units). The text never closes what the prefix opens.
FAMILY_SHAPES: list[tuple[str, str | None, str, str, str, str, int]] = [
    (
        "deepseek_v4, a DSML block that never closes",
        None,
        "deepseek_v4",
        "deepseek-v4",
        f"<{_DSML}tool_calls>\n" + _DSML_INVOKE,
        "word{} ",
        0,
    ),
    (
        "deepseek_v32, a DSML block that never closes",
        None,
        "deepseek_v32",
        "deepseek-v3",
        f"<{_DSML}function_calls>\n" + _DSML_INVOKE,
        "word{} ",
        0,
    ),
    (
        "deepseek_v4, 10,000 calls in one DSML block",
        None,
        "deepseek_v4",
        "deepseek-v4",
        f"<{_DSML}tool_calls>\n",
        f'<{_DSML}invoke name="f">\n<{_DSML}parameter name="n" string="false">{{}}</{_DSML}parameter>\n'
        f"</{_DSML}invoke>\n",
        10_000,
    ),
    (
        "deepseek_v4 reasoning, <think> never closes",
        "deepseek_v4",
        "deepseek_v4",
        "deepseek-v4",
        "",
        "w{} ",
        0,
    ),
    ("kimi_k2 reasoning, open <think>", "kimi_k2", "kimi_k2", "qwen3", "<think>", "w{} ", 0),
    (
        "nemotron_v3 reasoning, <think> never closes",
        "nemotron_v3",
        "qwen3_coder",
        "qwen3",
        "<think>",
        "w{} ",
        0,
    ),
]
#: Argument shapes the XML parsers had to rescan: many short arguments, a key that never closes.
XML_SHAPES: list[tuple[str, str, str]] = [
    ("glm45 many args", "glm45", "<tool_call>write_file\n{}</tool_call>"),
    ("glm45 open key", "glm45", "<tool_call>write_file\n<arg_key>{}</tool_call>"),
    ("qwen3_coder many args", "qwen3_coder", _QWEN_CALL + "{}</function>\n</tool_call>"),
    ("qwen3_coder open name", "qwen3_coder", _QWEN_CALL + "<parameter={}</tool_call>"),
]
_FORTY_MEMBERS = "".join(f'"m{i}": {i}, ' for i in range(40))
#: Calls of many short arguments, numbers, nested and deep containers, many calls: text mostly outside
#: any string. (label, parser, model, call text with {} for the body, body unit with {} for a counter)
STRUCTURED_SHAPES: list[tuple[str, str, str, str, str]] = [
    (
        "many args",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{{}}}}}',
        '"k{0}": {0}, ',
    ),
    (
        "short strings",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{{}}}}}',
        '"k{0}": "v", ',
    ),
    (
        "numbers",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{{}}}}}',
        '"n{0}": -{0}.5e3, ',
    ),
    (
        "nested",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{"a": [{}]}}}}',
        '{{"i": [{0}, {{"b": null}}]}}, ',
    ),
    (
        "deep nesting",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{"a": {}}}}}',
        "[{0}, ",
    ),
    (
        "many calls",
        "llama3_json",
        "llama-3.1",
        "<|python_tag|>{}",
        '{{"name": "f", "parameters": {{"k": {0}}}}}; ',
    ),
    (
        "many objects",
        "hermes",
        "qwen3",
        '<tool_call>\n{{"name": "f", "arguments": {{"rows": [{}]}}}}\n</tool_call>',
        '{{"a": {0}, "b": [1, 2]}}, ',
    ),
    ("many args", "pythonic", "llama-3", "[f({})]", "k{0}={0}, "),
    ("short strings", "pythonic", "llama-3", "[f({})]", "k{0}='v', "),
    ("numbers", "pythonic", "llama-3", "[f({})]", "n{0}=-{0}.5e3, "),
    ("many calls", "pythonic", "llama-3", "[{}]", "f{0}(k={0}), "),
    ("many args", "llama4_pythonic", "llama-3", "<|python_start|>[f({})]<|python_end|>", "k{0}={0}, "),
    # Shapes the incremental readers left to the whole re-read (docs/security.md, "Not O(delta)").
    (
        "name after the arguments",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"parameters": {{{}}}, "name": "f"}}',
        '"k{0}": {0}, ',
    ),
    (
        "a duplicate key first",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{"k0": -1, {}}}}}',
        '"k{0}": {0}, ',
    ),
    (
        "one key repeated after 40 members",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{' + _FORTY_MEMBERS + "{}}}}}",
        '"m5": {0}, ',
    ),
    (
        "both argument keys",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{}}, "arguments": {{{}}}}}',
        '"k{0}": {0}, ',
    ),
    (
        "a syntax error first",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{"k": 1 x, {}}}}}',
        '"k{0}": {0}, ',
    ),
    (
        "a number ending in a point first",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{"k": 1., {}}}}}',
        '"k{0}": [{0}, "v"], ',
    ),
    (
        "a syntax error in an array tail",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{"k": ["x" {}]}}}}',
        "{0} ",
    ),
    (
        "many calls after ';  '",
        "llama3_json",
        "llama-3.1",
        "<|python_tag|>{}",
        '{{"name": "f", "parameters": {{"k": {0}}}}};  ',
    ),
    (
        "many calls after ';'",
        "llama3_json",
        "llama-3.1",
        "<|python_tag|>{}",
        '{{"name": "f", "parameters": {{"k": {0}}}}};',
    ),
    (
        "a second call after '; \\n'",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "g", "parameters": {{}}}}; \n{{"name": "f", "parameters": {{{}}}}}',
        '"k{0}": {0}, ',
    ),
    (
        "a blank before the call",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|> {{"name": "f", "parameters": {{{}}}}}',
        '"k{0}": {0}, ',
    ),
    (
        "a key JSON rejects first",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{"a\\q": {{{}}}}}}}',
        '"k{0}": {0}, ',
    ),
    (
        "a blank JSON rejects first",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{"a": 1\u3000, {}}}}}',
        '"k{0}": {0}, ',
    ),
    ("a list argument", "pythonic", "llama-3", "[f(a=[{}])]", "'v{0}', "),
    ("a dict argument", "pythonic", "llama-3", "[f(a={{{}}})]", "'k{0}': {0}, "),
    (
        "a list argument",
        "llama4_pythonic",
        "llama-3",
        "<|python_start|>[f(a=[{}])]<|python_end|>",
        "'v{0}', ",
    ),
    ("a dict nested in a dict argument", "pythonic", "llama-3", "[f(a={{'x': {{{}}}}})]", "'k{0}': {0}, "),
    ("a tuple argument", "pythonic", "llama-3", "[f(a=({}))]", "{0}, "),
    ("a triple-quoted argument", "pythonic", "llama-3", "[f(code='''{}''')]", "x{0} = y({0}), "),
    (
        "code with '' in a triple-quoted argument",
        "pythonic",
        "llama-3",
        "[f(code='''{}''')]",
        "s{0} = ''  # empty\n",
    ),
    ("an f-string with doubled braces", "pythonic", "llama-3", "[f(text=f'{}')]", "{{{{k{0}}}}}: }}}}, "),
    ("a list of '#' colours", "pythonic", "llama-3", "[f(colors=[{}])]", "'#{0:06x}', "),
    (
        "a pretty-printed nested list",
        "pythonic",
        "llama-3",
        "[f(data={{\n"
        + "".join(" " * 12 * d + f"'level_{d}': {{{{\n" for d in range(1, 6))
        + " " * 72
        + "'rows': [\n{}]}}}}}}}}}}}})]",
        " " * 40 + "'v{0}',\n",
    ),
]
#: One-shot outputs whose markup never closes: (parser, model, text prefix, repeated unit).
ONESHOT_SHAPES: list[tuple[str, str, str, str]] = [
    ("deepseek_v31", "deepseek-v3", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{"),
    ("glm45", "qwen3", "<tool_call>write_file\n", "<arg_key>k</arg_key><arg_value>v"),
    ("mistral", "mistral-7b-v0.3", "[TOOL_CALLS] x", "[{ "),
]
FILLER = "Line of text, numbers 12345 and punctuation; café, 北京. "

_HARMONY_CALL = (
    '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{{"k": {0}}}<|call|>'
)
#: gpt-oss (Harmony) through the ``openai`` tool parser: (label, shape with {} for the body, unit
#: repeated into the body with its index, units). The header shapes never reach ``<|message|>``.
HARMONY_SHAPES: list[tuple[str, str, str, int | None]] = [
    (
        "openai (Harmony), long argument",
        "<|channel|>commentary to=functions.write_file <|constrain|>json<|message|>"
        '{{"content": "{}"}}<|call|>',
        "w{0} ",
        None,
    ),
    ("openai (Harmony), an unclosed header", "<|channel|>commentary to=functions.f {}", "w{0} ", None),
    ("openai (Harmony), a recipient that never ends", "<|channel|>commentary to=functions.{}", "p{0}.", None),
    ("openai (Harmony), 10,000 calls", "{}", _HARMONY_CALL, 10_000),
]


def _median_spread(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), (max(samples) - min(samples)) / 2


def _timed(fn: Callable[[], object], rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def _settings(model: str, **extra: Any) -> ModelSettings:
    return ModelSettings(
        vllm_version=VllmVersion.V0_34, tokenizer=str(MODELS / model), served_model_names=("bench",), **extra
    )


def _stream_record(endpoint: str, ids: list[int], logprobs: JsonDict | None = None) -> bytes:
    choice: JsonDict = {"index": 0, "token_ids": ids, "finish_reason": "length"}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    body: JsonDict = {
        "stream": True,
        "model": "bench",
        "prompt_token_ids": PROMPT,
        "generate_chunk": {"request_id": "b", "choices": [choice]},
    }
    if endpoint == "chat":
        body["chat_request"] = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
    else:
        body["completion_request"] = {"model": "bench", "prompt": "hi"}
        if logprobs is not None:
            body["completion_request"]["logprobs"] = 20
    return orjson.dumps({"request_id": "b", "seq": 0, "endpoint": endpoint, "body": body})


def _record_cost(settings: ModelSettings, value: bytes, rounds: int) -> list[float]:
    derenderer = load_derenderer(settings)

    def once() -> None:
        result = EnvelopeProcessor(derenderer, max_record_bytes=64 << 20).process(value)
        assert result.output is not None and "error" not in result.output, result.output

    once()
    return _timed(once, rounds)


def _record_rows(rounds: int) -> list[tuple[str, list[float], list[float]]]:
    rows = []
    for model in ("qwen3", "mistral-7b-v0.3"):
        settings = _settings(model, max_model_len=40960)
        backend = load_derenderer(settings).tokenizer.backend
        lead = backend.token_to_id("<0xE2>")
        if lead is None:
            lead = backend.token_to_id("â")  # byte-level spelling of the lone byte 0xE2
        assert lead is not None, f"{model} has no token for the lone byte 0xE2"
        n = 16000
        ordinary = (backend.encode(FILLER * 2000, add_special_tokens=False).ids)[:n]
        rows.append(
            (
                f"undecodable byte run, {n:,} tokens ({model})",
                _record_cost(settings, _stream_record("chat", [lead] * n), rounds),
                _record_cost(settings, _stream_record("chat", ordinary), rounds),
            )
        )
    settings = _settings("qwen3")
    limit = load_derenderer(settings).options.max_model_len
    backend = load_derenderer(settings).tokenizer.backend
    ids = (backend.encode(FILLER * 8000, add_special_tokens=False).ids)[: limit - len(PROMPT)]
    rows.append(
        (
            f"max-size completion record, {len(ids):,} tokens",
            _record_cost(settings, _stream_record("completion", ids), rounds),
            _record_cost(settings, _stream_record("chat", ids), rounds),
        )
    )
    settings = _settings("qwen3", max_model_len=40960)
    max_logprobs = load_derenderer(settings).options.max_logprobs
    positions = 4000
    ids = (backend.encode(FILLER * 2000, add_special_tokens=False).ids)[:positions]
    content = [
        {
            "token_id": t,
            "logprob": -0.5,
            "top_logprobs": [{"token_id": t + k, "logprob": -1.0 - k} for k in range(max_logprobs)],
        }
        for t in ids
    ]
    with_logprobs = _record_cost(settings, _stream_record("completion", ids, {"content": content}), rounds)
    plain = _record_cost(settings, _stream_record("completion", ids), rounds)
    rows.append(
        (f"{positions:,} logprob positions x {max_logprobs} candidates (completion)", with_logprobs, plain)
    )
    # The same record per entry it carries (each position: the sampled id and its candidates).
    entries = positions * (1 + max_logprobs)
    rows.append(
        (
            "  the same, per logprob entry vs per ordinary token",
            [cost / entries for cost in with_logprobs],
            [cost / positions for cost in plain],
        )
    )
    return rows


def _oneshot_record(ids: list[int]) -> bytes:
    request: JsonDict = {
        "model": "bench",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [_STRING_TOOL],
    }
    body: JsonDict = {
        "model": "bench",
        "prompt_token_ids": PROMPT,
        "generate_response": {
            "request_id": "b",
            "choices": [{"index": 0, "token_ids": ids, "finish_reason": "stop"}],
        },
        "chat_request": request,
    }
    return orjson.dumps({"request_id": "b", "seq": 0, "endpoint": "chat", "body": body})


def _oneshot_rows(rounds: int, only: list[str]) -> list[tuple[str, list[float], list[float]]]:
    rows = []
    for parser, model, prefix, unit in ONESHOT_SHAPES:
        if not _wanted(f"{parser} one-shot", only):
            continue
        settings = _settings(model, tool_parser=parser, enable_auto_tool_choice=True)
        backend = load_derenderer(settings).tokenizer.backend
        for n in (1000, 2000, 4000):
            ids = backend.encode(prefix + unit * n, add_special_tokens=False).ids[:n]
            ordinary = backend.encode(FILLER * (n // 4), add_special_tokens=False).ids[: len(ids)]
            rows.append(
                (
                    f"{parser} one-shot, open markup, {len(ids):,} tokens",
                    _record_cost(settings, _oneshot_record(ids), rounds),
                    _record_cost(settings, _oneshot_record(ordinary), rounds),
                )
            )
    return rows


def _parser_stream_costs(
    parser: str,
    model: str,
    text: str,
    tools: list[JsonDict],
    *,
    reread_window: int | None = None,
    llama3_json_on_engine: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    reasoning: str | None = None,
) -> list[float]:
    """Per-record seconds of one call in 1-token records through a live parser session, until the
    end or the record whose request fails on the parse budget (``reread_window``: see ChatParsing;
    ``llama3_json_on_engine``: vLLM 0.34's ``llama3_json`` reader)."""
    loaded = load_tokenizer(MODELS / model)
    parsing = ChatParsing.create(
        adapter_for(loaded),
        reasoning_parser=reasoning,
        tool_parser=parser,
        enable_auto_tool_choice=True,
        reread_window=reread_window,
        llama3_json_on_engine=llama3_json_on_engine,
    )
    assert parsing is not None
    request = ParseRequest(tools=tools, tool_choice="auto", parallel_tool_calls=None)
    settings = _settings(model)
    decoder = load_derenderer(settings).decoder
    ids: list[int] = loaded.backend.encode(text, add_special_tokens=False).ids
    window = decoder.seed_window([1], False)
    texts = [decoder.extend(window, [token], False) for token in ids]
    session = parsing.new_stream(request, [1])
    costs = []
    for token, piece in zip(ids, texts, strict=True):
        start = clock()
        try:
            session.step(piece, [token], None)
        except ParseBudgetExceededError:
            costs.append(clock() - start)
            break
        costs.append(clock() - start)
    return costs


def _deciles(costs: list[float]) -> tuple[float, float]:
    size = max(len(costs) // 10, 1)
    return statistics.mean(costs[:size]), statistics.mean(costs[-size:])


def _wanted(label: str, only: list[str]) -> bool:
    return not only or any(text in label for text in only)


def _parser_rows(rounds: int, tokens: int, only: list[str]) -> list[tuple[str, list[float], list[float]]]:
    rows = []
    words = " ".join(FILLER.split()[:6])
    for parser, model, shape in PARSER_SHAPES:
        if not _wanted(f"{parser}: long argument", only):
            continue
        body = (words + " ") * (tokens // 8)
        text = shape.format(body)
        firsts, lasts = [], []
        for _ in range(rounds):
            first, last = _deciles(_parser_stream_costs(parser, model, text, [_STRING_TOOL]))
            firsts.append(first)
            lasts.append(last)
        rows.append((f"{parser}: long argument, last vs first decile", lasts, firsts))
    for label, parser, shape in XML_SHAPES:
        if not _wanted(label, only):
            continue
        if "many" in label:
            unit = (
                "<arg_key>n</arg_key><arg_value>1</arg_value>\n"
                if parser == "glm45"
                else "<parameter=n>\n1\n</parameter>\n"
            )
            body = unit * (tokens // 12)
        else:
            body = "x " * (tokens // 2)
        firsts, lasts = [], []
        for _ in range(rounds):
            first, last = _deciles(_parser_stream_costs(parser, "qwen3", shape.format(body), [_STRING_TOOL]))
            firsts.append(first)
            lasts.append(last)
        rows.append((f"{label}: last vs first decile", lasts, firsts))
    for label, shape, unit, units in HARMONY_SHAPES:
        if not _wanted(label, only):
            continue
        body = "".join(unit.format(i) for i in range(units or tokens // 2))
        firsts, lasts = [], []
        for _ in range(rounds):
            costs = _parser_stream_costs("openai", "gpt-oss", shape.format(body), [_STRING_TOOL])
            first, last = _deciles(costs)
            firsts.append(first)
            lasts.append(last)
        rows.append((f"{label}: last vs first decile", lasts, firsts))
    for label, reasoning, parser, model, prefix, unit, count in FAMILY_SHAPES:
        if not _wanted(label, only):
            continue
        text = prefix + "".join(unit.format(i) for i in range(count or tokens // 2))
        firsts, lasts = [], []
        for _ in range(rounds):
            costs = _parser_stream_costs(parser, model, text, [_STRING_TOOL], reasoning=reasoning)
            first, last = _deciles(costs)
            firsts.append(first)
            lasts.append(last)
        rows.append((f"{label}: last vs first decile", lasts, firsts))
    for label, parser, model, shape, unit in STRUCTURED_SHAPES:
        if not _wanted(f"{parser}, {label}", only):
            continue
        if label == "deep nesting":  # 200 levels (vLLM's json fails near 1,000), then short items
            body = "".join(unit.format(i) for i in range(200)) + ", ".join(map(str, range(tokens // 3)))
        else:
            body = "".join(unit.format(i) for i in range(tokens // 6))[:-2]
        firsts, lasts = [], []
        for _ in range(rounds):
            first, last = _deciles(_parser_stream_costs(parser, model, shape.format(body), [_STRING_TOOL]))
            firsts.append(first)
            lasts.append(last)
        rows.append((f"{parser}, {label}: last vs first decile", lasts, firsts))
    # vLLM 0.34's llama3_json reader (the parser engine) on the same shapes.
    engine_shapes = [("long argument", PARSER_SHAPES[1][2], "{}")]
    engine_shapes += [
        (label, shape, unit) for label, parser, _, shape, unit in STRUCTURED_SHAPES if parser == "llama3_json"
    ]
    for label, shape, unit in engine_shapes:
        if not _wanted(f"llama3_json (0.34 engine), {label}", only):
            continue
        if label == "long argument":
            body = (words + " ") * (tokens // 8)
        elif label == "deep nesting":
            body = "".join(unit.format(i) for i in range(200)) + ", ".join(map(str, range(tokens // 3)))
        else:
            body = "".join(unit.format(i) for i in range(tokens // 6))[:-2]
        firsts, lasts = [], []
        for _ in range(rounds):
            costs = _parser_stream_costs(
                "llama3_json", "llama-3.1", shape.format(body), [_STRING_TOOL], llama3_json_on_engine=True
            )
            first, last = _deciles(costs)
            firsts.append(first)
            lasts.append(last)
        rows.append((f"llama3_json (0.34 engine), {label}: last vs first decile", lasts, firsts))
    return rows


#: Shapes vLLM re-reads whole at every record, as the parsers still must (the parse budget bounds them).
#: (label, parser, model, shape, item, ordinary): ``ordinary`` is a valid call of the same items
#: in the same family, the record cost the shape is held against.
BUDGET_SHAPES: list[tuple[str, str, str, str, str, str]] = [
    (
        "hermes, 300 levels deep",
        "hermes",
        "qwen3",
        '<tool_call>\n{{"name": "f", "arguments": {{"a": ' + "[" * 300 + "{}",
        "{0}",
        '<tool_call>\n{{"name": "f", "arguments": {{"a": [{}]}}}}\n</tool_call>',
    ),
    (
        "llama3_json, 300 levels deep",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": "f", "parameters": {{"a": ' + "[" * 300 + "{}",
        "{0}",
        '<|python_tag|>{{"name": "f", "parameters": {{"a": [{}]}}}}',
    ),
    (
        "llama3_json, a name that is no string",
        "llama3_json",
        "llama-3.1",
        '<|python_tag|>{{"name": 5, "parameters": {{{}',
        '"k{0}": {0}',
        '<|python_tag|>{{"name": "f", "parameters": {{{}}}}}',
    ),
    (
        "pythonic, `**` in a dict argument",
        "pythonic",
        "llama-3",
        "[f(a={{**z, {}",
        "'k{0}': {0}",
        "[f(a={{{}}})]",
    ),
]


def _budget_report(tokens: int, only: list[str]) -> None:
    """Each shape without the budget (vLLM's re-read to the end) and with the default one, against
    the same family's valid call of the same items over as many records."""
    print(f"\nthe parse budget: shapes re-read at every record, {tokens} items in 1-token records (CPU)")
    print(
        f"{'shape':<42}{'window':>8}{'records run':>16}{'CPU s':>9}{'mean / record':>16}"
        f"{'last decile':>14}{'ordinary':>11}{'ratio':>8}"
    )
    for label, parser, model, shape, item, ordinary in BUDGET_SHAPES:
        if not _wanted(label, only):
            continue
        items = ", ".join(item.format(i) for i in range(tokens))
        cpu = time.process_time
        good = _parser_stream_costs(parser, model, ordinary.format(items), [_STRING_TOOL], clock=cpu)
        unbounded: list[float] = []
        for window in (0, None):
            text = shape.format(items)
            costs = _parser_stream_costs(parser, model, text, [_STRING_TOOL], reread_window=window, clock=cpu)
            unbounded = unbounded or costs  # the first run goes to the end
            shown = "off" if window == 0 else tool_parsers()[parser].reread_window
            ran = f"{len(costs)}/{len(unbounded)}"
            mean = statistics.mean(costs)
            base = statistics.mean(good[: len(costs)])
            print(
                f"{label:<42}{shown:>8}{ran:>16}{sum(costs):>9.2f}{mean * 1e6:>13.0f} µs"
                f"{_deciles(costs)[1] * 1e6:>11.0f} µs{base * 1e6:>8.0f} µs{mean / base:>8.1f}"
            )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks adversarial")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=3500, help="tokens per long tool call")
    parser.add_argument("--shapes", choices=("all", "records", "parsers", "oneshot", "budget"), default="all")
    parser.add_argument("--budget-items", type=int, default=3000, help="items in each parse-budget shape")
    parser.add_argument(
        "--only", action="append", default=[], help="parser rows whose label holds this text (repeatable)"
    )
    args = parser.parse_args(argv)
    print(f"adversarial shapes vs ordinary records of the same token count (median of {args.rounds} rounds)")
    print(f"{'shape':<66}{'adversarial':>16}{'ordinary':>16}{'ratio':>8}")
    records = args.shapes in ("all", "records") and not args.only
    rows = _record_rows(args.rounds) if records else []
    if args.shapes in ("all", "parsers"):
        rows += _parser_rows(args.rounds, args.tokens, args.only)
    if args.shapes in ("all", "oneshot"):
        rows += _oneshot_rows(args.rounds, args.only)
    for label, bad, good in rows:
        bad_m, bad_s = _median_spread(bad)
        good_m, good_s = _median_spread(good)
        unit, scale = ("ms", 1e3) if good_m > 1e-3 else ("µs", 1e6)
        print(
            f"{label:<66}{bad_m * scale:>9.1f}±{bad_s * scale:<4.1f}{unit}"
            f"{good_m * scale:>9.1f}±{good_s * scale:<4.1f}{unit}{bad_m / good_m:>8.2f}"
        )
    if args.shapes in ("all", "budget"):
        _budget_report(args.budget_items, args.only)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
