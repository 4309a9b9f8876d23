"""Issue 25 §2: precise return types on the public calls, under ``mypy --strict``.

mypy (the project's configuration: strict) checks the examples of docs/examples/ and
tests/typing/front_door.py, a file of ``assert_type`` checks over the front door and the
bridge, and reveals the types of tests/typing/revealed.py. ``AgentHandle.run_turn``
returned ``Any`` before: both checks failed on it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TYPING = ROOT / "tests" / "typing"

pytestmark = pytest.mark.slow  # a mypy run (a few seconds with a warm cache)


def mypy(*paths: Path) -> tuple[str, int]:
    api = pytest.importorskip("mypy.api")
    out, err, status = api.run([*(str(p) for p in paths), "--config-file", str(ROOT / "pyproject.toml")])
    return out + err, status


def test_the_examples_and_the_assert_type_file_pass_mypy_strict() -> None:
    out, status = mypy(ROOT / "docs" / "examples", TYPING / "front_door.py")
    assert status == 0, out
    assert "Success: no issues found" in out


def test_the_revealed_types_are_the_precise_ones() -> None:
    out, status = mypy(TYPING / "revealed.py")
    assert status == 0, out
    revealed = re.findall(r'Revealed type is "([^"]+)"', out)
    assert revealed == [
        "harness.agent._loop.AgentHandle",
        "harness.agent._types.TurnResult",
        "harness.agent._loop.AgentHandle",
        "tuple[str, ...]",
    ], out
