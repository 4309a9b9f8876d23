"""The statements of a SQLite append (issue 26): the tail this instance's last write
left is remembered, so the next append reads no tail rows; a write by anyone else (or
rows changed behind the revision's back) makes it read the tail again, and the
storage-level stale-writer check still refuses a batch that does not continue the log."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.errors import SessionCorruptionError, SqliteSchemaError
from harness.faults import SqliteFaults
from harness.persistence import SqliteBackend
from tests.helpers import rec, user

H: dict[str, Any] = {"version": 0, "id": "s", "createdAt": 1, "cwd": "/w"}
TAIL = "SELECT seq, type, time, data, source_event_seqs, surface_op, ignorable FROM events WHERE session_id = ? ORDER BY seq DESC LIMIT 3"


def events(start: int, n: int) -> list[dict[str, Any]]:
    return [rec("user/message", i, user(f"m{i}"), surfaceOp="append") for i in range(start, start + n)]


def test_an_append_after_this_instances_write_reads_no_tail(tmp_path: Path) -> None:
    hook = SqliteFaults()
    b = SqliteBackend(tmp_path / "s.db", faults=hook)
    try:
        b.materialize(H, events(0, 1))
        mark = hook.count
        b.append("s", events(1, 2))
        b.append("s", events(3, 1))
        ran = hook.statements[mark:]
        assert TAIL not in ran
        # BEGIN, the ownership check, lease, the revision bump returning the session
        # row + tail seq, insert, COMMIT.
        assert len(ran) == 2 * 6
        assert [r["seq"] for r in b.load("s").records] == [0, 1, 2, 3]
    finally:
        b.close()


def test_another_writer_makes_the_next_append_read_the_tail(tmp_path: Path) -> None:
    hook = SqliteFaults()
    mine = SqliteBackend(tmp_path / "s.db", faults=hook)
    other = SqliteBackend(tmp_path / "s.db")
    try:
        mine.materialize(H, events(0, 1))
        other.append("s", events(1, 1))  # bumps the revision
        mark = hook.count
        with pytest.raises(SessionCorruptionError, match="append starts at seq 1, stored next seq is 2"):
            mine.append("s", events(1, 1))  # stale: refused at the storage level
        assert TAIL in hook.statements[mark:]
        mine.append("s", events(2, 1))
        assert [r["seq"] for r in mine.load("s").records] == [0, 1, 2]
    finally:
        mine.close()
        other.close()


def test_rows_removed_behind_the_revisions_back_are_noticed(tmp_path: Path) -> None:
    b = SqliteBackend(tmp_path / "s.db")
    try:
        b.materialize(H, events(0, 3))
        raw = sqlite3.connect(tmp_path / "s.db")
        with raw:
            raw.execute("DELETE FROM events WHERE seq = 2")  # no revision bump
        raw.close()
        with pytest.raises(SessionCorruptionError, match="append starts at seq 3, stored next seq is 2"):
            b.append("s", events(3, 1))  # a remembered tail would have left a gap
    finally:
        b.close()


MUTATION_CHECK = (
    "SELECT user_version, application_id, schema_version "
    "FROM pragma_user_version, pragma_application_id, pragma_schema_version"
)


def test_the_ownership_check_runs_again_once_another_connection_committed(tmp_path: Path) -> None:
    # Decision 0019: ``PRAGMA data_version`` (read in every write transaction) moves
    # when another connection commits; while it stands still the database cannot have
    # changed hands, and the reference's ownership check is not repeated.
    hook = SqliteFaults()
    mine = SqliteBackend(tmp_path / "s.db", faults=hook)
    try:
        mine.materialize(H, events(0, 1))
        assert MUTATION_CHECK in hook.statements
        mark = hook.count
        mine.append("s", events(1, 1))
        mine.append("s", events(2, 1))
        ran = hook.statements[mark:]
        assert MUTATION_CHECK not in ran and ran.count("PRAGMA data_version") == 2
        raw = sqlite3.connect(tmp_path / "s.db")
        with raw:
            raw.execute("PRAGMA user_version = 17")  # a commit that changes nothing we check
        raw.close()
        mark = hook.count
        mine.append("s", events(3, 1))
        mine.append("s", events(4, 1))
        assert hook.statements[mark:].count(MUTATION_CHECK) == 1  # once, then settled again
        assert [r["seq"] for r in mine.load("s").records] == [0, 1, 2, 3, 4]
    finally:
        mine.close()


def test_a_header_changed_by_another_process_is_refused_at_the_next_append(tmp_path: Path) -> None:
    b = SqliteBackend(tmp_path / "s.db")
    try:
        b.materialize(H, events(0, 1))
        b.append("s", events(1, 1))  # checked, and the check settled
        script = f"import sqlite3; c = sqlite3.connect({str(tmp_path / 's.db')!r}); c.execute('PRAGMA user_version = 16'); c.commit()"
        subprocess.run([sys.executable, "-c", script], check=True)
        with pytest.raises(SqliteSchemaError, match=r"schema changed before mutation \(expected 17, got 16\)"):
            b.append("s", events(2, 1))
        assert raw_rows(tmp_path / "s.db") == [0, 1]
    finally:
        b.close()


def raw_rows(path: Path) -> list[int]:
    db = sqlite3.connect(path)
    try:
        return [seq for (seq,) in db.execute("SELECT seq FROM events ORDER BY seq")]
    finally:
        db.close()
