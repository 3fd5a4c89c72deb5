"""Warm, cold and plain paths on a 2,000-token hermes generation with Qwen3, in 1-token chunks; then the
warm path of a 2,000-token gpt-oss (Harmony) generation: reasoning, then a call with a long argument.

* warm: the worker's path, one live parser session per sequence (O(delta) per chunk);
* cold: every record hands back the previous ``stream_state``, so every record
  rebuilds the parser by replaying all earlier chunks (vLLM's stateless path);
* plain: no parser configured.

Prints the total and the mean per-chunk cost per decile of the stream. vLLM
0.33.0's own derender took 107 s for the same work on this machine, its per-chunk
cost rising from 6 ms to 101 ms.

Then one warm row per parser family (its reasoning, its tool call with a long
string argument, about 2,000 tokens in 1-token records, on the family's own
tokenizer): flat deciles (last/first near 1) mean O(delta) per record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.vllm_version import VllmVersion
from worker.runtime.composition import load_derenderer, new_processor
from worker.settings import ModelSettings

MODELS = Path(__file__).resolve().parent.parent / "samples" / "models"
VLLM_SECONDS = 107.0
TOKENS = 2000
PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write text to a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    }
]

JsonDict = dict[str, Any]


def _generation(settings: ModelSettings) -> list[int]:
    backend = load_derenderer(settings).tokenizer.backend
    prose = "Let me write that file for you. It holds notes about derendering, caching and streams. "
    body = "Line of content with some words, numbers 12345 and punctuation; café, 北京, 🚀. "
    ids: list[int] = backend.encode(prose, add_special_tokens=False).ids
    call_head = '<tool_call>\n{"name": "write_file", "arguments": {"path": "notes.txt", "content": "'
    ids += backend.encode(call_head, add_special_tokens=False).ids
    tail = backend.encode('"}}\n</tool_call>', add_special_tokens=False).ids
    filler = backend.encode(body, add_special_tokens=False).ids
    room = TOKENS - len(tail) - 1
    while len(ids) < room:
        ids += filler
    # Cut inside the JSON string, then close the call and stop on <|im_end|>.
    return [*ids[:room], *tail, 151645]


def _harmony_generation(settings: ModelSettings) -> list[int]:
    """Harmony: an analysis message, then a call whose JSON argument is cut and closed, ``<|call|>``."""
    backend = load_derenderer(settings).tokenizer.backend
    prose = "Let me write that file for you. It holds notes about derendering, caching and streams. "
    body = "Line of content with some words, numbers 12345 and punctuation; café, 北京, 🚀. "
    head = (
        "<|channel|>analysis<|message|>" + prose * 8 + "<|end|><|start|>assistant<|channel|>commentary"
        ' to=functions.write_file <|constrain|>json<|message|>{"path": "notes.txt", "content": "'
    )
    ids: list[int] = backend.encode(head, add_special_tokens=False).ids
    tail = backend.encode('"}', add_special_tokens=False).ids
    filler = backend.encode(body, add_special_tokens=False).ids
    room = TOKENS - len(tail) - 1
    while len(ids) < room:
        ids += filler
    return [*ids[:room], *tail, 200012]  # <|call|>


def _records(ids: list[int]) -> list[JsonDict]:
    records = []
    for seq, token in enumerate(ids):
        choice: JsonDict = {"index": 0, "token_ids": [token]}
        if seq == len(ids) - 1:
            choice["finish_reason"] = "stop"
        body: JsonDict = {"stream": True, "generate_chunk": {"request_id": "bench", "choices": [choice]}}
        if seq == 0:
            body |= {
                "model": "bench",
                "prompt_token_ids": PROMPT,
                "prompt_tokens": len(PROMPT),
                "chat_request": {
                    "model": "bench",
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": TOOLS,
                },
            }
        records.append({"request_id": "bench", "seq": seq, "endpoint": "chat", "body": body})
    return records


def _run(processor_for: Callable[[], EnvelopeProcessor], records: list[JsonDict], carry: bool) -> list[float]:
    """Per-record seconds; with ``carry`` each record gets the last state and a fresh processor."""
    context = {k: v for k, v in records[0]["body"].items() if k != "generate_chunk"}
    costs = []
    state = None
    processor = processor_for()
    for record in records:
        if carry:
            record = {**record, "body": {**record["body"], **context, "stream_state": state}}
            processor = processor_for()
        value = orjson.dumps(record)
        start = time.perf_counter()
        result = processor.process(value)
        costs.append(time.perf_counter() - start)
        assert result.output is not None and "body" in result.output, result
        if carry:
            state = result.output["body"]["stream_state"]
    return costs


_DSML = "｜DSML｜"
_DSML_CALL = (
    f'<{_DSML}invoke name="write_file">\n<{_DSML}parameter name="path" string="true">notes.txt'
    f'</{_DSML}parameter>\n<{_DSML}parameter name="content" string="true">{{}}</{_DSML}parameter>\n'
    f"</{_DSML}invoke>\n"
)
_QWEN_CALL = (
    "<tool_call>\n<function=write_file>\n<parameter=path>\nnotes.txt\n</parameter>\n"
    "<parameter=content>\n{}\n</parameter>\n</function>\n</tool_call>"
)
#: (family, model dir, reasoning parser, tool parser, output with {} for the long argument)
FAMILIES: list[tuple[str, str, str | None, str, str]] = [
    (
        "hermes",
        "qwen3",
        "qwen3",
        "hermes",
        '<think>Plan.</think>\n<tool_call>\n{{"name": "write_file", "arguments": '
        '{{"path": "notes.txt", "content": "{}"}}}}\n</tool_call>',
    ),
    ("qwen3_coder", "qwen3", "qwen3", "qwen3_coder", "<think>Plan.</think>\n" + _QWEN_CALL),
    ("nemotron_v3", "qwen3", "nemotron_v3", "qwen3_coder", "<think>\nPlan.\n</think>\n" + _QWEN_CALL),
    (
        "kimi_k2",
        "qwen3",
        "kimi_k2",
        "kimi_k2",
        "<think>Plan.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0"
        '<|tool_call_argument_begin|>{{"path": "notes.txt", "content": "{}"}}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
    ),
    (
        "deepseek_v4",
        "deepseek-v4",
        "deepseek_v4",
        "deepseek_v4",
        f"Plan.</think>\n\n<{_DSML}tool_calls>\n" + _DSML_CALL + f"</{_DSML}tool_calls>",
    ),
    (
        "deepseek_v32",
        "deepseek-v3",
        None,
        "deepseek_v32",
        f"Let me write it.\n\n<{_DSML}function_calls>\n" + _DSML_CALL + f"</{_DSML}function_calls>",
    ),
]


def _family_records(settings: ModelSettings, shape: str) -> list[JsonDict]:
    """About TOKENS tokens of ``shape`` (its long argument grown to fit), prompted in the family's ids."""
    backend = load_derenderer(settings).tokenizer.backend
    unit = "Line of content with some words, numbers 12345 and punctuation; café, 北京, 🚀. "
    head, tail = shape.split("{}")
    head, tail = head.replace("{{", "{").replace("}}", "}"), tail.replace("{{", "{").replace("}}", "}")
    fixed = len(backend.encode(head + tail, add_special_tokens=False).ids)
    per_unit = len(backend.encode(unit * 10, add_special_tokens=False).ids) / 10
    text = head + unit * max(int((TOKENS - fixed) / per_unit), 1) + tail
    ids: list[int] = backend.encode(text, add_special_tokens=False).ids
    records = _records(ids)
    prompt: list[int] = backend.encode("hi", add_special_tokens=False).ids
    records[0]["body"] |= {"prompt_token_ids": prompt, "prompt_tokens": len(prompt)}
    return records


