"""Packaging: the metadata people install from, and the ``testing`` extra's promise."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _prints_ok(program: str) -> None:
    """Run ``program`` in a fresh interpreter from the checkout: it must exit 0 and print ``ok``."""
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_license_is_an_spdx_expression_with_its_file() -> None:
    # The `license = {text = ...}` table is deprecated by setuptools (a warning on every
    # install, an error from 2027-02): PEP 639's SPDX string and license-files instead.
    project = PYPROJECT["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert not any(c.startswith("License ::") for c in project["classifiers"])


def test_classifiers_name_the_framework_and_the_typing() -> None:
    classifiers = set(PYPROJECT["project"]["classifiers"])
    assert {"Framework :: Trio", "Framework :: Pytest", "Typing :: Typed"} <= classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers


def test_testing_extra_carries_no_project_test_tools() -> None:
    testing = PYPROJECT["project"]["optional-dependencies"]["testing"]
    names = {dep.split(">")[0].split("[")[0].split(";")[0].strip() for dep in testing}
    assert names == {"pytest", "pytest-trio"}


def test_the_pytest_plugin_imports_without_the_project_test_tools() -> None:
    # What `pip install trio-harness[testing]` leaves out must not be imported by the
    # plugin: a meta-path hook makes each of them unimportable in a fresh interpreter.
    absent = ["psycopg", "psycopg_pool", "atheris", "hypothesis", "zstandard", "xdist"]
    program = textwrap.dedent(
        f"""
        import importlib.abc, sys
        ABSENT = {absent!r}
        class Absent(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ABSENT:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, Absent())
        import harness.testing
        import harness.faults
        assert not [m for m in sys.modules if m.split(".")[0] in ABSENT], sorted(sys.modules)
        print("ok")
        """
    )
    _prints_ok(program)


def test_the_cli_and_the_benches_do_not_import_the_test_framework() -> None:
    # `harness bench` measures the runtime in the heap an application would have:
    # trio.testing (harness.faults imports it) brings pytest's modules, which doubled
    # the cost of every full collection in W17. Only `harness chaos` and W13 need it,
    # and import it when they run.
    program = textwrap.dedent(
        """
        import sys
        from harness.cli import app
        app()
        from harness.bench import WORKLOADS  # every workload module
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in {"pytest", "_pytest", "hypothesis"} or m == "trio.testing" or m.startswith("harness.faults"))
        assert not leaked, leaked
        print("ok")
        """
    )
    _prints_ok(program)


def test_the_cli_group_imports_nothing_of_the_runtime() -> None:
    # Every `harness` command builds the whole group, and the group builds `bench`'s help
    # with the workload list: when that list lived beside the workloads, each command
    # (and `harness --help`) imported the runtime, Trio and psycopg first, ~0.9 s of its
    # ~1.2 s start. The list is its own module now.
    program = textwrap.dedent(
        """
        import sys
        from harness.cli import app
        app()
        heavy = {"trio", "psycopg", "psycopg_pool", "sqlite3", "httpx", "rich", "prompt_toolkit"}
        leaked = sorted(
            m for m in sys.modules
            if m.split(".")[0] in heavy
            or m.startswith(("harness.runtime", "harness.persistence", "harness.session", "harness.agent"))
            or (m.startswith("harness.bench.") and m != "harness.bench._descriptions")
        )
        assert not leaked, leaked
        print("ok")
        """
    )
    _prints_ok(program)


def test_the_repository_tracks_no_scratch_output() -> None:
    # A scratch loop's tempfile.mkdtemp(dir=".") output (tmpXXXXXXXX/s0.jsonl ... s63) was
    # once committed with a bench change: 256 session logs, 38k lines of "x".
    try:
        done = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        pytest.skip("no git here")
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    tops = {path.split("/")[0] for path in done.stdout.split("\0") if path}
    assert not sorted(t for t in tops if t.startswith("tmp")), "scratch output is tracked"
