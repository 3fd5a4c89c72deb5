"""Name → parser class, as one explicit table per kind (vLLM's lazily imported parser registries).

Each name maps to ``"module:Class"``; a module is imported the first time one
of its names is looked up, so a server configured for one family loads only
that family. Several names may share a class (vLLM's aliases). Adding a parser
is one line here plus its module (``families/`` for an engine family).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar, cast

from worker.core.parsing.base import ReasoningParser, ToolParser

_P = "worker.core.parsing"

#: vLLM 0.33.0's reasoning parser names we serve (vllm/reasoning/__init__.py)
REASONING_PARSERS: dict[str, str] = {
    "deepseek_r1": f"{_P}.reasoning.deepseek_r1:DeepSeekR1ReasoningParser",
    "deepseek_v3": f"{_P}.reasoning.deepseek_v3:DeepSeekV3ReasoningParser",
    "deepseek_v4": f"{_P}.families.deepseek_dsml:DeepSeekV4ReasoningParser",
    "glm45": f"{_P}.families.glm45:Glm45ReasoningParser",
    "glm47": f"{_P}.families.glm45:Glm45ReasoningParser",
    "kimi_k2": f"{_P}.families.kimi_k2:KimiK2ReasoningParser",
    "mistral": f"{_P}.families.mistral:MistralReasoningParser",
    "nemotron_v3": f"{_P}.families.nemotron_v3:NemotronV3ReasoningParser",
    "openai_gptoss": f"{_P}.families.harmony:GptOssReasoning",
    "qwen3": f"{_P}.families.qwen3:Qwen3ReasoningParser",
    "step5": f"{_P}.reasoning.deepseek_r1:DeepSeekR1ReasoningParser",
}

#: vLLM 0.33.0's tool parser names we serve (vllm/tool_parsers/__init__.py)
TOOL_PARSERS: dict[str, str] = {
    "deepseek_v31": f"{_P}.tools.deepseek_v31:DeepSeekV31ToolParser",
    "deepseek_v32": f"{_P}.families.deepseek_dsml:DeepSeekV32ToolParser",
    "deepseek_v4": f"{_P}.families.deepseek_dsml:DeepSeekV4ToolParser",
    "glm45": f"{_P}.families.glm45:Glm47MoeToolParser",
    "glm47": f"{_P}.families.glm45:Glm47MoeToolParser",
    "hermes": f"{_P}.tools.hermes:HermesToolParser",
    "kimi_k2": f"{_P}.families.kimi_k2:KimiK2ToolParser",
    "llama3_json": f"{_P}.tools.llama3_json:Llama3JsonToolParser",
    "llama4_json": f"{_P}.tools.llama3_json:Llama3JsonToolParser",
    "llama4_pythonic": f"{_P}.tools.llama4_pythonic:Llama4PythonicToolParser",
    "mistral": f"{_P}.families.mistral:MistralToolParser",
    "openai": f"{_P}.families.harmony:GptOssTools",
    "pythonic": f"{_P}.tools.pythonic:PythonicToolParser",
    "qwen3_coder": f"{_P}.families.qwen3:Qwen3EngineToolParser",
    "qwen3_json": f"{_P}.tools.hermes:HermesToolParser",
    "qwen3_xml": f"{_P}.families.qwen3:Qwen3EngineToolParser",
}

C = TypeVar("C", bound=type)


def load(target: str) -> type:
    """The class a ``"module:Class"`` entry names (its module imported now)."""
    module_name, _, class_name = target.partition(":")
    found = getattr(importlib.import_module(module_name), class_name)
    if not isinstance(found, type):
        raise TypeError(f"{target} is not a class")
    return found


class LazyRegistry(Mapping[str, C], Generic[C]):
    """A read-only name → class mapping over one table; a class is imported when first asked for."""

    def __init__(self, table: dict[str, str], base: type) -> None:
        self._table = table
        self._base = base
        self._loaded: dict[str, C] = {}

    def __getitem__(self, name: str) -> C:
        if name not in self._loaded:
            cls = load(self._table[name])
            if not issubclass(cls, self._base):
                raise TypeError(f"{self._table[name]} is not a {self._base.__name__}")
            self._loaded[name] = cast(C, cls)
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


_REASONING: LazyRegistry[type[ReasoningParser]] = LazyRegistry(REASONING_PARSERS, ReasoningParser)
_TOOLS: LazyRegistry[type[ToolParser]] = LazyRegistry(TOOL_PARSERS, ToolParser)


def reasoning_parsers() -> Mapping[str, type[ReasoningParser]]:
    return _REASONING


def tool_parsers() -> Mapping[str, type[ToolParser]]:
    return _TOOLS
