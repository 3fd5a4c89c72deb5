"""``qwen3_xml``: the same vLLM class as ``qwen3_coder`` (``Qwen3EngineToolParser``).

vLLM 0.33.0 registers both names to one parser-engine adapter; see
:mod:`worker.core.parsing.tools.qwen3_coder` for the format and behaviour.
"""

from __future__ import annotations

from worker.core.parsing.registry import tool_parser
from worker.core.parsing.tools.qwen3_coder import Qwen3EngineToolParser

tool_parser("qwen3_xml")(Qwen3EngineToolParser)

__all__ = ["Qwen3EngineToolParser"]
