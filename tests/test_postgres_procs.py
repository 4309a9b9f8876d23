"""Several processes, each its own lease holder ("host"), on one PostgreSQL store
(tests/pg_worker.py): one writer per session at any time, a SIGSTOPped holder fenced
off when it wakes, SIGKILLed holders lose nothing acknowledged. Needs tests/pg_cluster.py."""

from __future__ import annotations

import pytest

# psycopg is in the "test" extra; without it these tests skip instead of failing to import.
pytest.importorskip("psycopg", reason="psycopg not installed: PostgreSQL tests skipped")

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import IO, Any

from harness.errors import SessionLockedError
from harness.persistence import PostgresBackend
from tests.pg_cluster import pass_expiry

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def spawn(url: str, schema: str, host: str, ttl: float, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.pg_worker", url, schema, host, str(ttl), *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(stream: IO[str] | None) -> str:
    assert stream is not None
    line = stream.readline()
    assert line, "worker exited early"
    return line.strip()


def stopped(pid: int) -> None:
    """Return once ``pid`` is in the stopped state (SIGSTOP is delivered asynchronously)."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + 60  # bounds a broken run only
    while stat.read_text().rpartition(")")[2].split()[0] not in ("T", "t"):
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.001)


def check_logs(backend: PostgresBackend, acks: list[tuple[str, ...]]) -> dict[str, list[dict[str, Any]]]:
    """Every acknowledged batch is stored as acknowledged; along every log the fence
    never goes back and each fence belongs to one writer (one writer at a time)."""
    logs = {h["id"]: backend.load(h["id"]).records for h in backend.list_headers()}
    for host, sid, first, last, fence, b in acks:
        got = logs[sid][int(first) : int(last) + 1]
        assert [e["data"] for e in got] == [{"w": host, "f": int(fence), "b": int(b)}] * 3, (host, sid, first)
    for sid, records in logs.items():
        assert [e["seq"] for e in records] == list(range(len(records)))
        writers: dict[int, set[str]] = defaultdict(set)
        fences = [e["data"]["f"] for e in records]
        assert fences == sorted(fences), f"session {sid}: a fenced-off writer wrote after its successor"
        for e in records:
            writers[e["data"]["f"]].add(e["data"]["w"])
        assert all(len(w) == 1 for w in writers.values()), f"session {sid}: two writers under one fence"
    return logs


def test_competing_holders_and_a_sigkilled_one_lose_nothing_acknowledged(pg_url: str, pg_schema: str) -> None:
    sessions = "a,b,c"
    workers = {
        f"host-{i}": spawn(pg_url, pg_schema, f"host-{i}", 1.0, "compete", sessions, "12", "3", str(i)) for i in range(4)
    }
    acks: list[tuple[str, ...]] = []
    victim = workers["host-0"]
    seen = 0
    while seen < 3:  # kill host-0 while it writes: after its third acknowledged batch
        line = read_line(victim.stdout)
        if line.startswith("ACK"):
            acks.append(("host-0", *line.split()[1:]))
            seen += 1
    victim.send_signal(signal.SIGKILL)
    out, _err = victim.communicate(timeout=30)
    assert victim.returncode == -signal.SIGKILL
    acks += [("host-0", *ln.split()[1:]) for ln in out.splitlines() if ln.startswith("ACK")]
    for host, proc in workers.items():
        if proc is victim:
            continue
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.splitlines()[-1] == "DONE"
        acks += [(host, *ln.split()[1:]) for ln in out.splitlines() if ln.startswith("ACK")]
    backend = PostgresBackend(pg_url, schema=pg_schema)
    try:
        logs = check_logs(backend, acks)
        stored = {(e["data"]["w"], e["data"]["b"]) for r in logs.values() for e in r}
        unacknowledged = stored - {(a[0], int(a[5])) for a in acks}
        # Only the victim's last batch may have committed without its ACK printed.
        assert len(unacknowledged) <= 1 and all(w == "host-0" for w, _ in unacknowledged)
        assert {a[0] for a in acks} == set(workers)
    finally:
        backend.close()


def test_a_sigstopped_holder_is_fenced_off_when_it_wakes(pg_url: str, pg_schema: str) -> None:
    ttl = 60.0  # nothing expires by itself: the test passes the server's clock over it
    frozen = spawn(pg_url, pg_schema, "host-frozen", ttl, "step", "s")
    try:
        assert read_line(frozen.stdout).startswith("ACK s 0 2 1 ")
        os.kill(frozen.pid, signal.SIGSTOP)
        backend = PostgresBackend(pg_url, schema=pg_schema, host="host-new")
        try:
            stopped(frozen.pid)
            # Its keeper is stopped with it: the lease expires (the server's clock moves past
            # it). A renewal sent just before the stop may still land: then pass it again.
            for _ in range(3):
                pass_expiry(pg_url, pg_schema, "s")
                try:
                    lease = backend.acquire_writer({"id": "s"})
                    break
                except SessionLockedError:
                    continue
            else:
                raise AssertionError("the stopped holder's lease was renewed after it stopped")
            backend.append("s", [{"type": "test/mark", "seq": 3, "time": 3, "data": {"w": "host-new", "f": 2, "b": 0}}], lease=lease)
            os.kill(frozen.pid, signal.SIGCONT)
            assert frozen.stdin is not None
            frozen.stdin.write("go\n")
            frozen.stdin.flush()
            assert read_line(frozen.stdout) == "LOST s LEASE_LOST"  # it wakes, tries, is refused
            records = backend.load("s").records
            assert [e["data"]["w"] for e in records] == ["host-frozen"] * 3 + ["host-new"]
            lease.release()
        finally:
            backend.close()
        _out, err = frozen.communicate(timeout=30)  # closes its stdin: it finishes
        assert frozen.returncode == 0, err
    finally:
        if frozen.poll() is None:
            os.kill(frozen.pid, signal.SIGCONT)
            frozen.kill()
            frozen.communicate()


def test_a_holder_stopped_inside_its_transaction_is_cut_off_and_fenced(pg_url: str, pg_schema: str) -> None:
    """SIGSTOP between a batch's rows and its COMMIT: the server ends the idle
    transaction (the worker's ``idle_timeout`` is 1 s), the lease expires and is taken
    over; when the worker wakes its COMMIT fails (typed), and its next batch is fenced."""
    ttl = 60.0  # nothing expires by itself: the test passes the server's clock over it
    frozen = spawn(pg_url, pg_schema, "host-frozen", ttl, "stall", "s")

    def tell(line: str) -> None:
        assert frozen.stdin is not None
        frozen.stdin.write(line + "\n")
        frozen.stdin.flush()

    try:
        assert read_line(frozen.stdout).startswith("ACK s 0 2 1 ")
        tell("go")  # the second batch: it stops inside its transaction
        assert read_line(frozen.stdout) == "STALL"
        os.kill(frozen.pid, signal.SIGSTOP)
        backend = PostgresBackend(pg_url, schema=pg_schema, host="host-new")
        try:
            stopped(frozen.pid)
            # Waits on the row lock until the server ends the stopped transaction (its
            # idle_in_transaction_session_timeout, the behaviour under test), then the
            # lease's expiry passes: the takeover needs both.
            pass_expiry(pg_url, pg_schema, "s")
            lease = backend.acquire_writer({"id": "s"})
            mark = {"type": "test/mark", "seq": 3, "time": 3, "data": {"w": "host-new", "f": 2, "b": 0}}
            backend.append("s", [mark], lease=lease)
            os.kill(frozen.pid, signal.SIGCONT)
            tell("commit now")
            assert read_line(frozen.stdout) == "FAIL s STORAGE_IO"  # its transaction is gone
            tell("go")
            assert read_line(frozen.stdout) == "LOST s LEASE_LOST"  # and it is fenced off
            records = backend.load("s").records
            assert [e["data"]["w"] for e in records] == ["host-frozen"] * 3 + ["host-new"]
            lease.release()
        finally:
            backend.close()
        _out, err = frozen.communicate(timeout=30)
        assert frozen.returncode == 0, err
    finally:
        if frozen.poll() is None:
            os.kill(frozen.pid, signal.SIGCONT)
            frozen.kill()
            frozen.communicate()
