"""`harness bench W9 W10 W11 M1` (issue 15): smoke runs at a tiny n, JSON shape only."""

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


def check_ratio(entry: dict[str, object]) -> None:
    median, floor, ratio = entry["median_ms"], entry["floor_ms"], entry["ratio"]
    assert isinstance(median, float) and isinstance(floor, float) and isinstance(ratio, float)
    assert median > 0 and floor > 0
    assert ratio == pytest.approx(median / floor, rel=1e-2)


def test_durable_and_batched_workloads_report_their_floors() -> None:
    done = run("bench", "W9", "W10", "W11", "M1", "--n", "200", "--runs", "1", "--json")
    assert done.returncode == 0, done.stderr.decode()
    data = orjson.loads(done.stdout)
    durable = {f"{base}{form}{kind}" for base in ("W9", "W10") for form in ("", "-durable") for kind in ("", "-sqlite")}
    assert set(data) == durable | {"W11", "M1"}
    for key, n, batch in [
        *((key, 200, 1 if key.startswith("W9") else 50) for key in sorted(durable)),
        ("W11", 200, 50),
    ]:
        entry = data[key]
        check_ratio(entry)
        assert entry["n"] == n and entry["batch"] == batch
        assert entry["per_message_us"] == pytest.approx(entry["median_ms"] * 1000 / n, rel=1e-2)
        assert entry["floor_per_message_us"] == pytest.approx(entry["floor_ms"] * 1000 / n, rel=1e-2)
        if key != "W11":
            assert "overhead_per_message_us" in entry
    assert data["W9"]["backend"] == data["W10"]["backend"] == data["W9-durable"]["backend"] == "jsonl"
    assert data["W9-sqlite"]["backend"] == data["W10-durable-sqlite"]["backend"] == "sqlite"
    m1 = data["M1"]
    assert m1["n"] == 200 and m1["floor_ms"] is None and m1["ratio"] is None
    assert m1["retained_bytes"] > 0 and m1["file_bytes"] > 0
    assert m1["ratio_to_file"] == pytest.approx(m1["retained_bytes"] / m1["file_bytes"], rel=1e-2)


def test_backend_option_selects_the_durable_backend() -> None:
    done = run("bench", "W9", "--n", "100", "--runs", "1", "--json", "--backend", "sqlite")
    assert done.returncode == 0, done.stderr.decode()
    assert set(orjson.loads(done.stdout)) == {"W9-sqlite", "W9-durable-sqlite"}
    done = run("bench", "W9-durable", "--n", "100", "--runs", "1", "--json")
    assert done.returncode == 0, done.stderr.decode()
    assert set(orjson.loads(done.stdout)) == {"W9-durable"}
    done = run("bench", "W10-sqlite", "--n", "100", "--runs", "1", "--json")
    assert done.returncode == 0, done.stderr.decode()
    assert set(orjson.loads(done.stdout)) == {"W10-sqlite"}
