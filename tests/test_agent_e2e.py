"""End to end with processes: kill an agent mid-turn, resume it in a new process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_killed_mid_turn_then_resumed_in_a_new_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = [sys.executable, str(REPO / "tests" / "agent_child.py"), str(tmp_path)]
    with subprocess.Popen([*child, "first"], stdout=subprocess.PIPE, env=env) as first:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == b"hanging"
        first.send_signal(signal.SIGKILL)
        first.wait()
    resumed = subprocess.run([*child, "resume"], capture_output=True, env=env, timeout=60, check=True)
    out = orjson.loads(resumed.stdout.splitlines()[-1])
    log = out["log"]
    types = [r["type"] for r in log]
    ends = [r["data"]["reason"] for r in log if r["type"] == "turn/end"]
    assert ends == [{"kind": "completed"}, {"kind": "interrupted"}, {"kind": "completed"}]
    assert out["result"] == {"kind": "completed"}
    # Turn 2 was closed by repair: its recorded tool call got an outcome-unknown result.
    repair = next(r for r in log if r["type"] == "tool/result" and r["data"].get("error", {}).get("code") == "TOOL_OUTCOME_UNKNOWN")
    call = next(r for r in log if r["type"] == "tool/call" and r["data"]["name"] == "wait_forever")
    assert repair["sourceEventSeqs"] == [call["seq"]]
    assert "Do not retry blindly." in repair["data"]["message"]["content"][0]["content"][0]["text"]
    i = types.index("session/end-seed")
    assert types[i - 2 : i] == ["step/end", "turn/end"] and log[i - 1]["data"]["reason"] == {"kind": "interrupted"}
    resumed_header = [r["data"] for r in log if r["type"] == "request/header"]
    assert [h["reason"] for h in resumed_header] == ["initial", "resume"]
    assert [r["data"]["turn"] for r in log if r["type"] == "turn/start"] == [1, 2, 3]
