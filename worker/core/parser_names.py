"""The parser names we serve, one table per kind: name → ``"module:Class"`` (vLLM's names and aliases).

A leaf module, outside the ``parsing`` package: the settings check ``--reasoning-parser`` and
``--tool-parser`` and list the names in ``--help`` without importing a parser; ``parsing.registry``
imports a class the first time its name is looked up. Adding a parser is one line here plus its
module (``parsing/families/`` for an engine family).
"""

from __future__ import annotations

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
