"""Streams and references for the ``audit`` tests: the recorded Qwen3 demo streams, a copy of them that
carries ``stream_state`` on every record (a stateless client's stream), and replay under a configuration.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from tests.golden_cases import MODELS_DIR, normalize
from tests.paths import REPO_ROOT
from tests.stream_builders import written
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.vllm_version import VllmVersion
from worker.runtime.composition import load_derenderer, new_processor
from worker.settings import ModelSettings

DEMO_STREAM = REPO_ROOT / "samples" / "streams" / "demo-qwen3.jsonl"
CONTEXT_FIELDS = ("model", "prompt_tokens", "prompt_token_ids", "chat_request", "completion_request")

# The vLLM version every audit here matches (the recorded streams are written with it too).
DEMO_VERSION = VllmVersion.V0_34
VERSION_FLAGS = ["--vllm-version", DEMO_VERSION.value]
# The demo's configuration, and the two changes the tests audit with.
DEMO_FLAGS = [
    "--tokenizer",
    str(MODELS_DIR / "qwen3"),
    "--served-model-name",
    "qwen3-demo",
    "--reasoning-parser",
    "qwen3",
    "--tool-parser",
    "hermes",
    "--enable-auto-tool-choice",
    *VERSION_FLAGS,
]
OTHER_TOOL_PARSER_FLAGS = [
    *DEMO_FLAGS[:6],
    "--tool-parser",
    "qwen3_xml",
    "--enable-auto-tool-choice",
    *VERSION_FLAGS,
]
NO_REASONING_FLAGS = [*DEMO_FLAGS[:4], "--tool-parser", "hermes", "--enable-auto-tool-choice", *VERSION_FLAGS]

Envelope = dict[str, Any]


def settings_for(flags: list[str]) -> ModelSettings:
    """The ``ModelSettings`` the CLI makes of these flags (the subset the tests use)."""
    values: dict[str, Any] = {}
    i = 0
    while i < len(flags):
        name = flags[i].lstrip("-").replace("-", "_")
        if name == "enable_auto_tool_choice":
            values[name] = True
            i += 1
            continue
        values[name] = flags[i + 1]
        i += 2
    return ModelSettings(
        tokenizer=values["tokenizer"],
        served_model_names=(values["served_model_name"],),
        max_model_len=int(values["max_model_len"]) if "max_model_len" in values else None,
        reasoning_parser=values.get("reasoning_parser"),
        tool_parser=values.get("tool_parser"),
        enable_auto_tool_choice=bool(values.get("enable_auto_tool_choice")),
        vllm_version=VllmVersion(values["vllm_version"]),
    )


_LOAD = load_derenderer
_DERENDERERS: dict[ModelSettings, Derenderer] = {}


def shared_derenderer(settings: ModelSettings) -> Derenderer:
    """``composition.load_derenderer`` loading each configuration once per test session (a tokenizer
    takes seconds to load; a derenderer holds no request state, so tests can share it).
    """
    if settings not in _DERENDERERS:
        _DERENDERERS[settings] = _LOAD(settings)
    return _DERENDERERS[settings]


def demo_envelopes() -> list[Envelope]:
    return [orjson.loads(line) for line in DEMO_STREAM.read_bytes().splitlines() if line.strip()]


def with_carried_state(
    envelopes: list[Envelope], flags: list[str], suffix: str = "-carried"
) -> list[Envelope]:
    """A copy of the single-choice chat requests that carries, on every record after the first, the
    previous output's ``stream_state`` and the request's context, as a stateless client sends them.
    """
    settings = settings_for(flags)
    processor = new_processor(settings, shared_derenderer(settings))
    by_request: dict[str, list[Envelope]] = defaultdict(list)
    for envelope in envelopes:
        by_request[envelope["request_id"]].append(envelope)
    out = []
    for rid, records in by_request.items():
        if records[0]["endpoint"] != "chat":
            continue
        context = {k: v for k, v in records[0]["body"].items() if k in CONTEXT_FIELDS}
        state = None
        for record in records:
            copy = orjson.loads(orjson.dumps(record))
            copy["request_id"] = rid + suffix
            copy["body"]["generate_chunk"]["request_id"] = rid + suffix
            if record["seq"] > 0:
                copy["body"] = {**context, **copy["body"], "stream_state": state}
            out.append(copy)
            result = processor.process(orjson.dumps(record))
            assert result.output is not None
            state = result.stream_state()
    return out


def round_robin(envelopes: list[Envelope]) -> list[Envelope]:
    """The requests' records interleaved one by one, each request's order kept."""
    queues: dict[str, list[Envelope]] = defaultdict(list)
    for envelope in envelopes:
        queues[envelope["request_id"]].append(envelope)
    out = []
    while any(queues.values()):
        for queue in queues.values():
            if queue:
                out.append(queue.pop(0))
    return out


def replay_outputs(flags: list[str], envelopes: list[Envelope]) -> list[Envelope]:
    """Each record's output through one ``EnvelopeProcessor`` (the worker's core), in order."""
    settings = settings_for(flags)
    processor: EnvelopeProcessor = new_processor(settings, shared_derenderer(settings))
    outputs = []
    for envelope in envelopes:
        result = processor.process(orjson.dumps(envelope))
        assert result.output is not None, envelope
        outputs.append(written(result))
    return outputs


def changed_records(old: list[Envelope], new: list[Envelope]) -> set[tuple[str, int]]:
    """(request_id, seq) of every output that differs after the golden normalizations."""

    def grouped(outputs: list[Envelope]) -> dict[str, list[Envelope]]:
        groups: dict[str, list[Envelope]] = defaultdict(list)
        for output in outputs:
            groups[output["request_id"]].append({k: v for k, v in output.items() if k != "source"})
        return groups

    old_g, new_g = grouped(old), grouped(new)
    changed = set()
    for rid in old_g:
        for a, b in zip(normalize(old_g[rid]), normalize(new_g[rid]), strict=True):
            if a != b:
                changed.add((rid, a["seq"]))
    return changed


ABSENT = "<absent>"


def resolve(record: Any, path: str) -> Any:
    """The value at a report's JSON path (``body.chunk.choices[0].delta.content``); ``ABSENT`` if none."""
    node = record
    for part in path.replace("[", ".[").split("."):
        if not part:
            continue
        try:
            node = node[int(part[1:-1])] if part.startswith("[") else node[part]
        except (KeyError, IndexError):
            return ABSENT
    return node


def write_jsonl(path: Path, records: list[Envelope]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def read_jsonl(path: Path) -> list[Envelope]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def tamper(outputs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One content delta changed by one character, one record deleted, one duplicated (3 requests)."""
    out = [dict(o) for o in outputs]
    picked: dict[str, int] = {}

    def find(rid: str, content: bool) -> int:
        for i, o in enumerate(out):
            if o["request_id"] != rid or o["seq"] <= 2:
                continue
            choices = o["body"]["chunk"]["choices"]
            if not content or (choices and choices[0]["delta"].get("content")):
                return i
        raise AssertionError(rid)

    i = find("demo-plain", content=True)
    record = orjson.loads(orjson.dumps(out[i]))
    delta = record["body"]["chunk"]["choices"][0]["delta"]
    delta["content"] = delta["content"][:-1] + ("X" if delta["content"][-1] != "X" else "Y")
    out[i] = record
    picked["tampered"] = record["seq"]
    i = find("demo-reasoning", content=False)
    picked["deleted"] = out[i]["seq"]
    del out[i]
    i = find("demo-completion", content=False)
    picked["duplicated"] = out[i]["seq"]
    out.insert(i + 1, out[i])
    return out, picked
