"""A SQLite session database whose pages are damaged (decision 0016): opening it runs
SQLite's page check (``check="quick"`` by default) before anything is written and
refuses the file, typed (``STORAGE_CORRUPT``, the path, what the check found, how to
recover); nothing is acknowledged into it. A statement that reports corruption later
is translated to the same error and its write is not acknowledged.

The damage is the one ``test_fuzz_sqlite_bytes`` found: zero bytes over the start of
the cell-content area of the ``(session_id, seq)`` index's leaf page, located here
from the file itself (page number from ``dbstat``, content offset from the page
header), so the test does not depend on the layout of one build's file."""

from __future__ import annotations

import io
import shutil
import sqlite3
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import trio

from harness.errors import (
    HarnessError,
    PersistenceArgumentError,
    StorageCorruptionError,
    StorageIOError,
)
from harness.faults import SqliteFaults
from harness.persistence import SqliteBackend, open_persistence
from harness.persistence._backend import GroupWrite
from harness.persistence._sqlite import APPLICATION_ID, SCHEMA_VERSION
from harness.persistence._sqlite_conn import PAGE_CHECKS
from harness.runtime import open_store
from tests.helpers import rec, user

INDEX = "sqlite_autoindex_events_1"


def _header(sid: str) -> dict[str, Any]:
    return {"version": 0, "id": sid, "createdAt": 1, "cwd": "/w"}


def _events(start: int, n: int) -> list[dict[str, Any]]:
    return [rec("user/message", i, user(f"m{i}"), surfaceOp="append") for i in range(start, start + n)]


def _build(path: Path) -> None:
    """Two sessions of 30 events, then closed (the WAL checkpointed into the file)."""
    b = SqliteBackend(path)
    try:
        for sid in ("a", "b"):
            b.materialize(_header(sid), _events(0, 30))
    finally:
        b.close()
    assert not Path(f"{path}-wal").exists()


def _page_of(path: Path, name: str) -> tuple[int, int]:
    """(file offset of ``name``'s only page, page size)."""
    db = sqlite3.connect(path)
    try:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        [(page,)] = db.execute("SELECT pageno FROM dbstat WHERE name = ?", (name,)).fetchall()
    finally:
        db.close()
    return (page - 1) * size, size


def _damage_index(path: Path, at: int = 8) -> None:
    """Zero nine bytes ``at`` bytes into the events index leaf's cell-content area.
    At 8 (the default) SQLite 3.40 does not notice it when a new session's rows go in:
    without the page check that write is acknowledged and then does not read back
    ("database disk image is malformed"), the fuzz test's finding. At 0 it notices,
    and refuses the write."""
    base, _ = _page_of(path, INDEX)
    blob = bytearray(path.read_bytes())
    content = int.from_bytes(blob[base + 5 : base + 7], "big")
    blob[base + content + at : base + content + at + 9] = b"\x00" * 9
    path.write_bytes(bytes(blob))


def _independent_check(path: Path, pragma: str = "quick_check") -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [str(r[0]) for r in db.execute(f"PRAGMA {pragma}")]
    except sqlite3.DatabaseError as exc:
        return [str(exc)]
    finally:
        db.close()


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    path = tmp_path / "db.sqlite"
    _build(path)
    _damage_index(path)
    assert _independent_check(path) != ["ok"]  # the fixture's damage is real
    return path


def _codes(exc: BaseException) -> set[str]:
    """Every ``code`` in an exception, its groups and its causes."""
    out: set[str] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        code = getattr(e, "code", None)
        if isinstance(code, str):
            out.add(code)
        for nxt in (e.__cause__, e.__context__):
            if nxt is not None:
                todo.append(nxt)
    return out


