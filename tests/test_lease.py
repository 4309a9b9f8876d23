"""SQLite writer leases (issue #9 §2.5): holder identity, expiry, renewal, fencing."""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from harness.errors import (
    FlushError,
    LeaseLostError,
    SessionLockedError,
    SqliteSchemaError,
    StorageIOError,
)
from harness.faults import SqliteFaults
from harness.persistence import SqliteBackend, open_persistence
from harness.persistence._liveness import pid_scope
from harness.persistence._sqlite import lease_path, migrate_legacy_sqlite, process_start_time
from harness.runtime import open_store
from tests.helpers import rec, user

H: dict[str, Any] = {"version": 0, "id": "s", "createdAt": 1, "cwd": "/w"}


class LeaseClock:
    """The SQLite lease's wall clock, standing still until a test moves it: expiry is
    decided by this clock, not by how long a sleep took on a loaded machine."""

    def __init__(self) -> None:
        self.now_ms = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)


@pytest.fixture
def lease_clock(monkeypatch: pytest.MonkeyPatch) -> LeaseClock:
    import harness.persistence._sqlite_leases as sqlite_leases

    clock = LeaseClock()
    monkeypatch.setattr(sqlite_leases, "_now_ms", clock)
    return clock


def events(start: int, n: int) -> list[dict[str, Any]]:
    return [rec("user/message", i, user(f"m{i}"), surfaceOp="append") for i in range(start, start + n)]


def fake_lease(path: Path, **row: Any) -> None:
    """Write a lease row as some other holder would have left it (in the lease file
    beside the database: the reference's schema 17 admits no table of ours)."""
    values = {
        "session_id": "s",
        "fence": 7,
        "token": "feedfacefeedface",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "start_time": process_start_time(os.getpid()),
        "since": 0,
        "expires": int(time.time() * 1000) + 3_600_000,
        "pid_scope": pid_scope(),
        **row,
    }
    db = sqlite3.connect(lease_path(path))
    with db:
        db.execute(
            "INSERT OR REPLACE INTO leases (session_id, fence, token, host, pid, start_time, since, expires, pid_scope) "
            "VALUES (:session_id, :fence, :token, :host, :pid, :start_time, :since, :expires, :pid_scope)",
            values,
        )
    db.close()


def lease_row(path: Path) -> tuple[Any, ...]:
    db = sqlite3.connect(lease_path(path))
    row = db.execute("SELECT fence, token, host, pid, start_time FROM leases WHERE session_id = 's'").fetchone()
    db.close()
    return tuple(row)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "s.db"
    backend = SqliteBackend(path)
    backend.materialize(H, events(0, 1))
    backend.close()
    return path


def test_process_start_time() -> None:
    mine = process_start_time(os.getpid())
    assert mine is not None and mine == process_start_time(os.getpid())
    assert process_start_time(2**22 + 12345) is None  # no such process


def test_a_reused_pid_does_not_keep_a_dead_lease(db: Path) -> None:
    mine = process_start_time(os.getpid())
    assert mine is not None
    # Same host, a live pid (ours), but another start time: the holder died, its pid was reused.
    fake_lease(db, start_time=mine - 1000)
    backend = SqliteBackend(db)
    lease = backend.acquire_writer(H)
    assert lease_row(db)[:2] == (8, lease.token)  # type: ignore[attr-defined]  # taken over: fence 7 -> 8
    backend.append("s", events(1, 1), lease=lease)
    lease.release()


def test_a_dead_pid_on_this_host_is_taken_over(db: Path) -> None:
    fake_lease(db, pid=2**22 + 12345, start_time=None)
    SqliteBackend(db).acquire_writer(H).release()


def test_a_live_holder_on_this_host_is_respected(db: Path) -> None:
    # A real other process, with its real start time, and an unexpired lease.
    ppid = os.getppid()
    fake_lease(db, pid=ppid, start_time=process_start_time(ppid))
    with pytest.raises(SessionLockedError) as info:
        SqliteBackend(db).acquire_writer(H)
    assert f"process {ppid} on {socket.gethostname()}" in str(info.value)
    assert SqliteBackend(db).lock_held(H)


