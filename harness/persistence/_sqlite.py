"""The SQLite backend (stdlib ``sqlite3``), behind the same protocol as JSONL (reference §3).

WAL journal, ``synchronous=FULL``, one ``BEGIN IMMEDIATE`` transaction per batch (so a
batch lands whole or not at all, and there are no torn tails), and a storage-level
stale-writer check: a batch must start at the stored next seq. One live writer per
session: a lease row naming the holder (process id, host, token); a lease whose holder
process is gone from this host is taken over. All methods block: call them from a
worker thread.
"""

from __future__ import annotations

import os
import secrets
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import orjson

from harness.errors import (
    PersistedSessionNotFoundError,
    SessionCorruptionError,
    SessionLockedError,
    SessionLogExistsError,
    StorageIOError,
)
from harness.persistence._backend import StoredLog, WriterLease, check_header_record, header_record

APPLICATION_ID: Final = 0x54484E53  # "THNS"
SCHEMA_VERSION: Final = 1

_SCHEMA = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    header TEXT NOT NULL,
    incarnation TEXT NOT NULL,
    revision INTEGER NOT NULL
) STRICT;
CREATE TABLE events (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) STRICT, WITHOUT ROWID;
CREATE TABLE leases (
    session_id TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    since INTEGER NOT NULL
) STRICT;
"""


class SqliteBackend:
    name = "sqlite"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).resolve()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    # -- connection ------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("BEGIN IMMEDIATE")
        try:
            app_id = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if app_id == 0 and version == 0 and tables == 0:
                # executescript() would COMMIT first: create table by table instead.
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(statement)
                db.execute(f"PRAGMA application_id={APPLICATION_ID}")
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif app_id != APPLICATION_ID or version != SCHEMA_VERSION:
                raise StorageIOError(
                    f"session database {self.path} has application id {app_id:#x} and schema version "
                    f"{version}, incompatible with this build ({APPLICATION_ID:#x}, {SCHEMA_VERSION})"
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            db.close()
            raise
        self._db = db
        return db

    @contextmanager
    def _txn(self, immediate: bool = True) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                db = self._conn()
                db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            except sqlite3.Error as exc:
                raise StorageIOError(f"session database {self.path}: {exc}") from exc
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            else:
                try:
                    db.execute("COMMIT")
                except sqlite3.Error as exc:
                    db.execute("ROLLBACK")
                    raise StorageIOError(f"session database {self.path}: commit failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- reading ---------------------------------------------------------------------------

    def list_headers(self) -> list[dict[str, Any]]:
        with self._txn(immediate=False) as db:
            rows = db.execute("SELECT header FROM sessions ORDER BY id").fetchall()
        return [check_header_record(orjson.loads(h), None) for (h,) in rows]

    def load(self, session_id: str) -> StoredLog:
        with self._txn(immediate=False) as db:
            row = db.execute(
                "SELECT header, incarnation, revision FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if row is None:
                raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
            lines = db.execute(
                "SELECT seq, record FROM events WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
        header = check_header_record(orjson.loads(row[0]), session_id)
        loads = orjson.loads
        records = []
        for i, (seq, record) in enumerate(lines):
            if seq != i:
                raise SessionCorruptionError(
                    f"corrupt session log: invalid committed physical row at seq {seq}", session_id=session_id
                )
            records.append(loads(record))
        return StoredLog(header, records, None, f"sqlite:{row[1]}:{row[2]}")

    def revision(self, session_id: str) -> str | None:
        with self._txn(immediate=False) as db:
            row = db.execute("SELECT incarnation, revision FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return None if row is None else f"sqlite:{row[0]}:{row[1]}"

    # -- writing ---------------------------------------------------------------------------

    def materialize(self, header: dict[str, Any], records: list[dict[str, Any]]) -> None:
        sid = header["id"]
        with self._txn() as db:
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
                raise SessionLogExistsError(
                    f'refusing to materialize "{sid}": a log already exists on disk (load/resume it instead)',
                    session_id=sid,
                )
            db.execute(
                "INSERT INTO sessions (id, header, incarnation, revision) VALUES (?, ?, ?, 0)",
                (sid, orjson.dumps(header_record(header)).decode(), str(uuid.uuid4())),
            )
            self._insert(db, sid, records, 0)

    def _insert(self, db: sqlite3.Connection, sid: str, records: list[dict[str, Any]], next_seq: int) -> None:
        if records and records[0]["seq"] != next_seq:
            raise SessionCorruptionError(
                f"session {sid} append starts at seq {records[0]['seq']}, stored next seq is {next_seq}",
                session_id=sid,
            )
        dumps = orjson.dumps
        db.executemany(
            "INSERT INTO events (session_id, seq, type, record) VALUES (?, ?, ?, ?)",
            [(sid, r["seq"], r["type"], dumps(r).decode()) for r in records],
        )
        db.execute("UPDATE sessions SET revision = revision + 1 WHERE id = ?", (sid,))

    def _next_seq(self, db: sqlite3.Connection, sid: str) -> int:
        if not db.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
            raise PersistedSessionNotFoundError(f'session "{sid}" not found', session_id=sid)
        (n,) = db.execute("SELECT coalesce(max(seq) + 1, 0) FROM events WHERE session_id = ?", (sid,)).fetchone()
        return int(n)

    def append(self, session_id: str, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        with self._txn() as db:
            self._insert(db, session_id, records, self._next_seq(db, session_id))

    def commit_repair(self, session_id: str, truncate_to: int | None, records: list[dict[str, Any]]) -> None:
        # Transactions leave no torn tails: there is never anything to truncate.
        self.append(session_id, records)

    def delete(self, session_id: str) -> None:
        with self._txn() as db:
            if not db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount:
                raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)

    # -- one writer per session ----------------------------------------------------------

    def acquire_writer(self, header: dict[str, Any]) -> WriterLease:
        sid = header["id"]
        token = secrets.token_hex(8)
        me, host = os.getpid(), socket.gethostname()
        with self._txn() as db:
            row = db.execute("SELECT token, pid, host, since FROM leases WHERE session_id = ?", (sid,)).fetchone()
            if row is not None and _holder_alive(row[0], row[1], row[2]):
                holder = {"pid": row[1], "host": row[2], "since": row[3]}
                raise SessionLockedError(
                    f'session "{sid}" is already open for writing by process {row[1]} on {row[2]}',
                    session_id=sid,
                    holder=holder,
                )
            db.execute(
                "INSERT OR REPLACE INTO leases (session_id, token, pid, host, since) VALUES (?, ?, ?, ?, ?)",
                (sid, token, me, host, int(time.time() * 1000)),
            )
        _LIVE_TOKENS.add(token)
        return _LeaseRow(self, sid, token)

    def _release(self, sid: str, token: str) -> None:
        _LIVE_TOKENS.discard(token)
        with self._txn() as db:
            db.execute("DELETE FROM leases WHERE session_id = ? AND token = ?", (sid, token))


_LIVE_TOKENS: set[str] = set()


def _holder_alive(token: str, pid: int, host: str) -> bool:
    if host != socket.gethostname():
        return True  # cannot tell: another host's lease stands
    if pid == os.getpid():
        return token in _LIVE_TOKENS  # a lease object of this process, unless released
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _LeaseRow(WriterLease):
    def __init__(self, backend: SqliteBackend, sid: str, token: str) -> None:
        self._backend: SqliteBackend | None = backend
        self._sid = sid
        self._token = token

    def release(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            backend._release(self._sid, self._token)