def test_a_damaged_file_is_refused_when_opened_and_left_unchanged(damaged: Path) -> None:
    before = damaged.read_bytes()
    b = SqliteBackend(damaged)
    try:
        with pytest.raises(StorageCorruptionError) as info:
            b.list_headers()
        # Every later call is refused the same way (each connection attempt checks again).
        with pytest.raises(StorageCorruptionError):
            b.append("a", _events(30, 1))
    finally:
        b.close()
    exc = info.value
    assert exc.code == "STORAGE_CORRUPT"
    assert isinstance(exc, StorageIOError)  # an `except StorageIOError` still catches it
    assert exc.path == damaged
    assert exc.findings and "page" in exc.findings[0]
    message = str(exc)
    assert f'session database "{damaged}" is damaged (PRAGMA quick_check found: ' in message
    assert " ".join(exc.findings[0].split()) in message
    assert "before anything was written" in message
    assert "restore a backup" in message and ".dump" in message and "docs/persistence.md" in message
    assert damaged.read_bytes() == before  # nothing written, not even the schema check's txn


def test_nothing_is_acknowledged_into_a_damaged_file(damaged: Path) -> None:
    """The fuzz test's bystander: a new session's append and flush into the damaged file
    are not acknowledged, the failure is typed, and the file is unchanged."""
    before = damaged.read_bytes()
    acknowledged: bool | None = None
    codes: set[str] = set()

    async def main() -> None:
        nonlocal acknowledged
        async with open_store() as store, open_persistence(store, SqliteBackend(damaged), write_delay=0):
            s = await store.create("bystander", cwd="/w")
            await s.append("user/message", user("b1", "acknowledged?"), surface_op="append")
            try:
                acknowledged = await s.flush()
            except HarnessError as exc:
                acknowledged = False
                codes.update(_codes(exc))

    try:
        trio.run(main)
    except BaseException as exc:  # the close reports the write it could not make
        if not isinstance(exc, HarnessError | BaseExceptionGroup):
            raise
        codes.update(_codes(exc))
    assert acknowledged is False
    assert "STORAGE_CORRUPT" in codes
    assert damaged.read_bytes() == before
    # Read past the check: the bystander is not in the file.
    b = SqliteBackend(damaged, check="none")
    try:
        assert "bystander" not in {h["id"] for h in b.list_headers()}
    finally:
        b.close()


def test_the_page_check_runs_before_the_first_write_of_every_connection(tmp_path: Path) -> None:
    hook = SqliteFaults()
    b = SqliteBackend(tmp_path / "db.sqlite", faults=hook)
    try:
        b.materialize(_header("a"), _events(0, 2))  # a pristine file: the schema is written
        first = list(hook.statements)
        b._die()  # a dropped connection: the next one checks again
        b.append("a", _events(2, 1))
        again = hook.statements[len(first) :]
    finally:
        b.close()
    for ran in (first, again):
        check = ran.index("PRAGMA main.quick_check(10)")
        assert check < ran.index("BEGIN IMMEDIATE")  # before the schema (or any) write
        lease_check = ran.index("PRAGMA lease.quick_check(10)")
        assert ran.index(next(s for s in ran if s.startswith("ATTACH"))) < lease_check
        assert lease_check < ran.index("BEGIN IMMEDIATE", lease_check)


def test_check_none_opens_a_damaged_file(tmp_path: Path) -> None:
    """The opt-out: no page check. SQLite then notices this damage only when a write
    touches the damaged page, and that write is refused, typed (the translation of
    SQLITE_CORRUPT). (Other damage it does not notice at all: the default check.)"""
    damaged = tmp_path / "db.sqlite"
    _build(damaged)
    _damage_index(damaged, at=0)
    assert _independent_check(damaged) != ["ok"]
    b = SqliteBackend(damaged, check="none")
    try:
        assert {h["id"] for h in b.list_headers()} == {"a", "b"}
        with pytest.raises(StorageCorruptionError) as info:
            b.materialize(_header("c"), _events(0, 1))
    finally:
        b.close()
    exc = info.value
    assert exc.code == "STORAGE_CORRUPT"
    assert exc.path == damaged
    assert "database disk image is malformed" in exc.findings[0]
    assert "the transaction was rolled back, nothing of it acknowledged" in str(exc)
    b = SqliteBackend(damaged, check="none")
    try:
        assert {h["id"] for h in b.list_headers()} == {"a", "b"}  # c did not land
    finally:
        b.close()


