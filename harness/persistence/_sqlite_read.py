"""Reading the SQLite backend: the headers, a session's stored log (whole, or from a
seq on: a seek from the packed row that holds it), its revision.

All methods block: call them from a worker thread."""

from __future__ import annotations

import sqlite3
from typing import Any

from harness.errors import PersistedSessionNotFoundError
from harness.persistence._backend import StoredLog
from harness.persistence._sqlite_conn import SqliteConnection
from harness.persistence._sqlite_rows import (
    COLUMNS,
    MAX_MEMBERS,
    Row,
    covers,
    fetch_batches,
    scan_batches,
    scan_rows,
)
from harness.persistence._sqlite_session_row import _SESSION_COLUMNS, _header

_CHUNK_TAGS_SQL = "('text-chunks', 'reasoning-chunks', 'tool-call-chunks')"


class SqliteReads(SqliteConnection):
    """The reads of a :class:`~harness.persistence._sqlite.SqliteBackend`."""

    def _revision(self, incarnation: str, revision: int) -> str:
        return f"{self._identity}:incarnation:{incarnation}:revision:{revision}"

    def _session_row(self, db: sqlite3.Connection, sid: str) -> tuple[Any, ...] | None:
        row = self._exec(db, f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (sid,)).fetchone()
        return None if row is None else tuple(row)

    def list_headers(self) -> list[dict[str, Any]]:
        with self._txn(immediate=False) as db:
            rows = self._exec(db, f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY id").fetchall()
        return [_header(tuple(r)) for r in rows]

    def load(self, session_id: str) -> StoredLog:
        """The stored log: its header, its events (packed rows expanded), where a torn
        tail starts (the seq of its first row; ``None`` if none), its revision."""
        with self._txn(immediate=False) as db:
            row = self._session_row(db, session_id)
            if row is None:
                raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
            header = _header(row)
            revision = self._revision(row[9], row[10])
            cursor = self._exec(db, f"SELECT {COLUMNS} FROM events WHERE session_id = ? ORDER BY seq", (session_id,))
            records, torn = scan_batches(session_id, fetch_batches(cursor))
        return StoredLog(header, records, torn, revision)

    def load_from(self, session_id: str, from_seq: int) -> StoredLog:
        """The stored events with ``seq >= from_seq`` (reference ``loadStoredFrom``: a
        seek, reading from the packed row that holds ``from_seq``)."""
        with self._txn(immediate=False) as db:
            row = self._session_row(db, session_id)
            if row is None:
                raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
            rows, base = self._span_from(db, session_id, from_seq)
            revision = self._revision(row[9], row[10])
        header = _header(row)
        records, torn = scan_rows(session_id, rows, base)
        return StoredLog(header, [r for r in records if r["seq"] >= from_seq], torn, revision)

    def _span_from(self, db: sqlite3.Connection, sid: str, from_seq: int) -> tuple[list[Row], int]:
        """The rows from the one holding ``from_seq`` on, and that row's seq (a packed
        predecessor that covers it, or does not decode, moves the start back)."""
        predecessors = self._exec(
            db,
            f"SELECT {COLUMNS} FROM events WHERE session_id = ? AND seq >= ? AND seq < ? "
            f"AND type IN {_CHUNK_TAGS_SQL} AND ignorable = 0 ORDER BY seq",
            (sid, max(0, from_seq - MAX_MEMBERS + 1), from_seq),
        ).fetchall()
        base = from_seq
        for p in predecessors:
            if covers(sid, p, from_seq):
                base = min(base, p[0])
        rows = self._exec(
            db, f"SELECT {COLUMNS} FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq", (sid, base)
        ).fetchall()
        return rows, base

    def revision(self, session_id: str) -> str | None:
        with self._txn(immediate=False) as db:
            row = self._exec(
                db, "SELECT incarnation, revision FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            return None if row is None else self._revision(row[0], row[1])
