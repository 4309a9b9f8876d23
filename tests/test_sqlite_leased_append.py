"""A SQLite append under a lease (the writer's case, issue 26): the lease check rides
on the revision bump's statement, so a batch is five statements; the check still
refuses a lost lease (nothing lands, no revision bump), renews a lease that is due,
and a group with a lost lease or a failed COMMIT rolls back what it must."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from harness.errors import LeaseLostError, StorageIOError
from harness.faults import SqliteFaults
from harness.persistence import SqliteBackend
from harness.persistence._backend import GroupWrite
from tests.helpers import rec, user


def header(sid: str) -> dict[str, Any]:
    return {"version": 0, "id": sid, "createdAt": 1, "cwd": "/w"}


def events(start: int, n: int) -> list[dict[str, Any]]:
    return [rec("user/message", i, user(f"m{i}"), surfaceOp="append") for i in range(start, start + n)]


def leases_db(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(str(path) + "-leases", isolation_level=None)


def revision(path: Path, sid: str) -> int:
    raw = sqlite3.connect(path)
    try:
        return int(raw.execute("SELECT revision FROM sessions WHERE id = ?", (sid,)).fetchone()[0])
    finally:
        raw.close()


def test_a_leased_append_is_five_statements(tmp_path: Path) -> None:
    hook = SqliteFaults()
    b = SqliteBackend(tmp_path / "s.db", faults=hook, lease_ttl=3600)
    try:
        lease = b.acquire_writer(header("s"))
        b.materialize(header("s"), events(0, 1), lease=lease)
        mark = hook.count
        b.append("s", events(1, 2), lease=lease)
        b.append("s", events(3, 1), lease=lease)
        ran = hook.statements[mark:]
        # BEGIN, the ownership check, the revision bump returning the session row, the
        # tail seq and the lease row's fence/token/expiry, the insert, COMMIT: no
        # lease statement of its own (the lease is far from due: no renewal either).
        assert len(ran) == 2 * 5, ran
        assert not any(s.startswith("SELECT fence") for s in ran)
        assert [r["seq"] for r in b.load("s").records] == [0, 1, 2, 3]
    finally:
        b.close()


@pytest.mark.parametrize("change", ["fence = fence + 1, token = 'other'", "token = NULL"])
def test_a_lost_lease_refuses_the_append_and_bumps_nothing(tmp_path: Path, change: str) -> None:
    path = tmp_path / "s.db"
    b = SqliteBackend(path, lease_ttl=3600)
    try:
        lease = b.acquire_writer(header("s"))
        b.materialize(header("s"), events(0, 1), lease=lease)
        b.append("s", events(1, 1), lease=lease)
        before = revision(path, "s")
        raw = leases_db(path)
        raw.execute(f"UPDATE leases SET {change} WHERE session_id = 's'")  # taken over / released
        raw.close()
        with pytest.raises(LeaseLostError, match="2 event\\(s\\) were not written"):
            b.append("s", events(2, 2), lease=lease)
        assert revision(path, "s") == before
        assert [r["seq"] for r in b.load("s").records] == [0, 1]
    finally:
        b.close()


def test_a_lease_that_is_due_is_renewed_by_the_append(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    b = SqliteBackend(path, lease_ttl=3600)
    try:
        lease = b.acquire_writer(header("s"))
        b.materialize(header("s"), events(0, 1), lease=lease)
        raw = leases_db(path)
        soon = int(time.time() * 1000) + 60_000  # a minute of 3600 s left: due
        raw.execute("UPDATE leases SET expires = ? WHERE session_id = 's'", (soon,))
        b.append("s", events(1, 1), lease=lease)
        expires = raw.execute("SELECT expires FROM leases WHERE session_id = 's'").fetchone()[0]
        raw.close()
        assert expires > soon + 3_000_000  # pushed to about now + TTL
    finally:
        b.close()


def test_a_group_refuses_the_lost_lease_alone(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    b = SqliteBackend(path, lease_ttl=3600)
    try:
        la, lb = b.acquire_writer(header("a")), b.acquire_writer(header("b"))
        b.materialize(header("a"), events(0, 1), lease=la)
        b.materialize(header("b"), events(0, 1), lease=lb)
        rev_a = revision(path, "a")
        raw = leases_db(path)
        raw.execute("UPDATE leases SET fence = fence + 1, token = 'other' WHERE session_id = 'a'")
        raw.close()
        results = b.write_group(
            [
                GroupWrite("a", header("a"), events(1, 1), True, la),
                GroupWrite("b", header("b"), events(1, 1), True, lb),
            ]
        )
        assert isinstance(results[0], LeaseLostError) and results[1] is None
        assert revision(path, "a") == rev_a
        assert [r["seq"] for r in b.load("a").records] == [0]
        assert [r["seq"] for r in b.load("b").records] == [0, 1]
    finally:
        b.close()


def test_a_failed_group_commit_lands_nothing_and_the_next_append_continues(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    hook = SqliteFaults()
    b = SqliteBackend(path, faults=hook, lease_ttl=3600)
    try:
        la, lb = b.acquire_writer(header("a")), b.acquire_writer(header("b"))
        b.materialize(header("a"), events(0, 1), lease=la)
        b.materialize(header("b"), events(0, 1), lease=lb)
        revs = revision(path, "a"), revision(path, "b")
        # BEGIN, ownership, then per batch SAVEPOINT, bump, insert, RELEASE; COMMIT.
        hook.fail_at = hook.count + 2 + 2 * 4 + 1
        results = b.write_group(
            [
                GroupWrite("a", header("a"), events(1, 1), True, la),
                GroupWrite("b", header("b"), events(1, 2), True, lb),
            ]
        )
        assert hook.injected and hook.injected[-1][1] == "COMMIT"
        assert all(isinstance(r, StorageIOError) for r in results)
        assert (revision(path, "a"), revision(path, "b")) == revs
        # The tails the failed transaction would have left are not remembered: the
        # same batches go through again, at the same seqs.
        assert b.write_group(
            [
                GroupWrite("a", header("a"), events(1, 1), True, la),
                GroupWrite("b", header("b"), events(1, 2), True, lb),
            ]
        ) == [None, None]
        assert [r["seq"] for r in b.load("a").records] == [0, 1]
        assert [r["seq"] for r in b.load("b").records] == [0, 1, 2]
    finally:
        b.close()
