"""`harness bench W8` (compaction of an agent session): a smoke run at a small n."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def run(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, env=env, timeout=300, check=False)


def test_bench_w8_reports_its_parts_and_the_ratio_to_w6() -> None:
    done = run("bench", "W8", "--n", "2000", "--runs", "1", "--json")
    assert done.returncode == 0, done.stderr.decode()
    data = orjson.loads(done.stdout)
    assert set(data) == {"W8"}
    w8 = data["W8"]
    assert w8["median_ms"] > 0 and w8["floor_ms"] > 0  # the floor is W6, same run
    assert w8["ratio"] == pytest.approx(w8["median_ms"] / w8["floor_ms"], rel=1e-2)
    parts = w8["prune_ms"] + w8["select_ms"] + w8["summary_commit_ms"] + w8["derive_ms"]
    assert parts == pytest.approx(w8["median_ms"], rel=1e-3)  # one run: the parts add up
    assert w8["pruned"] > 0 and w8["shadowed"] > 0 and w8["peak_mib"] >= 0
    before, after = (int(x) for x in w8["surface"].split("->"))
    assert after < before
