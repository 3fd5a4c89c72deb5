"""The parser registry: an explicit name → ``module:Class`` table per kind, imported on first look-up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from worker.core.parsing.base import ReasoningParser, ToolParser
from worker.core.parsing.registry import REASONING_PARSERS, TOOL_PARSERS, reasoning_parsers, tool_parsers


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
def test_every_reasoning_name_loads_a_reasoning_parser(name: str) -> None:
    assert issubclass(reasoning_parsers()[name], ReasoningParser)


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_every_tool_name_loads_a_tool_parser(name: str) -> None:
    assert issubclass(tool_parsers()[name], ToolParser)


@pytest.mark.parametrize(
    ("kind", "names"),
    [
        ("tools", ("qwen3_coder", "qwen3_xml")),
        ("tools", ("hermes", "qwen3_json")),
        ("tools", ("llama3_json", "llama4_json")),
        ("tools", ("glm45", "glm47")),
        ("reasoning", ("glm45", "glm47")),
        ("reasoning", ("deepseek_r1", "step5")),
    ],
)
def test_vllm_aliases_are_one_class(kind: str, names: tuple[str, ...]) -> None:
    table = tool_parsers() if kind == "tools" else reasoning_parsers()
    assert len({table[name] for name in names}) == 1


def test_an_unknown_name_is_not_there() -> None:
    assert "minimax_m2" not in tool_parsers()
    with pytest.raises(KeyError):
        reasoning_parsers()["minimax_m2"]


def test_a_look_up_imports_only_that_parsers_module() -> None:
    code = (
        "import sys\n"
        "from worker.core.parsing.registry import tool_parsers\n"
        "tool_parsers()['hermes']\n"
        "print(sorted(m for m in sys.modules if m.startswith('worker.core.parsing.families')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