def test_a_foreign_host_lease_stands_until_it_expires(db: Path) -> None:
    fake_lease(db, host="elsewhere.example", pid=1, start_time=None)
    backend = SqliteBackend(db)
    with pytest.raises(SessionLockedError, match=r"process 1 on elsewhere\.example") as info:
        backend.acquire_writer(H)
    assert info.value.holder["host"] == "elsewhere.example"  # type: ignore[index]
    with pytest.raises(SessionLockedError, match="without its lease"):
        backend.append("s", events(1, 1))  # no lease: no write while someone holds one
    fake_lease(db, host="elsewhere.example", pid=1, start_time=None, expires=int(time.time() * 1000) - 1)
    assert not backend.lock_held(H)
    lease = backend.acquire_writer(H)  # expired: taken over
    assert lease_row(db)[0] == 8
    lease.release()


def test_fencing_refuses_a_writer_whose_lease_was_taken_over(
    tmp_path: Path, lease_clock: LeaseClock
) -> None:
    path = tmp_path / "s.db"
    first = SqliteBackend(path, lease_ttl=0.2)
    old = first.acquire_writer(H)
    first.materialize(H, events(0, 2), lease=old)
    first.close()  # stops its idle renewals, as a frozen process would
    lease_clock.advance(0.3)  # no write, no renewal: the lease expires (its holder is alive)
    second = SqliteBackend(path)
    new = second.acquire_writer(H)
    with pytest.raises(LeaseLostError) as info:
        first.append("s", events(2, 3), lease=old)  # it still thinks it holds the lease
    err = info.value
    assert err.code == "LEASE_LOST" and isinstance(err, SessionLockedError) and err.session_id == "s"
    assert "fence 1" in str(err) and "(fence 2)" in str(err) and "3 event(s) were not written" in str(err)
    with pytest.raises(LeaseLostError):
        old.renew()
    assert len(second.load("s").records) == 2  # none of its events landed
    second.append("s", events(2, 1), lease=new)
    old.release()  # releasing a lost lease leaves the new holder alone
    assert second.lock_held(H)
    second.append("s", events(3, 1), lease=new)
    new.release()
    assert not second.lock_held(H)


def test_every_write_renews_the_lease(tmp_path: Path, lease_clock: LeaseClock) -> None:
    path = tmp_path / "s.db"
    writer = SqliteBackend(path, lease_ttl=1.0)
    lease = writer.acquire_writer(H)
    writer.materialize(H, events(0, 1), lease=lease)
    writer.close()  # no idle renewals: only the writes below renew
    other = SqliteBackend(path)
    for i in range(1, 5):
        lease_clock.advance(0.4)
        writer.append("s", events(i, 1), lease=lease)  # renews
        with pytest.raises(SessionLockedError):
            other.acquire_writer(H)  # 1.6 s after the lease was taken, with a TTL of 1 s
    lease_clock.advance(0.4)
    lease.renew()  # an idle holder renews explicitly
    lease_clock.advance(0.4)
    with pytest.raises(SessionLockedError):
        other.acquire_writer(H)
    lease_clock.advance(0.7)
    other.acquire_writer(H).release()  # expired at last


async def test_a_live_writer_keeps_its_lease_while_idle(tmp_path: Path, lease_clock: LeaseClock) -> None:
    path = tmp_path / "s.db"
    backend = SqliteBackend(path, lease_ttl=60)  # no timed keeper round during the test
    renewed, renew = threading.Semaphore(0), backend._renew

    def counted(lease: Any) -> None:
        renew(lease)
        renewed.release()

    backend._renew = counted  # type: ignore[method-assign]

    def keeper_round() -> bool:
        # Wake the keeper until it has renewed once (a wake before it waits is lost).
        for _ in range(2400):  # bounds a broken run only
            with backend._keeper_wake:
                backend._keeper_wake.notify_all()
            if renewed.acquire(timeout=0.05):
                return True
        return False

    async with open_store() as store, open_persistence(store, backend):
        s = await store.create("s", cwd="/w")
        await s.append("feedback/record", 0)
        await s.flush()
        lease_clock.advance(50)  # idle, most of its TTL gone
        assert await trio.to_thread.run_sync(keeper_round)  # the backend renews
        lease_clock.advance(50)  # past the first TTL: only the renewal keeps it
        with pytest.raises(SessionLockedError):
            await trio.to_thread.run_sync(SqliteBackend(path).acquire_writer, H)
        await s.append("feedback/record", 1)
        await s.flush()
    assert len(SqliteBackend(path).load("s").records) == 2


