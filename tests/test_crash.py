"""Crash test with real processes: SIGKILL at random moments, then load and resume."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.errors import PersistedSessionNotFoundError
from harness.persistence import JsonlBackend, build_session
from harness.session import closers_for_records, event_to_record

REPO = Path(__file__).resolve().parent.parent
KILLS = int(os.environ.get("CRASH_KILLS", "25"))  # more: CRASH_KILLS=N (the chaos campaign kills too)

pytestmark = pytest.mark.slow


def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    rng = random.Random(1234)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    backend = JsonlBackend(tmp_path)
    acknowledged: list[dict[str, object]] = []  # records whose flush returned, as loaded
    repaired_rounds = 0
    for round_no in range(KILLS):
        with subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "crash_child.py"), str(tmp_path)],
            stdout=subprocess.PIPE,
            env=env,
        ) as child:
            assert child.stdout is not None
            ready = child.stdout.readline().split()
            assert ready[0] == b"ready", ready
            time.sleep(rng.uniform(0.0, 0.08))
            child.send_signal(signal.SIGKILL)
            child.wait()
            durable = 0
            for line in child.stdout.read().splitlines():
                if line.startswith(b"durable "):
                    durable = int(line.split()[1])
        try:
            stored = backend.load("crashy")
        except PersistedSessionNotFoundError:
            assert durable == 0 and not acknowledged  # killed before the first write
            continue
        records = stored.records
        # Every event whose flush had returned is present, unchanged.
        assert len(records) >= durable, (round_no, len(records), durable)
        assert records[: len(acknowledged)] == acknowledged, round_no
        # The log is a valid prefix: it restores (with repair closers if a turn was open).
        closers = [event_to_record(e) for e in closers_for_records(records)]
        session = build_session("crashy", stored.header, records + closers)
        if closers:
            repaired_rounds += 1
            assert closers[-1]["type"] == "turn/end"
            assert closers[-1]["data"]["reason"] == {"kind": "interrupted"}  # type: ignore[index]
        turn_starts = sum(1 for e in session.events if e.type == "turn/start")
        turn_ends = sum(1 for e in session.events if e.type == "turn/end")
        assert turn_starts == turn_ends
        acknowledged = records[:durable] if durable else acknowledged
    print(f"{KILLS} kills, {repaired_rounds} needed repair closers")
    assert repaired_rounds > 0  # the kills did land mid-turn
