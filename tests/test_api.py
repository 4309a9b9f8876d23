"""The errors carry stable codes, and the layering holds (the exported surface:
tests/test_public_surface.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The exported surface of each public package is checked against docs/api.md, its one
# source of truth, by tests/test_public_surface.py.


def test_every_error_has_a_stable_code() -> None:
    from harness import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.HarnessError)
        assert isinstance(cls.code, str) and cls.code.isupper(), name


def test_actors_never_import_harness() -> None:
    for path in (REPO / "actors").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "harness" for a in node.names), path
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "harness", path


def test_the_session_core_has_no_trio() -> None:
    for path in (REPO / "harness" / "session").rglob("*.py"):
        text = path.read_text()
        assert "import trio" not in text and "from trio" not in text, path


@pytest.mark.parametrize("package", ["providers", "compaction"])
def test_providers_and_compaction_never_import_the_agent_loop(package: str) -> None:
    # The agent loop will use compaction; compaction's summarizer uses the provider
    # protocol. Neither may import harness.agent (an import cycle in waiting).
    for path in (REPO / "harness" / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("harness.agent"), path
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("harness.agent") for a in node.names), path