async def test_a_live_writer_fenced_off_fails_its_flush_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with open_store() as store:
        with pytest.raises(Exception, match="closing failed"):
            async with open_persistence(store, SqliteBackend(path)):
                s = await store.create("s", cwd="/w")
                await s.append("feedback/record", 0)
                await s.flush()
                # Someone decided the lease was stale and took it over.
                fake_lease(path, fence=99, host="elsewhere.example", pid=1)
                await s.append("feedback/record", 1)
                with pytest.raises(FlushError) as info:
                    await s.flush()
                assert isinstance(info.value.__cause__, LeaseLostError)
    assert len(SqliteBackend(path).load("s").records) == 1


def test_a_v1_database_is_refused_unchanged_and_can_be_copied(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(
        """
        CREATE TABLE sessions (id TEXT PRIMARY KEY, header TEXT NOT NULL, incarnation TEXT NOT NULL,
                               revision INTEGER NOT NULL) STRICT;
        CREATE TABLE events (session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
                             seq INTEGER NOT NULL, type TEXT NOT NULL, record TEXT NOT NULL,
                             PRIMARY KEY (session_id, seq)) STRICT, WITHOUT ROWID;
        CREATE TABLE leases (session_id TEXT PRIMARY KEY, token TEXT NOT NULL, pid INTEGER NOT NULL,
                             host TEXT NOT NULL, since INTEGER NOT NULL) STRICT;
        PRAGMA application_id=1414024787;
        PRAGMA user_version=1;
        """
    )
    db.execute(
        "INSERT INTO sessions VALUES ('s', ?, 'inc', 0)",
        ('{"type":"session","version":0,"id":"s","createdAt":1,"delegationDepth":0}',),
    )
    db.execute(
        "INSERT INTO events VALUES ('s', 0, 'feedback/record', ?)",
        ('{"type":"feedback/record","seq":0,"time":1,"data":{}}',),
    )
    now = int(time.time() * 1000)
    db.execute("INSERT INTO leases VALUES ('s', 'old', 2147483000, ?, ?)", (socket.gethostname(), now))
    db.close()
    path.chmod(0o600)  # our own databases were owner-only
    before = path.read_bytes()
    with pytest.raises(SqliteSchemaError) as info:
        SqliteBackend(path).load("s")
    assert str(path) in str(info.value) and "schema version 1" in str(info.value)
    assert info.value.user_version == 1
    assert path.read_bytes() == before and not lease_path(path).exists()
    assert migrate_legacy_sqlite(path, tmp_path / "new.db") == 1
    assert path.read_bytes() == before
    backend = SqliteBackend(tmp_path / "new.db")
    assert [r["seq"] for r in backend.load("s").records] == [0]
    lease = backend.acquire_writer(H)  # leases are not copied
    assert lease_row(tmp_path / "new.db")[0] == 1
    lease.release()


def test_close_stops_the_lease_keeper_before_closing(tmp_path: Path) -> None:
    # Hand-offs by events, not sleeps: the keeper's renewal is held open while close()
    # runs, and the verdict is read only once that renewal has ended.
    entered, proceed, done = threading.Event(), threading.Event(), threading.Event()

    class Slow(SqliteBackend):
        def _renew(self, lease: Any) -> None:
            entered.set()
            try:
                assert proceed.wait(60)  # a renewal under way while close() runs
                super()._renew(lease)
            finally:
                done.set()

    backend = Slow(tmp_path / "s.db", lease_ttl=0.3)  # the keeper renews every 0.1 s
    backend.acquire_writer({"type": "session", "version": 0, "id": "s", "createdAt": 1})
    assert entered.wait(60)  # the keeper is inside _renew (bounds a broken run only)
    closer = threading.Thread(target=backend.close)
    closer.start()
    with backend._keeper_wake:  # close() has begun: it forgot the held leases
        assert backend._keeper_wake.wait_for(lambda: not backend._held, timeout=60)
    proceed.set()
    closer.join(60)
    assert not closer.is_alive()
    assert done.wait(60)  # the renewal has ended, whether close() waited for it or not
    assert backend._db is None  # nothing reopened the connection after close
    assert backend._keeper is None or not backend._keeper.is_alive()


V1_LEASES = """
CREATE TABLE leases (
  session_id TEXT PRIMARY KEY, fence INTEGER NOT NULL, token TEXT, host TEXT, pid INTEGER,
  start_time INTEGER, since INTEGER, expires INTEGER
) STRICT;
CREATE TABLE lease_store (singleton INTEGER PRIMARY KEY CHECK (singleton = 1), store_id TEXT NOT NULL) STRICT;
PRAGMA application_id = 1414024780;
PRAGMA user_version = 1;
"""


def v1_lease_file(db: Path) -> Path:
    """Replace the lease file of ``db`` by a version-1 one whose row names a holder of
    this host with a pid that is gone, unexpired for an hour."""
    side = lease_path(db)
    conn = sqlite3.connect(db)
    store_id = conn.execute("SELECT store_id FROM persistence_state").fetchone()[0]
    conn.close()
    side.unlink()
    raw = sqlite3.connect(side, isolation_level=None)
    raw.executescript(V1_LEASES)
    raw.execute("INSERT INTO lease_store VALUES (1, ?)", (store_id,))
    raw.execute(
        "INSERT INTO leases VALUES ('s', 7, 'old', ?, ?, NULL, 0, ?)",
        (socket.gethostname(), 2**22 + 12345, int(time.time() * 1000) + 3_600_000),
    )
    raw.close()
    side.chmod(0o600)
    return side


def test_a_version_1_lease_file_is_upgraded_and_its_holders_are_remote(db: Path) -> None:
    """A lease file from before the pid scope (issue 24): opened, it gains the column;
    its rows name no scope, so even a holder of this host whose pid is gone is waited
    out (the old rule took it over at once: its pid may be another namespace's)."""
    side = v1_lease_file(db)
    backend = SqliteBackend(db)
    assert backend.lock_held(H)  # read before any upgrade: no scope column yet
    with pytest.raises(SessionLockedError) as info:
        backend.acquire_writer(H)
    assert info.value.holder["pidScope"] is None  # type: ignore[index]
    check = sqlite3.connect(side)
    assert check.execute("PRAGMA user_version").fetchone()[0] == 2
    assert [r[1] for r in check.execute("PRAGMA table_info(leases)")][-1] == "pid_scope"
    check.close()
    fake_lease(db, expires=int(time.time() * 1000) - 1, pid_scope=None)  # expired at last
    lease = backend.acquire_writer(H)
    assert lease_row(db)[0] == 8
    lease.release()
    backend.close()


def test_a_newer_lease_file_is_refused(db: Path) -> None:
    raw = sqlite3.connect(lease_path(db))
    raw.execute("PRAGMA user_version = 3")
    raw.close()
    with pytest.raises(SqliteSchemaError, match="schema version 3, expected 1414024780 and 2"):
        SqliteBackend(db).acquire_writer(H)


def test_a_failure_at_any_statement_of_the_upgrade_leaves_a_consistent_lease_file(db: Path) -> None:
    """The upgrade runs in the opening transaction: a failure at any statement leaves
    the file at version 1 (or, past the commit, at 2), the old row intact and respected."""
    dry = SqliteFaults()
    v1_lease_file(db)
    with pytest.raises(SessionLockedError):
        SqliteBackend(db, faults=dry).acquire_writer(H)
    assert any("ADD COLUMN pid_scope" in sql for sql in dry.statements)
    for k in range(1, dry.count + 1):
        side = v1_lease_file(db)
        faulty = SqliteBackend(db, faults=SqliteFaults(fail_at=k))
        with pytest.raises((StorageIOError, SessionLockedError)):  # refused either way
            faulty.acquire_writer(H)
        faulty.close()
        raw = sqlite3.connect(side)
        version = raw.execute("PRAGMA user_version").fetchone()[0]
        columns = [r[1] for r in raw.execute("PRAGMA table_info(leases)")]
        assert raw.execute("SELECT fence, token FROM leases").fetchall() == [(7, "old")], k
        raw.close()
        assert (version, "pid_scope" in columns) in {(1, False), (2, True)}, k
        with pytest.raises(SessionLockedError):
            SqliteBackend(db).acquire_writer(H)
