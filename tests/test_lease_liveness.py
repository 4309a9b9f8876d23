"""Lease liveness across pid namespaces, with real processes (issue 24 §1), on SQLite
and PostgreSQL: a holder alive in another pid namespace of this host (same host name,
as a container or a pod would be) is never judged dead, and a holder stopped past its
lease (SIGSTOP) is taken over only once its lease has expired, then fenced off when it
wakes: its write is refused with ``LEASE_LOST`` and lands nothing.

The holders are tests/lease_holder.py, in ``unshare --pid --fork --mount-proc`` for a
pid namespace of their own. No verdict depends on timing: expiry is observed in the
lease row, never assumed after a sleep."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from harness.errors import SessionLockedError
from harness.persistence import SqliteBackend
from harness.persistence._liveness import pid_scope, process_start_time, read_pid_scope
from harness.persistence._sqlite import lease_path
from tests.helpers import rec, user

ROOT = Path(__file__).resolve().parent.parent
H: dict[str, Any] = {"version": 0, "id": "s", "createdAt": 1, "cwd": "/w"}
GUARD = 60.0  # seconds: a hang guard for polls, never a verdict

pytestmark = pytest.mark.slow


def _unshare_missing() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare(1) not installed"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        return f"unshare --pid --fork --mount-proc is not permitted here: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def unshare() -> None:
    why = _unshare_missing()
    if why is not None:
        pytest.skip(f"{why}: pid-namespace tests skipped")


class Store:
    """One backend kind under test: how to open it, how a holder process is told to
    reach it, and the lease row's expiry and the clock it is judged by (``expiry()``
    and ``now()`` compare with each other), read without a lease."""

    def __init__(
        self, kind: str, target: list[str], make: Callable[..., Any], expiry: Callable[[], Any], now: Callable[[], Any]
    ) -> None:
        self.kind = kind
        self.target = target
        self.make = make
        self.expiry = expiry
        self.now = now


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: list[Any] = []

    def track(backend: Any) -> Any:
        opened.append(backend)
        return backend

    if request.param == "sqlite":
        path = tmp_path / "s.db"

        def expiry_sqlite() -> Any:
            db = sqlite3.connect(f"{lease_path(path).as_uri()}?mode=ro", uri=True)
            try:
                return db.execute("SELECT expires FROM leases WHERE session_id = 's'").fetchone()[0]
            finally:
                db.close()

        s = Store(
            "sqlite",
            [str(path)],
            lambda **kw: track(SqliteBackend(path, **kw)),
            expiry_sqlite,
            lambda: int(time.time() * 1000),  # the backend's lease clock
        )
    else:
        pytest.importorskip("psycopg", reason="psycopg not installed: PostgreSQL tests skipped")
        import psycopg

        from harness.persistence import PostgresBackend

        url: str = request.getfixturevalue("pg_url")
        schema: str = request.getfixturevalue("pg_schema")

        def one(sql: str) -> Any:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(sql).fetchone()
            assert row is not None
            return row[0]

        s = Store(
            "postgres",
            [url, schema],
            lambda **kw: track(PostgresBackend(url, schema=schema, **kw)),
            lambda: one(f"SELECT expires FROM {schema}.leases WHERE session_id = 's'"),
            lambda: one("SELECT clock_timestamp()"),  # the server's clock: the leases' clock
        )
    first = s.make()
    first.materialize(H, [rec("user/message", 0, user("m0"), surfaceOp="append")])
    first.close()
    try:
        yield s
    finally:
        for backend in opened:
            backend.close()


class Holder:
    """A tests/lease_holder.py process (its own session and process group, so the
    ``unshare`` wrapper and the holder inside stop and wake together)."""

    def __init__(self, store: Store, ttl: float, *, namespace: bool, fork: bool = False, proc: bool = True) -> None:
        cmd = [sys.executable, "-m", "tests.lease_holder", store.kind, *store.target, str(ttl), "s"]
        if fork:
            cmd.append("fork")
        if namespace:
            cmd = ["unshare", "--pid", "--fork", *(["--mount-proc"] if proc else []), *cmd]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def line(self) -> str:
        stream: IO[str] | None = self.proc.stdout
        assert stream is not None
        got = stream.readline()
        if not got:
            _out, err = self.proc.communicate(timeout=GUARD)
            raise AssertionError(f"the holder exited early ({self.proc.returncode}): {err}")
        return got.strip()

    def tell(self, line: str = "go") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def signal(self, sig: signal.Signals) -> None:
        os.killpg(self.proc.pid, sig)

    def finish(self) -> str:
        out, err = self.proc.communicate(timeout=GUARD)  # closes stdin: it releases and ends
        assert self.proc.returncode == 0, err
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.proc.communicate(timeout=GUARD)


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    try:
        yield started
    finally:
        for h in started:
            h.kill()


def stored_writers(store: Store) -> list[str]:
    """Who wrote each stored event (``seed``: the session's first event)."""
    backend = store.make()
    try:
        return [e["data"].get("w", "seed") for e in backend.load("s").records]
    finally:
        backend.close()


def test_a_holder_in_another_pid_namespace_is_never_judged_dead(
    unshare: None, store: Store, holders: list[Holder]
) -> None:
    """The holder's pid in its namespace (1) names another process here, or none: the
    old rule (host + pid + start time) found it "dead" and took its live lease at once."""
    holder = Holder(store, 3600.0, namespace=True)
    holders.append(holder)
    assert holder.line().startswith("HELD 1 ")
    outer = store.make(lease_ttl=3600.0)
    with pytest.raises(SessionLockedError, match=f"on {socket.gethostname()}") as info:
        outer.acquire_writer(H)
    scope = info.value.holder["pidScope"]  # type: ignore[index]
    assert scope is not None and scope != pid_scope()  # same host name, another pid namespace
    assert outer.lock_held(H)
    with pytest.raises(SessionLockedError, match="without its lease"):
        outer.append("s", [rec("user/message", 1, user("x"), surfaceOp="append")])
    holder.tell()
    assert holder.line() == "ACK 1"  # still its lease: its write lands
    assert holder.finish().splitlines()[-1] == "DONE"  # released at its end
    assert not outer.lock_held(H)
    outer.acquire_writer(H).release()
    assert stored_writers(store) == ["seed", "holder"]


def test_a_killed_holder_of_another_pid_namespace_is_waited_out(
    unshare: None, store: Store, holders: list[Holder]
) -> None:
    """Its death cannot be proved from here (its pids are not ours): its lease stands
    until it expires, as a remote holder's does."""
    holder = Holder(store, 3600.0, namespace=True)
    holders.append(holder)
    assert holder.line().startswith("HELD 1 ")
    holder.kill()
    outer = store.make(lease_ttl=3600.0)
    assert outer.lock_held(H)
    with pytest.raises(SessionLockedError):
        outer.acquire_writer(H)


@pytest.mark.parametrize("namespace", [False, True], ids=["same-namespace", "own-namespace"])
def test_a_holder_stopped_past_its_lease_is_taken_over_at_expiry_and_fenced_off(
    unshare: None, store: Store, holders: list[Holder], namespace: bool
) -> None:
    """SIGSTOP stops the holder's keeper with it: its lease expires (observed in the
    row), and only then is it taken over. Woken (SIGCONT), its next write gets
    ``LEASE_LOST`` and nothing of it lands."""
    ttl = 1.0
    holder = Holder(store, ttl, namespace=namespace)
    holders.append(holder)
    assert holder.line().startswith("HELD 1 ")
    holder.tell()
    assert holder.line() == "ACK 1"
    outer = store.make(lease_ttl=3600.0)
    holder.signal(signal.SIGSTOP)
    if store.kind == "sqlite":
        # Stopped inside a keeper renewal it would hold the files' write locks: wake it
        # and stop it again until it holds none (its transactions are milliseconds).
        deadline = time.monotonic() + GUARD
        while not _sqlite_unlocked(Path(store.target[0])):
            assert time.monotonic() < deadline
            holder.signal(signal.SIGCONT)
            time.sleep(0.01)
            holder.signal(signal.SIGSTOP)
    deadline = time.monotonic() + GUARD
    while True:
        expires, before = store.expiry(), store.now()
        try:
            lease = outer.acquire_writer(H)
        except SessionLockedError:
            # Refused: it must have been unexpired when tried (a stopped holder is alive).
            assert before < expires, "an expired lease of a stopped holder was not taken over"
            assert time.monotonic() < deadline, "the stopped holder's lease never expired"
            time.sleep(0.05)
            continue
        # Taken over: only once its expiry had passed (a stopped holder is alive).
        assert store.now() >= expires, "a stopped holder's unexpired lease was taken over"
        break
    assert lease.fence == 2
    outer.append("s", [{"type": "test/mark", "seq": 2, "time": 2, "data": {"w": "outer"}}], lease=lease)
    holder.signal(signal.SIGCONT)
    holder.tell()
    assert holder.line() == "LOST LEASE_LOST"  # fenced off: refused, nothing written
    assert stored_writers(store) == ["seed", "holder", "outer"]
    lease.release()
    assert holder.finish().splitlines()[-1] == "DONE"
    assert stored_writers(store) == ["seed", "holder", "outer"]


def _sqlite_unlocked(path: Path) -> bool:
    """Nobody holds the write lock of the database or of its lease file."""
    for p in (path, lease_path(path)):
        db = sqlite3.connect(p, timeout=0)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
        except sqlite3.OperationalError:
            return False
        finally:
            db.close()
    return True


def test_a_forked_holder_is_judged_by_its_own_start_time(store: Store, holders: list[Holder]) -> None:
    """A child forked after its parent took a lease recorded the parent's start time
    with its own pid: alive, it was judged "a reused pid", dead, and taken over."""
    holder = Holder(store, 3600.0, namespace=False, fork=True)
    holders.append(holder)
    held = holder.line().split()
    assert held[:2] == ["HELD", "2"]
    outer = store.make(lease_ttl=3600.0)
    with pytest.raises(SessionLockedError) as info:
        outer.acquire_writer(H)
    pid = int(held[2])
    assert info.value.holder["pid"] == pid  # type: ignore[index]
    assert info.value.holder["startTime"] == process_start_time(pid)  # type: ignore[index]
    assert holder.finish().splitlines()[-1] == "DONE"
    outer.acquire_writer(H).release()


def test_a_holder_whose_proc_is_another_namespaces_is_remote(
    unshare: None, store: Store, holders: list[Holder]
) -> None:
    """In a pid namespace of its own but with the host's ``/proc`` (no
    ``--mount-proc``), a holder's own pid names another process in ``/proc``: it
    cannot establish its scope, records none, and is respected as remote."""
    holder = Holder(store, 3600.0, namespace=True, proc=False)
    holders.append(holder)
    assert holder.line().startswith("HELD 1 ")
    outer = store.make(lease_ttl=3600.0)
    with pytest.raises(SessionLockedError) as info:
        outer.acquire_writer(H)
    assert info.value.holder["pidScope"] is None  # type: ignore[index]
    holder.kill()
    assert outer.lock_held(H)  # dead, but not provably: waited out


def test_the_pid_scope_names_boot_and_namespaces(unshare: None) -> None:
    mine = read_pid_scope()
    assert mine is not None and mine == pid_scope()
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        assert mine.startswith(f"boot:{f.read().strip()}/pid:")
    code = "from harness.persistence._liveness import read_pid_scope; print(read_pid_scope())"

    def scope_of(*wrap: str) -> str:
        out = subprocess.run([*wrap, sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        return out.stdout.strip()

    assert scope_of() == mine  # another process of this namespace: the same scope
    other = scope_of("unshare", "--pid", "--fork", "--mount-proc")
    assert other != mine and other.split("/pid:")[0] == mine.split("/pid:")[0]  # same boot, another namespace
    assert scope_of("unshare", "--pid", "--fork") == "None"  # /proc of the parent namespace: unknown


def test_a_jsonl_holder_in_another_pid_namespace_keeps_its_flock(unshare: None, tmp_path: Path, holders: list[Holder]) -> None:
    """The JSONL backend infers no liveness: its ``flock`` belongs to the kernel, which
    sees one lock across pid namespaces and drops it only with its holder."""
    from harness.persistence import JsonlBackend

    root = tmp_path / "root"
    JsonlBackend(root).materialize(H, [rec("user/message", 0, user("m0"), surfaceOp="append")])
    store = Store("jsonl", [str(root)], lambda **kw: JsonlBackend(root), lambda: None, lambda: None)
    holder = Holder(store, 0.0, namespace=True)
    holders.append(holder)
    assert holder.line().startswith("HELD ")
    outer = JsonlBackend(root)
    with pytest.raises(SessionLockedError, match="process 1 on"):
        outer.acquire_writer(H)
    assert outer.lock_held(H)
    holder.kill()  # the kernel drops the lock with its holder: no expiry to wait for
    assert not outer.lock_held(H)
    outer.acquire_writer(H).release()
