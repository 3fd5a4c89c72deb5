"""Name → parser class, over one explicit table per kind (vLLM's lazily imported parser registries).

Each name maps to ``"module:Class"`` (the tables: ``worker.core.parser_names``); a module is
imported the first time one of its names is looked up, so a server configured for one family loads
only that family. Several names may share a class (vLLM's aliases). Adding a parser is one line in
``parser_names`` plus its module (``families/`` for an engine family).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar, cast

# The tables (name -> "module:Class") live in a leaf module: the settings list the names without
# importing the parsers.
from worker.core.parser_names import REASONING_PARSERS as REASONING_PARSERS
from worker.core.parser_names import TOOL_PARSERS as TOOL_PARSERS
from worker.core.parsing.base import ReasoningParser, ToolParser

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
