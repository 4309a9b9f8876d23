"""The house reads as the architecture (docs/architecture.md, Layers): no import circle
among the modules of ``harness/`` and ``actors/``, and no module imports a layer above
its own.

Every import counts, wherever it is written: at module level, inside a function (a lazy
import is the same coupling, paid later) and under ``if TYPE_CHECKING`` (a type-only
import shows the same dependency).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actors", "harness")

# Lowest first. A module belongs to the longest entry that is its name or a package
# prefix of it ("harness" is the front door, ``harness/__init__.py``, alone). A module may
# import its own entry (circles inside it are checked separately) and entries of lower
# layers; never a higher layer, nor another entry of its own layer (peers stay apart).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("actors",),  # the domain-free actor kernel: never imports harness/
    ("harness.errors",),  # one exception hierarchy, below everything that raises
    ("harness._paths",),  # path checks (stdlib only), shared by the front door and the CLI
    ("harness.session",),  # the pure synchronous core
    ("harness.providers",),  # the model-provider protocol (no runtime)
    ("harness.compaction",),  # meter, selection, summarizer: over session + providers
    ("harness.runtime",),  # session and store actors, handles (uses compaction's transaction)
    ("harness.persistence",),  # backends and writers, built on the runtime's store
    ("harness.agent",),  # agent loop, hooks, tools, its fault points
    ("harness._open",),  # resume-or-create over the agent loop
    ("harness._runtime_api",),  # Runtime / open_runtime
    ("harness.bridge",),  # the runtime from threads and other loops
    ("harness",),  # the front door: the public names of the package root
    ("harness.faults",),  # exploration, scenarios, invariants over everything below
    ("harness.testing",),  # the pytest plugin
    ("harness.cli._output",),  # the command line's output rules, a leaf: bench and fuzz draw their progress with it
    ("harness.bench", "harness.fuzz", "harness.demo"),  # runnable tools, peers
    ("harness.cli",),  # the `harness` command, over every tool
)

# Circles being broken elsewhere, allowed until then; nothing else is. A circle passes
# only if all its modules are in one entry (a smaller remnant of it passes too).
#: Circles allowed for now: none (the runtime's store/handles circle was broken in
#: issue 27; an entry here needs a comment saying why and until when).
KNOWN_CYCLES: tuple[frozenset[str], ...] = ()


@attrs.frozen
class Import:
    source: str
    target: str
    line: int


def modules_of(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module under ``root``'s ``packages``, by dotted name (a package by its own)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(modules: Mapping[str, Path]) -> list[Import]:
    """The imports between ``modules``: each names the most specific module it loads."""

    def known(name: str) -> str | None:
        parts = name.split(".")
        while parts:
            if ".".join(parts) in modules:
                return ".".join(parts)
            parts.pop()
        return None

    found: list[Import] = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [known(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    origin = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    origin = node.module or ""
                # `from pkg import sub` loads the submodule; `from mod import name` the module.
                targets = [
                    (origin + "." + alias.name) if (origin + "." + alias.name) in modules else known(origin)
                    for alias in node.names
                ]
            for target in targets:
                if target is not None and target != name:
                    found.append(Import(name, target, node.lineno))
    return found


def layer_of(module: str) -> tuple[int, str] | None:
    """The layer index and entry of ``module`` (None: not placed in LAYERS)."""
    best: tuple[int, str] | None = None
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            inside = module == entry or (entry != "harness" and module.startswith(entry + "."))
            if inside and (best is None or len(entry) > len(best[1])):
                best = (index, entry)
    return best


def upward_imports(imports: Iterable[Import]) -> list[str]:
    """Each import of a higher layer or of a peer entry, as ``source:line -> target``."""
    wrong: list[str] = []
    for imp in imports:
        source, target = layer_of(imp.source), layer_of(imp.target)
        assert source is not None and target is not None
        if source[1] == target[1] or target[0] < source[0]:
            continue
        how = "a peer" if target[0] == source[0] else "a higher layer"
        wrong.append(f"{imp.source}:{imp.line} imports {imp.target} ({how}: {target[1]} over {source[1]})")
    return wrong


def cycles(imports: Iterable[Import]) -> list[list[Import]]:
    """One circle per strongly connected component of more than one module, as the
    imports that close it (Tarjan for the components, then a shortest way round)."""
    graph: dict[str, dict[str, Import]] = {}
    for imp in imports:
        graph.setdefault(imp.source, {}).setdefault(imp.target, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for component in components:
        start = min(component)
        # Breadth-first from start back to it, inside the component.
        came: dict[str, Import] = {}
        frontier = [start]
        while frontier and start not in came:
            nxt = []
            for v in frontier:
                for w, imp in sorted(graph.get(v, {}).items()):
                    if w in component and w not in came:
                        came[w] = imp
                        nxt.append(w)
            frontier = nxt
        path = [came[start]]
        while path[-1].source != start:
            path.append(came[path[-1].source])
        found.append(path[::-1])
    return found


def describe(circle: list[Import]) -> str:
    return " -> ".join(f"{imp.source}:{imp.line}" for imp in circle) + f" -> {circle[0].source}"


MODULES = modules_of(ROOT, PACKAGES)
IMPORTS = imports_of(MODULES)


def test_every_module_has_a_layer() -> None:
    assert [m for m in MODULES if layer_of(m) is None] == []


def test_actors_never_imports_harness() -> None:
    assert [f"{i.source}:{i.line} -> {i.target}" for i in IMPORTS if i.source.startswith("actors") and i.target.startswith("harness")] == []


def test_no_upward_import() -> None:
    assert upward_imports(IMPORTS) == []


def test_no_import_circle() -> None:
    unknown = [describe(c) for c in cycles(IMPORTS) if not any({i.source for i in c} <= known for known in KNOWN_CYCLES)]
    assert unknown == []


# -- the checker itself, on a planted tree --------------------------------------------------


def _plant(root: Path, files: Mapping[str, str]) -> list[Import]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return imports_of(modules_of(root, ("harness",)))


def test_the_checker_finds_a_circle_through_type_only_and_lazy_imports(tmp_path: Path) -> None:
    imports = _plant(
        tmp_path,
        {
            "harness/__init__.py": "",
            "harness/agent/__init__.py": "from harness.agent._a import A\n",
            "harness/agent/_a.py": "from . import _b\n",
            "harness/agent/_b.py": "def f():\n    from harness.agent._c import C\n",
            "harness/agent/_c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import A\n",
        },
    )
    (circle,) = cycles(imports)
    assert describe(circle) == "harness.agent._a:1 -> harness.agent._b:2 -> harness.agent._c:3 -> harness.agent._a"


def test_the_checker_finds_upward_and_peer_imports(tmp_path: Path) -> None:
    imports = _plant(
        tmp_path,
        {
            "harness/__init__.py": "",
            "harness/session/__init__.py": "def f():\n    import harness.runtime._store\n",
            "harness/runtime/_store.py": "from harness.session import f\n",
            "harness/bench/__init__.py": "from harness.demo import x\n",
            "harness/demo/__init__.py": "",
        },
    )
    assert cycles(imports) != []
    assert sorted(upward_imports(imports)) == [
        "harness.bench:1 imports harness.demo (a peer: harness.demo over harness.bench)",
        "harness.session:2 imports harness.runtime._store (a higher layer: harness.runtime over harness.session)",
    ]


# -- the agent's hooks see the whole agent through a protocol -------------------------------


def test_the_hooks_agent_protocol_lists_every_public_member_of_agent() -> None:
    from harness.agent import Agent
    from harness.agent._hooks import AgentView

    def public(names: Iterable[str]) -> set[str]:
        return {n for n in names if not n.startswith("_")}

    declared = public(AgentView.__annotations__) | public(n for n, _ in inspect.getmembers(AgentView))
    source = inspect.getsource(Agent.__init__)
    attributes = public(n for n in ast.walk(ast.parse(textwrap.dedent(source))) for n in _self_targets(n))
    members = public(n for n, _ in inspect.getmembers(Agent)) | attributes
    assert members - declared == set()
    assert declared - members == set()


def _self_targets(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"]
    return []
