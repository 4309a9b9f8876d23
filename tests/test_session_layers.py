"""The session package's modules form a DAG (issue 27): no import circle, type-only
imports included, because they show the same coupling."""

from __future__ import annotations

import ast
from pathlib import Path

import harness.session

PACKAGE = Path(harness.session.__file__).parent
NAME = "harness.session"


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports (anywhere in it, ``TYPE_CHECKING`` too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out.update(n for n in names if n.startswith(NAME + ".") and n.count(".") == 2)
    return out


def _graph() -> dict[str, set[str]]:
    modules = {f"{NAME}.{p.stem}": p for p in PACKAGE.glob("_*.py") if p.stem != "__init__"}
    return {m: _imports(p) & modules.keys() - {m} for m, p in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*path[path.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_session_modules_import_no_circle() -> None:
    graph = _graph()
    assert f"{NAME}._planning" in graph  # the walk sees the package
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