def _misdirect_one_index_entry(path: Path) -> None:
    """Point one entry of the events index at the next table row: every page is still
    well formed (quick_check: ok), but a row is missing from the index."""
    base, _ = _page_of(path, INDEX)
    blob = bytearray(path.read_bytes())
    ncell = int.from_bytes(blob[base + 3 : base + 5], "big")
    pointers = [int.from_bytes(blob[base + 8 + 2 * i : base + 10 + 2 * i], "big") for i in range(ncell)]
    # Cell 5: payload size, header size 4, serial types (text "a", int8, int8), "a",
    # seq 5, rowid 6 (the last byte): make it rowid 7.
    cell = base + pointers[5]
    assert blob[cell : cell + 8] == bytes([7, 4, 0x0F, 1, 1, ord("a"), 5, 6])
    blob[cell + 7] = 7
    path.write_bytes(bytes(blob))


def test_check_integrity_also_compares_the_indexes_with_their_tables(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    _build(path)
    _misdirect_one_index_entry(path)
    assert _independent_check(path) == ["ok"]
    assert _independent_check(path, "integrity_check") != ["ok"]
    quick = SqliteBackend(path)  # the default does not see it
    try:
        assert {h["id"] for h in quick.list_headers()} == {"a", "b"}
    finally:
        quick.close()
    full = SqliteBackend(path, check="integrity")
    try:
        with pytest.raises(StorageCorruptionError) as info:
            full.list_headers()
    finally:
        full.close()
    assert "PRAGMA integrity_check found: row 6 missing from index sqlite_autoindex_events_1" in str(info.value)
    assert info.value.findings == ("row 6 missing from index sqlite_autoindex_events_1",)


def test_a_damaged_lease_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    _build(path)
    lease = Path(f"{path}-leases")
    base, _ = _page_of(lease, "leases")
    blob = bytearray(lease.read_bytes())
    blob[base + 3 : base + 5] = b"\x00\x09"  # nine cells claimed on an empty page
    lease.write_bytes(bytes(blob))
    before = path.read_bytes()
    b = SqliteBackend(path)
    try:
        with pytest.raises(StorageCorruptionError) as info:
            b.list_headers()
    finally:
        b.close()
    assert info.value.path == lease
    assert str(info.value).startswith(f'lease file "{lease}" is damaged (PRAGMA quick_check found: ')
    assert "delete it" in str(info.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize("bad", ["fast", "QUICK", "", None, 1, True, ("quick",)])
def test_check_must_be_one_of_the_modes(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(PersistenceArgumentError) as info:
        SqliteBackend(tmp_path / "db.sqlite", check=bad)
    assert info.value.code == "INVALID_ARGUMENT"
    assert str(info.value) == f"SQLite check must be one of quick, integrity, none, got {bad!r}"
    assert not (tmp_path / "db.sqlite").exists()


@pytest.mark.parametrize("mode", PAGE_CHECKS)
def test_every_mode_opens_a_sound_file(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "db.sqlite"
    _build(path)
    b = SqliteBackend(path, check=mode)  # type: ignore[arg-type]
    try:
        b.append("a", _events(30, 1))
        assert [r["seq"] for r in b.load("a").records] == list(range(31))
    finally:
        b.close()


class _CorruptAt:
    """A statement hook: the first statement starting with ``prefix`` (after ``armed``)
    fails as SQLite reports a damaged page."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.armed = False
        self.fired = 0

    def before(self, sql: str) -> None:
        if self.armed and sql.startswith(self.prefix) and not self.fired:
            self.fired += 1
            exc = sqlite3.DatabaseError("database disk image is malformed")
            exc.sqlite_errorcode = sqlite3.SQLITE_CORRUPT  # type: ignore[attr-defined]
            exc.sqlite_errorname = "SQLITE_CORRUPT"  # type: ignore[attr-defined]
            raise exc


@pytest.mark.parametrize("prefix", ["INSERT INTO events", "COMMIT", "BEGIN"])
def test_corruption_reported_by_an_append_is_typed_and_nothing_lands(tmp_path: Path, prefix: str) -> None:
    path = tmp_path / "db.sqlite"
    hook = _CorruptAt(prefix)
    b = SqliteBackend(path, faults=hook)
    try:
        b.materialize(_header("a"), _events(0, 2))
        hook.armed = True
        with pytest.raises(StorageCorruptionError) as info:
            b.append("a", _events(2, 1))
        assert hook.fired == 1
        assert [r["seq"] for r in b.load("a").records] == [0, 1]
    finally:
        b.close()
    assert info.value.code == "STORAGE_CORRUPT"
    assert info.value.path == path
    assert str(path) in str(info.value)


def test_corruption_reported_by_a_read_is_typed(tmp_path: Path) -> None:
    hook = _CorruptAt("SELECT seq")
    b = SqliteBackend(tmp_path / "db.sqlite", faults=hook)
    try:
        b.materialize(_header("a"), _events(0, 2))
        hook.armed = True
        with pytest.raises(StorageCorruptionError):
            b.load("a")
    finally:
        b.close()


def test_corruption_of_one_batch_of_a_group_is_typed_for_that_batch(tmp_path: Path) -> None:
    """In a group commit, a batch whose own statement reports corruption is refused
    alone (its savepoint rolled back), with the typed error naming its session."""
    hook = _CorruptAt("INSERT INTO events")
    b = SqliteBackend(tmp_path / "db.sqlite", faults=hook)
    try:
        b.materialize(_header("a"), _events(0, 1))
        b.materialize(_header("b"), _events(0, 1))
        hook.armed = True
        results = b.write_group(
            [
                GroupWrite("a", _header("a"), _events(1, 1), True, None),
                GroupWrite("b", _header("b"), _events(1, 1), True, None),
            ]
        )
        assert isinstance(results[0], StorageCorruptionError)
        assert results[0].session_id == "a"
        assert results[1] is None
        assert [r["seq"] for r in b.load("a").records] == [0]
        assert [r["seq"] for r in b.load("b").records] == [0, 1]
    finally:
        b.close()


def test_the_documented_salvage_recovers_this_damage(damaged: Path, tmp_path: Path) -> None:
    """The recipe the message points to (docs/persistence.md): the sqlite3 shell's
    ``.dump`` into a new file, then the schema's application id and version (``.dump``
    does not carry them); the new file opens and both sessions read back whole."""
    shell = shutil.which("sqlite3")
    if shell is None:
        pytest.skip("the sqlite3 shell is not installed")
    dump = subprocess.run([shell, str(damaged), ".dump"], check=True, capture_output=True).stdout
    new = tmp_path / "salvaged.sqlite"
    subprocess.run([shell, str(new)], input=dump, check=True, capture_output=True)
    pragmas = f"PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"
    subprocess.run([shell, str(new), pragmas], check=True, capture_output=True)
    new.chmod(0o600)
    b = SqliteBackend(new)
    try:
        for sid in ("a", "b"):
            assert [r["seq"] for r in b.load(sid).records] == list(range(30))
        b.append("a", _events(30, 1))
    finally:
        b.close()


def test_the_sessions_cli_reports_a_damaged_file_as_corrupt(damaged: Path) -> None:
    from harness.cli.sessions import EXIT_CORRUPT, run

    before = damaged.read_bytes()
    for command in (["list"], ["verify"]):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = run(["sessions", "--root", str(damaged), *command])
        assert code == EXIT_CORRUPT, (command, err.getvalue())
        assert "[STORAGE_CORRUPT]" in err.getvalue() and str(damaged) in err.getvalue()
    assert damaged.read_bytes() == before
