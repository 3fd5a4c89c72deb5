"""No module of ``worker/`` imports one that imports it back, however indirectly: every import
counts, at module level, under ``TYPE_CHECKING`` and inside functions (a circle hidden in a function
or a type-only import still ties the two modules together). A shared piece goes to a leaf module."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from tests.paths import REPO_ROOT

PACKAGE = "worker"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``source`` (the module ``module``) imports, anywhere in it."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            for alias in node.names:
                # ``from pkg import mod`` imports the submodule; ``from mod import name`` the module.
                submodule = f"{origin}.{alias.name}"
                found.add(submodule if submodule in known else origin)
    return {name for name in found if name in known and name != module}


def import_graph(root: Path, package: str = PACKAGE) -> dict[str, set[str]]:
    paths = sorted((root / package).rglob("*.py"))
    names = {module_name(path, root): path for path in paths}
    known = set(names)
    return {
        name: imported_modules(path.read_text("utf-8"), name, path.name == "__init__.py", known)
        for name, path in names.items()
    }


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_worker_has_no_import_circle() -> None:
    graph = import_graph(REPO_ROOT)
    assert len(graph) > 50  # the whole package was read
    assert circles(graph) == []


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")


def test_every_kind_of_import_closes_a_circle(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "worker/__init__.py": "",
            "worker/sub/__init__.py": "",
            # a module-level import one way, a TYPE_CHECKING import back
            "worker/sub/a.py": "from worker.sub import b\n",
            "worker/sub/b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from worker.sub.a import X\n"
            ),
            # a relative import one way, an import inside a function back
            "worker/c.py": "from .sub.leaf import Y\n",
            "worker/sub/leaf.py": "def f():\n    import worker.c\n",
            # one way only: no circle
            "worker/d.py": "from worker.sub import a\n",
        },
    )
    graph = import_graph(tmp_path)
    assert graph["worker.d"] == {"worker.sub.a"}
    assert circles(graph) == [["worker.c", "worker.sub.leaf"], ["worker.sub.a", "worker.sub.b"]]


def test_a_circle_through_three_modules_is_one_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
