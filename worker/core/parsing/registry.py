"""Name → parser class registries, filled by the modules of ``reasoning/``, ``tools/`` and ``families/``.

Every module in those sub-packages is imported on first use, and registers
itself with :func:`reasoning_parser` / :func:`tool_parser`; adding a parser
therefore only adds a module.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, TypeVar

from worker.core.parsing.base import ReasoningParser, ToolParser

_REASONING: dict[str, type[ReasoningParser]] = {}
_TOOLS: dict[str, type[ToolParser]] = {}
_loaded = False

R = TypeVar("R", bound=type[ReasoningParser])
T = TypeVar("T", bound=type[ToolParser])
C = TypeVar("C")


def _registrar(table: dict[str, Any], names: tuple[str, ...]) -> Callable[[C], C]:
    def register(cls: C) -> C:
        for name in names:
            table[name] = cls
        return cls

    return register


def reasoning_parser(*names: str) -> Callable[[R], R]:
    """Class decorator: register a reasoning parser under ``names``."""
    return _registrar(_REASONING, names)


def tool_parser(*names: str) -> Callable[[T], T]:
    """Class decorator: register a tool parser under ``names``."""
    return _registrar(_TOOLS, names)


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for package in ("reasoning", "tools", "families"):
        package = f"worker.core.parsing.{package}"
        module = importlib.import_module(package)
        for info in pkgutil.iter_modules(module.__path__):
            importlib.import_module(f"{package}.{info.name}")
    _loaded = True


def reasoning_parsers() -> dict[str, type[ReasoningParser]]:
    _load_all()
    return dict(_REASONING)


def tool_parsers() -> dict[str, type[ToolParser]]:
    _load_all()
    return dict(_TOOLS)
