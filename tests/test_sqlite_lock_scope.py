"""Every write transaction of the SQLite backend holds the write locks of BOTH files,
the database and its lease file, from its ``BEGIN IMMEDIATE`` on (docs/persistence.md):
the lease check and the write are one critical section, and a transaction that writes
the lease file after reading it never has to upgrade a read lock, which SQLite refuses
at once with ``database is locked`` (no busy wait) when another connection holds it.

``sqlite3`` caches prepared statements by their text, and a ``BEGIN IMMEDIATE``
compiled before the lease file was attached locks the database alone: the opening
transaction once left such a statement in the cache for every later transaction of the
connection, and 8 processes appending to one file saw ``database is locked``
(tests/test_many_processes.py, issue 26's W13). The probe here is deterministic: at
every write statement, a second connection tries to take each file's write lock
without waiting."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from harness.persistence import SqliteBackend
from harness.persistence._sqlite_schema import lease_path
from tests.helpers import rec, user


def _header(sid: str) -> dict[str, Any]:
    return {"version": 0, "id": sid, "createdAt": 1, "cwd": "/w"}


def _events(start: int, n: int) -> list[dict[str, Any]]:
    return [rec("user/message", i, user(f"m{i}"), surfaceOp="append") for i in range(start, start + n)]


def _write_lock_free(path: Path) -> bool:
    """Whether another connection could take ``path``'s write lock right now."""
    db = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        assert exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY, exc
        return False
    else:
        db.execute("ROLLBACK")
        return True
    finally:
        db.close()


class _Probe:
    """A statement hook: before each write statement, which files are still free."""

    def __init__(self, path: Path) -> None:
        self.files = {"database": path, "lease file": lease_path(path)}
        self.armed = False
        self.free: list[tuple[str, list[str]]] = []
        self.probed = 0

    def before(self, sql: str) -> None:
        if not self.armed or not sql.startswith(("INSERT", "UPDATE", "DELETE")):
            return
        self.probed += 1
        free = [name for name, p in self.files.items() if _write_lock_free(p)]
        if free:
            self.free.append((sql[:60], free))


def _run(b: SqliteBackend, probe: _Probe) -> None:
    b.materialize(_header("other"), _events(0, 1))  # a pristine file's schema, unprobed
    probe.armed = True
    b.materialize(_header("a"), _events(0, 2))
    lease = b.acquire_writer(_header("a"))
    b.append("a", _events(2, 3), lease=lease)
    lease.renew()
    lease.release()
    b.append("other", _events(1, 1))


def test_every_write_statement_runs_with_both_files_write_locked(tmp_path: Path) -> None:
    probe = _Probe(tmp_path / "db.sqlite")
    b = SqliteBackend(tmp_path / "db.sqlite", faults=probe)
    try:
        _run(b, probe)
    finally:
        b.close()
    assert probe.probed >= 6
    assert probe.free == []


def test_a_reopened_connection_locks_both_files_too(tmp_path: Path) -> None:
    # The statement cache is per connection: a dropped connection's successor goes
    # through the opening again (with its own transaction before the ATTACH).
    probe = _Probe(tmp_path / "db.sqlite")
    b = SqliteBackend(tmp_path / "db.sqlite", faults=probe)
    try:
        b.materialize(_header("first"), _events(0, 1))
        b._die()
        _run(b, probe)
    finally:
        b.close()
    assert probe.probed >= 6
    assert probe.free == []

