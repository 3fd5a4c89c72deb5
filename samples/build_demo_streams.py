"""Build ``streams/demo-qwen3.jsonl``: recorded generate streams for the demo.

Prompts are rendered with the real Qwen3 chat template, answers encoded with
the real Qwen3 tokenizer and cut into records of 1 to 4 tokens (seeded, so the
file is reproducible): a plain answer with emoji and CJK, a reasoning answer,
a tool call, and an n=2 completion. Run: ``python samples/build_demo_streams.py`` (rendering the
template needs jinja2, which the worker itself does not: ``pip install jinja2``).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
from transformers import AutoTokenizer

from worker.core.model_dir import unpacked_model_dir

HERE = Path(__file__).resolve().parent
MODEL = "qwen3-demo"
EOS = 151645  # <|im_end|>
ENDOFTEXT = 151643

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}

JsonDict = dict[str, Any]


def _chunks(ids: list[int], rng: random.Random) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        step = rng.randint(1, 4)
        out.append(ids[i : i + step])
        i += step
    return out


def _chat_records(
    rid: str, prompt: list[int], answer: list[int], request: JsonDict, rng: random.Random
) -> list[JsonDict]:
    records = []
    chunks = _chunks([*answer, EOS], rng)
    for seq, chunk in enumerate(chunks):
        choice: JsonDict = {"index": 0, "token_ids": chunk}
        if seq == len(chunks) - 1:
            choice["finish_reason"] = "stop"
        body: JsonDict = {"stream": True, "generate_chunk": {"request_id": rid, "choices": [choice]}}
        if seq == 0:
            body |= {
                "model": MODEL,
                "prompt_tokens": len(prompt),
                "prompt_token_ids": prompt,
                "chat_request": request,
            }
        records.append({"request_id": rid, "seq": seq, "endpoint": "chat", "body": body})
    usage = {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(answer) + 1,
        "total_tokens": len(prompt) + len(answer) + 1,
    }
    records.append(
        {
            "request_id": rid,
            "seq": len(records),
            "endpoint": "chat",
            "body": {"stream": True, "generate_chunk": {"request_id": rid, "choices": [], "usage": usage}},
        }
    )
    return records


def build() -> list[JsonDict]:
    folder = unpacked_model_dir(HERE / "models" / "qwen3")
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    rng = random.Random(20261130)

    def render(messages: list[JsonDict], **kwargs: Any) -> list[int]:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        return list(tok.encode(text, add_special_tokens=False))

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    records: list[JsonDict] = []
    # 1. Plain answer, thinking switched off by the template: emoji and CJK across record boundaries.
    messages = [{"role": "user", "content": "Say hello to Beijing and Paris, with emoji."}]
    prompt = render(messages, enable_thinking=False)
    answer = "Hello Beijing 北京你好 🇨🇳 and bonjour Paris 🥐✨! 世界很大，我们一起看看。"
    request = {
        "model": MODEL,
        "messages": messages,
        "stream": True,
        "chat_template_kwargs": {"enable_thinking": False},
        "stream_options": {"include_usage": True},
    }
    records += _chat_records("demo-plain", prompt, encode(answer), request, rng)

    # 2. A reasoning answer: the template leaves thinking on.
    messages = [{"role": "user", "content": "Is 1001 a prime number?"}]
    prompt = render(messages)
    answer = (
        "<think>\nCheck small primes: 1001 / 7 = 143, and 143 = 11 × 13. So 1001 = 7 × 11 × 13.\n</think>\n\n"
        "No. 1001 = 7 × 11 × 13, so it is not prime."
    )
    request = {
        "model": MODEL,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    records += _chat_records("demo-reasoning", prompt, encode(answer), request, rng)

    # 3. A tool call after a short reasoning.
    messages = [{"role": "user", "content": "What's the weather in Tokyo, in celsius?"}]
    prompt = render(messages, tools=[WEATHER_TOOL])
    answer = (
        "<think>\nThe user wants Tokyo's weather in celsius; call get_weather.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "c"}}\n</tool_call>'
    )
    request = {
        "model": MODEL,
        "messages": messages,
        "stream": True,
        "tools": [WEATHER_TOOL],
        "stream_options": {"include_usage": True},
    }
    records += _chat_records("demo-tool", prompt, encode(answer), request, rng)

    # 4. An n=2 completion, the two choices interleaved as the engine streams them.
    prompt = encode("Haiku about Kafka:\n")
    answers = [
        encode("Records flow in line,\nlogs that never forget them—\noffsets mark the time."),
        encode("分区里的消息\n一条一条向前流\n提交，再继续。"),
    ]
    streams = [_chunks(a, rng) for a in answers]
    request = {"model": MODEL, "prompt": "Haiku about Kafka:\n", "stream": True, "n": 2}
    seq = 0
    positions = [0, 0]
    while any(positions[i] < len(streams[i]) for i in range(2)):
        for i in range(2):
            if positions[i] >= len(streams[i]):
                continue
            chunk = streams[i][positions[i]]
            positions[i] += 1
            choice: JsonDict = {"index": i, "token_ids": chunk}
            if positions[i] == len(streams[i]):
                choice["finish_reason"] = "length"
            body: JsonDict = {
                "stream": True,
                "generate_chunk": {"request_id": "demo-completion", "choices": [choice]},
            }
            if seq == 0:
                body |= {
                    "model": MODEL,
                    "prompt_tokens": len(prompt),
                    "prompt_token_ids": prompt,
                    "completion_request": request,
                }
            records.append(
                {"request_id": "demo-completion", "seq": seq, "endpoint": "completion", "body": body}
            )
            seq += 1
    return records


if __name__ == "__main__":
    target = HERE / "streams" / "demo-qwen3.jsonl"
    lines = [json.dumps(r, ensure_ascii=False) for r in build()]
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{target.name}: {len(lines)} records")
