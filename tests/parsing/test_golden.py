"""Golden vLLM 0.33.0 cases run directly through the parsing layer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.parsing_helpers import sample_tokenizer
from tests.paths import REPO_ROOT
from worker.core.model_dir import LoadedTokenizer
from worker.core.parsing import ChatParsing, DeltaOut, ParseRequest, adapter_for, resolve_finish_reason
from worker.errors import ParserSetupError

GOLDEN = REPO_ROOT / "tests" / "golden"
FILES = [
    "reasoning",
    "tools",
    "parsers_reasoning_deepseek_v3",
    "parsers_reasoning_glm45",
    "parsers_reasoning_mistral",
    "errors",
]
MINE_REASONING = {"qwen3", "deepseek_r1", "deepseek_v3", "glm45", "mistral"}
MINE_TOOLS = {"hermes"}


def to_parse_request(chat: dict[str, Any]) -> ParseRequest:
    tools = chat.get("tools")
    choice = chat.get("tool_choice", "auto" if tools else "none")
    return ParseRequest(
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=chat.get("parallel_tool_calls", True),
        include_reasoning=chat.get("include_reasoning", True),
        chat_template_kwargs=dict(chat.get("chat_template_kwargs") or {}),
        messages=list(chat.get("messages") or []),
    )


# Checks that belong to the core (request validation), not to parsing.
CORE_ONLY = {"err-parser-stream-exceeds-max_model_len"}


def relevant(case: dict[str, Any]) -> bool:
    if case["id"] in CORE_ONLY:
        return False
    cfg = case["config"]
    r, t = cfg["reasoning_parser"], cfg["tool_parser"] if cfg["enable_auto_tool_choice"] else None
    if r is None and t is None:
        return False
    return (r is None or r in MINE_REASONING) and (t is None or t in MINE_TOOLS)


def load_cases() -> list[dict[str, Any]]:
    cases = []
    for name in FILES:
        for line in (GOLDEN / f"{name}.jsonl").read_text().splitlines():
            case = json.loads(line)
            if relevant(case):
                cases.append(case)
    return cases


class Detok:
    """Cumulative decode diff with U+FFFD hold-back (the core's detokenizer stand-in)."""

    def __init__(self, lt: LoadedTokenizer) -> None:
        self.lt = lt
        self.ids: list[int] = []
        self.emitted = ""

    def step(self, ids: list[int]) -> str:
        self.ids.extend(i for i in ids if i >= 0)
        # Tokens ending in an unfinished character are held back whole.
        end = len(self.ids)
        text = self.lt.backend.decode(self.ids, skip_special_tokens=False)
        while text.endswith("\ufffd") and end > 0:
            end -= 1
            text = self.lt.backend.decode(self.ids[:end], skip_special_tokens=False)
        if len(text) <= len(self.emitted):
            return ""
        new = text[len(self.emitted) :]
        self.emitted = text
        return new


def drop_stop(lt: LoadedTokenizer, ids: list[int], finish: str | None) -> list[int]:
    if finish == "stop" and ids and ids[-1] in lt.model_eos_ids:
        return ids[:-1]
    return ids


class IdNormalizer:
    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, value: str | None) -> str | None:
        if value is None:
            return None
        if value not in self.seen:
            self.seen[value] = len(self.seen)
        return f"chatcmpl-tool-<{self.seen[value]}>"


def delta_json(delta: DeltaOut | None, norm: IdNormalizer) -> dict[str, Any]:
    if delta is None:
        return {"content": None, "reasoning": None}
    out: dict[str, Any] = {"content": delta.content, "reasoning": delta.reasoning}
    if delta.tool_calls:
        out["tool_calls"] = [
            {
                "id": norm(tc.id),
                "type": tc.type,
                "index": tc.index,
                "function": None
                if tc.function is None
                else {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in delta.tool_calls
        ]
    return out


def run_case(case: dict[str, Any]) -> list[Any]:
    """Our output per record, shaped like the expected envelopes' relevant parts."""
    cfg = case["config"]
    lt = sample_tokenizer(cfg["model_dir"])
    parsing = ChatParsing.create(
        adapter_for(lt),
        reasoning_parser=cfg["reasoning_parser"],
        tool_parser=cfg["tool_parser"],
        enable_auto_tool_choice=cfg["enable_auto_tool_choice"],
    )
    assert parsing is not None
    results: list[Any] = []
    norm = IdNormalizer()
    session = None
    detok = Detok(lt)
    for record in case["input"]:
        body = record["body"]
        chat = body.get("chat_request")
        if body["stream"]:
            if chat is None or body.get("prompt_token_ids") is None:
                results.append({"error": 400})
                break
            choices = body["generate_chunk"].get("choices") or []
            if not choices:
                results.append({"skip": True})
                continue
            choice = choices[0]
            request = to_parse_request(chat)
            if session is None:
                try:
                    session = parsing.new_stream(request, body["prompt_token_ids"])
                except ParserSetupError:
                    results.append({"error": 400})
                    break
            ids = choice.get("token_ids") or []
            finish = choice.get("finish_reason")
            text = detok.step(drop_stop(lt, ids, finish)) if ids else ""
            delta, reason = session.step(text, ids, finish)
            results.append({"delta": delta_json(delta, norm), "finish_reason": reason})
        else:
            if chat is None:
                results.append({"error": 400})
                continue
            gen = body["generate_response"]
            choice = gen["choices"][0]
            request = to_parse_request(chat)
            ids = choice["token_ids"]
            text = lt.backend.decode(
                [i for i in drop_stop(lt, ids, choice.get("finish_reason")) if i >= 0],
                skip_special_tokens=False,
            )
            try:
                msg = parsing.parse_full(text, ids, request, gen.get("prompt_token_ids"))
            except ParserSetupError:
                results.append({"error": 500})
                continue
            results.append(
                {
                    "message": {
                        "content": msg.content,
                        "reasoning": msg.reasoning,
                        "tool_calls": [
                            {
                                "id": norm(c.id),
                                "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments},
                            }
                            for c in msg.tool_calls
                        ],
                    },
                    "finish_reason": resolve_finish_reason(
                        choice.get("finish_reason"), request, bool(msg.tool_calls)
                    ),
                }
            )
    return results


def expected_of(case: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for env in case["expected"]:
        if "error" in env:
            out.append({"error": env["error"]["code"]})
            continue
        body = env["body"]
        if "chunk" in body:
            choices = body["chunk"]["choices"]
            if not choices:
                out.append({"skip": True})
                continue
            delta = dict(choices[0]["delta"])
            delta.pop("role", None)
            out.append({"delta": delta, "finish_reason": choices[0]["finish_reason"]})
        else:
            choice = body["choices"][0]
            msg = choice["message"]
            out.append(
                {
                    "message": {
                        "content": msg["content"],
                        "reasoning": msg.get("reasoning"),
                        "tool_calls": msg.get("tool_calls") or [],
                    },
                    "finish_reason": choice["finish_reason"],
                }
            )
    return out


CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_golden_case(case: dict[str, Any]) -> None:
    expected = expected_of(case)
    got = run_case(case)
    for i, (g, e) in enumerate(zip(got, expected, strict=False)):
        assert g == e, f"record {i}"
    assert len(got) == len(expected)
