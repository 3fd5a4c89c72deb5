"""Loading and normalizing the golden cases (vLLM's own derender outputs: ``tests/golden/`` from
0.33.0, ``tests/golden_034/`` from 0.34.0)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.paths import REPO_ROOT
from worker.core.derenderer import Derenderer
from worker.core.vllm_version import VllmVersion
from worker.runtime.composition import load_derenderer
from worker.settings import ModelSettings

GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
GOLDEN_034_DIR = REPO_ROOT / "tests" / "golden_034"
#: The release ``tests/golden/`` was recorded with: what the helpers below build unless told.
GOLDEN_VERSION = VllmVersion.V0_33
FAMILIES_DIR = REPO_ROOT / "tests" / "golden_families"
MODELS_DIR = REPO_ROOT / "samples" / "models"

_RANDOM_ID_FORMATS = (
    (re.compile(r"^chatcmpl-tool-[0-9a-f]+$"), "chatcmpl-tool-<{}>"),
    (re.compile(r"^[A-Za-z0-9]{9}$"), "<mistral-tool-id-{}>"),
)


@dataclass(frozen=True)
class GoldenCase:
    file: str
    id: str
    config: dict[str, Any]
    input: list[dict[str, Any]]
    expected: list[dict[str, Any]]

    @property
    def uses_parser(self) -> bool:
        return bool(self.config.get("reasoning_parser") or self.config.get("tool_parser"))


def load_cases(directory: Path = GOLDEN_DIR) -> list[GoldenCase]:
    """The cases of every ``*.jsonl`` file in ``directory`` (the parser families' are in ``FAMILIES_DIR``)."""
    cases = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                raw = json.loads(line)
                cases.append(GoldenCase(path.stem, raw["id"], raw["config"], raw["input"], raw["expected"]))
    return cases


def sample_config(*, parsers: bool = False, **overrides: Any) -> dict[str, Any]:
    """A golden-case config for the bundled Qwen3 tokenizer served as ``test-model``: no limits, and no
    parsers unless ``parsers`` (then qwen3 reasoning and hermes tools, auto tool choice on).
    ``overrides`` replace keys of it (``sample_config(max_model_len=64)``)."""
    config: dict[str, Any] = {
        "model_dir": "qwen3",
        "served_model_name": "test-model",
        "reasoning_parser": "qwen3" if parsers else None,
        "tool_parser": "hermes" if parsers else None,
        "enable_auto_tool_choice": parsers,
        "max_model_len": None,
        "max_logprobs": None,
        "parse_budget_window": None,
    }
    if unknown := overrides.keys() - config.keys():
        raise TypeError(f"not a config key: {sorted(unknown)}")
    return config | overrides


def settings_for(config: dict[str, Any], version: VllmVersion = GOLDEN_VERSION) -> ModelSettings:
    return ModelSettings(
        vllm_version=version,
        tokenizer=str(MODELS_DIR / config["model_dir"]),
        served_model_names=(config["served_model_name"],),
        max_model_len=config.get("max_model_len"),
        max_logprobs=config["max_logprobs"] if config.get("max_logprobs") is not None else 20,
        reasoning_parser=config.get("reasoning_parser"),
        tool_parser=config.get("tool_parser"),
        enable_auto_tool_choice=bool(config.get("enable_auto_tool_choice")),
        parse_budget_window=config.get("parse_budget_window"),
    )


@functools.cache
def _derenderer(key: str, version: VllmVersion) -> Derenderer:
    return load_derenderer(settings_for(json.loads(key), version))


def derenderer_for(config: dict[str, Any], version: VllmVersion = GOLDEN_VERSION) -> Derenderer:
    """One shared derenderer per configuration and version (tokenizer loading is the slow part)."""
    return _derenderer(json.dumps(config, sort_keys=True), version)


def normalize(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The golden README's two normalizations: ``created`` → 0, random tool-call ids by first appearance."""
    ids: dict[str, str] = {}

    def rename(value: str) -> str:
        if value in ids:
            return ids[value]
        for pattern, placeholder in _RANDOM_ID_FORMATS:
            if pattern.match(value):
                ids[value] = placeholder.format(len(ids))
                return ids[value]
        return value

    def walk(node: Any, key: str | None = None) -> Any:
        if isinstance(node, dict):
            out: dict[str, Any] = {}
            for k, v in node.items():
                if k == "created" and isinstance(v, int):
                    out[k] = 0
                elif k == "tool_calls" and isinstance(v, list):
                    out[k] = [
                        walk({**c, "id": rename(c["id"]) if isinstance(c.get("id"), str) else c.get("id")})
                        for c in v
                    ]
                elif k == "last_tool_call_ids" and isinstance(v, list):
                    out[k] = [rename(i) for i in v]
                else:
                    out[k] = walk(v, k)
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return [walk(o) for o in outputs]