def _family_rows() -> None:
    print(f"\nparser families, warm: ~{TOKENS}-token outputs in 1-token chunks, each on its own tokenizer")
    deciles_head = "per-decile mean µs per chunk (first → last)"
    print(f"{'family':<14}{'records':>8}{'total s':>9}  {deciles_head}{'':>6}last/first")
    for family, model, reasoning, tools, shape in FAMILIES:
        settings = ModelSettings(
            tokenizer=str(MODELS / model),
            served_model_names=("bench",),
            reasoning_parser=reasoning,
            tool_parser=tools,
            enable_auto_tool_choice=True,
        )
        derenderer = load_derenderer(settings)
        records = _family_records(settings, shape)
        costs = _run(lambda: new_processor(settings, derenderer), records, carry=False)  # noqa: B023
        deciles = _deciles(costs)
        print(
            f"{family:<14}{len(records):>8}{sum(costs):>9.3f}  "
            + " ".join(f"{d:>6.0f}" for d in deciles)
            + f"{deciles[-1] / deciles[0]:>9.2f}"
        )


def _deciles(costs: list[float]) -> list[float]:
    size = len(costs) // 10
    return [sum(costs[i * size : (i + 1) * size]) / size * 1e6 for i in range(10)]


def main(argv: list[str]) -> None:
    hermes = ModelSettings(
        vllm_version=VllmVersion.V0_34,
        tokenizer=str(MODELS / "qwen3"),
        served_model_names=("bench",),
        tool_parser="hermes",
        enable_auto_tool_choice=True,
    )
    plain = ModelSettings(
        vllm_version=VllmVersion.V0_34, tokenizer=str(MODELS / "qwen3"), served_model_names=("bench",)
    )
    hermes_derenderer = load_derenderer(hermes)
    plain_derenderer = load_derenderer(plain)
    ids = _generation(hermes)
    records = _records(ids)
    paths = {
        "warm": _run(lambda: new_processor(hermes, hermes_derenderer), records, carry=False),
        "cold": _run(lambda: new_processor(hermes, hermes_derenderer), records, carry=True),
        "plain": _run(lambda: new_processor(plain, plain_derenderer), records, carry=False),
    }
    print(f"parser paths: {len(ids)}-token hermes generation, Qwen3, 1-token chunks")
    print(f"{'path':<7}{'total s':>9}  per-decile mean µs per chunk (first → last){'':>6}last/first")
    for name, costs in paths.items():
        deciles = _deciles(costs)
        print(
            f"{name:<7}{sum(costs):>9.3f}  "
            + " ".join(f"{d:>6.0f}" for d in deciles)
            + f"{deciles[-1] / deciles[0]:>9.2f}"
        )
    warm_total = sum(paths["warm"])
    print(
        f"warm vs vLLM's {VLLM_SECONDS:.0f} s: {VLLM_SECONDS / warm_total:.0f}x faster (target >= 200x); "
        f"warm vs cold: {sum(paths['cold']) / warm_total:.0f}x"
    )
    harmony = ModelSettings(
        tokenizer=str(MODELS / "gpt-oss"),
        served_model_names=("bench",),
        tool_parser="openai",
        enable_auto_tool_choice=True,
    )
    harmony_derenderer = load_derenderer(harmony)
    harmony_ids = _harmony_generation(harmony)
    harmony_warm = _run(
        lambda: new_processor(harmony, harmony_derenderer), _records(harmony_ids), carry=False
    )
    deciles = _deciles(harmony_warm)
    print(
        f"{'gpt-oss':<7}{sum(harmony_warm):>9.3f}  "
        + " ".join(f"{d:>6.0f}" for d in deciles)
        + f"{deciles[-1] / deciles[0]:>9.2f}"
        + f"  (warm, Harmony: {len(harmony_ids)} tokens, reasoning then a long call)"
    )
    print(
        json.dumps(
            {
                "warm_s": warm_total,
                "cold_s": sum(paths["cold"]),
                "plain_s": sum(paths["plain"]),
                "harmony_warm_s": sum(harmony_warm),
            }
        )
    )
    _family_rows()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
