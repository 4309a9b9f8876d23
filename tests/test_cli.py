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
        "forked assistant-branch from assistant at seq",
        "a stale handle is refused: SESSION_NOT_LIVE",
        "same log and surface as when it was live: yes",
        # The compaction act: pressure in the middle of turn 4, between its two steps.
        "---- step 1 of turn 4 ends ----",
        "* agent/pre-step of step 2 measures",
        "compaction/start     [ bracket",
        "opens (turn 4)",
        "compaction/summary   | summary of 7 surface messages (",
        "(the checkpoint: it takes their place on the surface)",
        # Issue 25: the /compact span starts at the earlier checkpoint (surface order).
        "(surface order: an earlier checkpoint first)",
        "refused and changes nothing: turn/start 9 while turn 2 is still open (INVARIANT_VIOLATED)",
        'turn/end           {"turn":2,"reason":{"kind":"interrupted"}}',
        "working directory /repo",
        "closes (turn 4)",
        "---- step 2 of turn 4 begins ----",
        "user: [checkpoint] - The user asked",
        "the model sees the checkpoint instead",
        # The overflow: recovered inside the open step, and retried there.
        "request 1 fails: ContextWindowExceededError (CONTEXT_WINDOW_EXCEEDED); the step stays open",
        "opens (turn 5)",
        "turn 5: completed; 2 requests, step/start count 1: retried in the same step",
        # /compact: a standalone bracket.
        "success: Compacted 2 history items (~",
        "opens (standalone, turn null)",
        "reloaded long-chat from",
    ):
        assert needle in out, needle
    # The bracket of turn 4 sits between step 1's end and step 2's start.
    act = out[out.index("timeline of turn 4") :]
    assert act.index("step 1 of turn 4 ends") < act.index("opens (turn 4)") < act.index("closes (turn 4)")
    assert act.index("closes (turn 4)") < act.index("step 2 of turn 4 begins")
    assert "same surface as when it was live: yes" in act
    # Issue 25: no Python reprs or encoded folder names in what a person reads.
    for internal in ("FrozenDict(", "InvariantError:", "shadowedRange {", "=None", "': True", "--repo--/assistant/session.jsonl  ("):
        assert internal not in out, internal
    assert "compaction" not in done.stderr.decode()  # no compaction warning was logged
    assert len(list(tmp_path.rglob("session.jsonl"))) == 5


def test_demo_refuses_a_root_that_holds_sessions_or_is_not_a_directory(tmp_path: Path) -> None:
    """A second demo on the same --root collided with its own sessions (a traceback of
    FlushError, exit 1), and a regular file as --root ended in a traceback too: each is
    now one typed line on stderr and the documented status, before anything is written."""
    root = tmp_path / "d"
    assert run("demo", "--root", str(root)).returncode == 0
    before = sorted(p.read_bytes() for p in root.rglob("session.jsonl"))
    again = run("demo", "--root", str(root))
    err = again.stderr.decode()
    assert again.returncode == 6, err
    assert err.count("\n") == 1 and err.startswith("harness demo: error: ") and err.rstrip().endswith("[SESSION_ALREADY_EXISTS]"), err
    assert again.stdout == b""
    assert sorted(p.read_bytes() for p in root.rglob("session.jsonl")) == before
    plain = tmp_path / "file"
    plain.write_bytes(b"x")
    for target in (plain, plain / "below"):
        done = run("demo", "--root", str(target))
        err = done.stderr.decode()
        assert done.returncode == 2, err
        assert err.count("\n") == 1 and "is not a directory" in err and err.rstrip().endswith("[NOT_A_DIRECTORY]"), err
    assert plain.read_bytes() == b"x"


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
    assert run("bench", "W99").returncode == 2


# -- issue 25: the command line on Click ------------------------------------------------------------


def test_version_help_completion_and_per_command_usage(tmp_path: Path) -> None:
    from importlib.metadata import version

    done = run("--version")
    assert done.returncode == 0 and done.stdout.decode().strip() == f"harness {version('trio-harness')}"
    env_root = tmp_path / "the-root"
    done = subprocess.run([sys.executable, "-m", "harness.cli", "--help"], capture_output=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO), "HARNESS_SESSIONS_ROOT": str(env_root), "COLUMNS": "200"})
    assert done.returncode == 0 and str(env_root) in done.stdout.decode()  # the store root in force
    # bench --help lists the workloads.
    text = run("bench", "--help").stdout.decode()
    for workload in ("W1", "W8", "W12", "W17", "W18", "M1"):
        assert f"\n    {workload} " in text, (workload, text)
    # A bad flag prints that command's usage, not the top level's (exit 2).
    for argv, usage in ((["bench", "--bogus"], "Usage: harness bench"), (["chaos", "--bogus"], "usage: harness chaos"),
                        (["sessions", "list", "--bogus"], "Usage: harness sessions list"), (["chat", "--bogus"], "Usage: harness chat")):
        done = run(*argv)
        assert done.returncode == 2 and usage in done.stderr.decode(), (argv, done.stderr)
    # Click's shell completion.
    done = subprocess.run([sys.executable, "-m", "harness.cli"], capture_output=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO), "_HARNESS_COMPLETE": "bash_source"})
    assert done.returncode == 0 and b"complete " in done.stdout and b"_HARNESS_COMPLETE" in done.stdout
