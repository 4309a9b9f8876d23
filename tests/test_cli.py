"""The `harness` command: the demo runs, and `bench --json` is machine-readable."""

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


def test_demo_tells_the_whole_story(tmp_path: Path) -> None:
    done = run("demo", "--root", str(tmp_path))
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    for needle in (
        "child killed with SIGKILL",
        "turn 2: interrupted",
        "TOOL_OUTCOME_UNKNOWN",
        "request header (resume)",
        "forked 'assistant-branch'",
        "a stale handle is refused: SESSION_NOT_LIVE",
        "same log and surface as when it was live: True",
    ):
        assert needle in out, needle
    assert len(list(tmp_path.rglob("session.jsonl"))) == 4


def test_bench_json_has_every_requested_variant() -> None:
    done = run("bench", "W1", "W2", "W3", "W4", "W5", "W6", "W7", "W12", "--n", "2000", "--runs", "1", "--json")
    assert done.returncode == 0, done.stderr.decode()
    data = orjson.loads(done.stdout)
    expected = {"W1", "W1-actor", "W1-actor-batch", "W2", "W2b", "W3", "W4", "W4-snapshot", "W4-disk", "W5-write", "W5-load", "W6", "W7", "W12"}
    assert set(data) == expected
    for key, value in data.items():
        assert {"median_ms", "floor_ms", "ratio"} <= set(value), key
        assert value["median_ms"] > 0
    assert "per_call_us" in data["W2"] and "bytes" in data["W5-load"]
    assert run("bench", "W9").returncode == 2
