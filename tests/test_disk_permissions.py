"""On-disk permissions (issue 16; reference persistence-resume §1.4 and §3).

What the runtime creates is owner-only: directories 0700, files 0600, whatever the
umask. The SQLite backend also refuses, as the reference's path checks do, a database
directory that is a symbolic link, not the user's or group/world-writable, and a
database (this port adds: its lease file and journal sidecars) that is a symbolic link,
not a regular file, not the user's or open to group/world; it never follows or repairs
such a path. Every check here is on real files (``os.stat``/``os.lstat``).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.errors import PersistenceArgumentError, StorageIOError, UnsafeStoragePathError
from harness.persistence import JsonlBackend, SqliteBackend
from harness.persistence._sqlite_schema import lease_path
from tests.helpers import rec, user

H: dict[str, Any] = {"version": 0, "id": "s", "createdAt": 1, "cwd": "/w"}
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
NOBODY = 65534


def events(start: int, n: int) -> list[dict[str, Any]]:
    return [rec("user/message", i, user(f"m{i}"), surfaceOp="append") for i in range(start, start + n)]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: only the runtime's own modes can make files private."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def make_db(path: Path) -> Path:
    backend = SqliteBackend(path)
    backend.materialize(H, events(0, 2))
    backend.close()
    return path


def assert_refused(exc: pytest.ExceptionInfo[UnsafeStoragePathError], path: Path, message: str) -> None:
    assert exc.value.code == "STORAGE_PATH_UNSAFE"
    assert isinstance(exc.value, StorageIOError)
    assert exc.value.path == path
    assert str(exc.value) == message


# -- what the runtime creates ---------------------------------------------------------------------


@pytest.mark.usefixtures("open_umask")
def test_sqlite_creates_owner_only_directories_and_files(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "sessions.db"
    backend = SqliteBackend(path)
    # The reference's service init creates the directories, not the database.
    assert mode(tmp_path / "a") == 0o700 and mode(tmp_path / "a" / "b") == 0o700
    assert not path.exists()
    backend.materialize(H, events(0, 3))
    lease = backend.acquire_writer(H)
    backend.append("s", events(3, 2), lease=lease)
    created = [path, lease_path(path), Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{lease_path(path)}-wal")]
    for p in created:
        assert stat.S_ISREG(os.lstat(p).st_mode), p
        assert mode(p) == 0o600, (p, oct(mode(p)))
        assert os.lstat(p).st_uid == os.getuid()
    lease.release()
    backend.close()
    assert sorted(p.name for p in path.parent.iterdir()) == ["sessions.db", "sessions.db-leases"]
    assert mode(path) == 0o600 and mode(lease_path(path)) == 0o600


@pytest.mark.usefixtures("open_umask")
def test_sqlite_rollback_journal_mode_keeps_the_journal_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "d" / "sessions.db"
    backend = SqliteBackend(path, journal_mode="delete")
    backend.materialize(H, events(0, 1))
    db = backend._conn()
    assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert db.execute("PRAGMA lease.journal_mode").fetchone() == ("delete",)
    # A write transaction in progress has its rollback journal: owner-only as well.
    db.execute("BEGIN IMMEDIATE")
    db.execute("UPDATE sessions SET revision = revision")
    db.execute("DELETE FROM events WHERE seq > 1000")  # forces a page into the journal
    db.execute("INSERT INTO events VALUES ('s', 5000, 'x', 0, '{}', NULL, NULL, NULL)")
    journal = Path(f"{path}-journal")
    assert journal.exists() and mode(journal) == 0o600
    db.execute("ROLLBACK")
    backend.close()
    assert not Path(f"{path}-wal").exists()
    assert mode(path) == 0o600 and mode(path.parent) == 0o700


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.usefixtures("open_umask")
def test_jsonl_creates_owner_only_directories_and_files(tmp_path: Path, compression: str) -> None:
    if compression == "zstd":
        pytest.importorskip("zstandard")
    root = tmp_path / "x" / "root"
    backend = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
    backend.materialize(H, events(0, 3))
    lease = backend.acquire_writer(H)
    backend.append("s", events(3, 2), lease=lease)
    lease.release()
    backend.materialize({**H, "id": "t", "cwd": None}, events(0, 1))
    seen = 0
    for dirpath, dirnames, filenames in os.walk(tmp_path / "x"):
        for d in dirnames:
            assert mode(Path(dirpath) / d) == 0o700, (dirpath, d)
            seen += 1
        for f in filenames:
            assert mode(Path(dirpath) / f) == 0o600, (dirpath, f)
            seen += 1
    assert seen >= 8  # x, root, .root.lock, 2 project dirs, 2 session dirs, transcripts, lock file
    assert backend.locate("s") is not None and mode(backend.locate("s")) == 0o600  # type: ignore[arg-type]


# -- symbolic links -------------------------------------------------------------------------------


def test_a_symlinked_database_is_refused_not_followed(tmp_path: Path) -> None:
    real = make_db(tmp_path / "real" / "sessions.db")
    before = real.read_bytes()
    link_dir = tmp_path / "links"
    link_dir.mkdir(mode=0o700)
    link = link_dir / "sessions.db"
    link.symlink_to(real)
    with pytest.raises(UnsafeStoragePathError) as info:
        SqliteBackend(link)
    assert_refused(info, link, f'session database "{link}" must be a regular file, not a symbolic link')
    assert real.read_bytes() == before
    assert sorted(p.name for p in link_dir.iterdir()) == ["sessions.db"]  # no lease file, no WAL
    # A dangling link is not created through either.
    dangling = link_dir / "new.db"
    dangling.symlink_to(tmp_path / "nowhere.db")
    with pytest.raises(UnsafeStoragePathError, match="must be a regular file, not a symbolic link"):
        SqliteBackend(dangling)
    assert not (tmp_path / "nowhere.db").exists()


def test_a_symlinked_database_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(UnsafeStoragePathError) as info:
        SqliteBackend(link / "sessions.db")
    assert_refused(info, link, f'session database parent "{link}" must be a real directory')
    assert list(real.iterdir()) == []


def test_a_database_that_becomes_a_symlink_is_refused_at_open(tmp_path: Path) -> None:
    """The checks run again when the connection opens (lazily, and after a close)."""
    path = make_db(tmp_path / "d" / "sessions.db")
    backend = SqliteBackend(path)
    moved = tmp_path / "moved.db"
    path.rename(moved)
    path.symlink_to(moved)
    with pytest.raises(UnsafeStoragePathError, match="must be a regular file, not a symbolic link"):
        backend.load("s")


@pytest.mark.parametrize("companion", ["-leases", "-wal", "-shm", "-journal", "-leases-wal"])
def test_a_symlinked_lease_file_or_journal_sidecar_is_refused(tmp_path: Path, companion: str) -> None:
    path = make_db(tmp_path / "d" / "sessions.db")
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    target.chmod(0o600)
    side = Path(f"{path}{companion}")
    side.unlink(missing_ok=True)
    side.symlink_to(target)
    what = "lease file" if companion == "-leases" else "session database journal"
    with pytest.raises(UnsafeStoragePathError) as info:
        SqliteBackend(path)
    assert_refused(info, side, f'{what} "{side}" must be a regular file, not a symbolic link')
    assert target.read_bytes() == b""


# -- not a directory, not a file ------------------------------------------------------------------


def test_a_parent_that_is_a_file_and_a_database_that_is_a_directory_are_refused(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    with pytest.raises(UnsafeStoragePathError, match=f'session database parent "{afile}" must be a real directory'):
        SqliteBackend(afile / "sessions.db")
    adir = tmp_path / "adir.db"
    adir.mkdir(mode=0o700)
    with pytest.raises(UnsafeStoragePathError, match=f'session database "{adir}" must be a regular file'):
        SqliteBackend(adir)


# -- permissions and ownership ----------------------------------------------------------------------


@pytest.mark.parametrize("bits", [0o640, 0o604, 0o660, 0o606, 0o644])
def test_a_group_or_world_accessible_database_is_refused_unchanged(tmp_path: Path, bits: int) -> None:
    path = make_db(tmp_path / "d" / "sessions.db")
    path.chmod(bits)
    before = path.read_bytes()
    with pytest.raises(UnsafeStoragePathError) as info:
        SqliteBackend(path)
    assert_refused(
        info, path, f'session database "{path}" must be owned by the current user and accessible only by that user'
    )
    # Refused as the reference does: not repaired (no chmod), not opened.
    assert mode(path) == bits and path.read_bytes() == before
    path.chmod(0o600)
    assert [r["seq"] for r in SqliteBackend(path).load("s").records] == [0, 1]


def test_a_database_opened_up_after_construction_is_refused_at_open(tmp_path: Path) -> None:
    path = make_db(tmp_path / "d" / "sessions.db")
    backend = SqliteBackend(path)
    path.chmod(0o644)
    with pytest.raises(UnsafeStoragePathError, match="accessible only by that user"):
        backend.list_headers()


@pytest.mark.parametrize("companion", ["-leases", "-wal"])
def test_a_group_readable_lease_file_or_sidecar_is_refused(tmp_path: Path, companion: str) -> None:
    path = make_db(tmp_path / "d" / "sessions.db")
    side = Path(f"{path}{companion}")
    side.touch(mode=0o600, exist_ok=True)
    side.chmod(0o640)
    with pytest.raises(UnsafeStoragePathError, match=f'"{side}" must be owned by the current user and accessible only'):
        SqliteBackend(path)


@pytest.mark.parametrize("bits", [0o770, 0o707, 0o777, 0o1777])
def test_a_group_or_world_writable_directory_is_refused(tmp_path: Path, bits: int) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(bits)
    with pytest.raises(UnsafeStoragePathError) as info:
        SqliteBackend(d / "sessions.db")
    assert_refused(
        info, d, f'session database parent "{d}" must be owned by the current user and not group/world-writable'
    )
    assert list(d.iterdir()) == []


def test_a_readable_but_not_writable_directory_is_accepted(tmp_path: Path) -> None:
    """The reference's directory rule is 'not group/world-writable' (0o022), not 0700."""
    d = tmp_path / "public"
    d.mkdir()
    d.chmod(0o755)
    backend = SqliteBackend(d / "sessions.db")
    backend.materialize(H, events(0, 1))
    backend.close()
    assert mode(d / "sessions.db") == 0o600 and mode(d) == 0o755  # an existing directory is left as it is


@pytest.mark.skipif(not IS_ROOT, reason="changing a file's owner needs root")
def test_a_database_or_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    path = make_db(tmp_path / "d" / "sessions.db")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(UnsafeStoragePathError, match="must be owned by the current user and accessible only"):
        SqliteBackend(path)
    os.chown(path, os.getuid(), os.getgid())
    os.chown(path.parent, NOBODY, NOBODY)
    with pytest.raises(UnsafeStoragePathError, match="must be owned by the current user and not group/world-writable"):
        SqliteBackend(path)


def test_the_cli_reports_an_unsafe_database_with_its_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import main

    path = make_db(tmp_path / "d" / "sessions.db")
    path.chmod(0o644)
    with pytest.raises(SystemExit) as exit_:
        main(["sessions", "--root", str(path), "list", "--json"])
    assert exit_.value.code == 7  # EXIT_STORAGE
    out = capsys.readouterr().out
    assert '"STORAGE_PATH_UNSAFE"' in out and "accessible only by that user" in out


# -- connection settings: journal, durability --------------------------------------------------------


def test_connection_settings_are_the_references_and_read_back(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "s.db")
    backend.materialize(H, events(0, 1))
    db = backend._conn()
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.execute("PRAGMA lease.journal_mode").fetchone() == ("wal",)
    assert db.execute("PRAGMA synchronous").fetchone() == (2,)
    assert db.execute("PRAGMA lease.synchronous").fetchone() == (2,)
    assert db.execute("PRAGMA trusted_schema").fetchone() == (0,)
    assert db.execute("PRAGMA mmap_size").fetchone() == (0,)
    assert db.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert db.execute("PRAGMA busy_timeout").fetchone() == (5000,)
    backend.close()


def test_journal_mode_and_busy_timeout_are_validated(tmp_path: Path) -> None:
    with pytest.raises(PersistenceArgumentError, match="journal_mode must be one of wal, delete, truncate, persist"):
        SqliteBackend(tmp_path / "s.db", journal_mode="memory")  # type: ignore[arg-type]
    for bad in (-1, 2**31, 1.5, True):
        with pytest.raises(PersistenceArgumentError, match="busy_timeout_ms must be an integer"):
            SqliteBackend(tmp_path / "s.db", busy_timeout_ms=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize("journal", ["truncate", "persist"])
def test_every_reference_journal_mode_opens(tmp_path: Path, journal: str) -> None:
    backend = SqliteBackend(tmp_path / "s.db", journal_mode=journal)  # type: ignore[arg-type]
    backend.materialize(H, events(0, 2))
    assert backend._conn().execute("PRAGMA journal_mode").fetchone() == (journal,)
    backend.close()
    assert [r["seq"] for r in SqliteBackend(tmp_path / "s.db").load("s").records] == [0, 1]


def _hold_reader(path: Path, seconds: float, ready: threading.Event) -> None:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("BEGIN")
    db.execute("SELECT count(*) FROM events").fetchone()
    ready.set()
    time.sleep(seconds)
    db.execute("COMMIT")
    db.close()


def test_a_busy_journal_mode_change_is_retried_until_the_busy_timeout(tmp_path: Path) -> None:
    path = make_db(tmp_path / "d" / "sessions.db")  # in WAL mode
    ready = threading.Event()
    reader = threading.Thread(target=_hold_reader, args=(path, 0.3, ready))
    reader.start()
    ready.wait()
    try:
        # Leaving WAL needs the database to itself: busy while the reader is there.
        t0 = time.monotonic()
        backend = SqliteBackend(path, journal_mode="delete", busy_timeout_ms=5000)
        assert [r["seq"] for r in backend.load("s").records] == [0, 1]
        assert time.monotonic() - t0 >= 0.2
        assert backend._conn().execute("PRAGMA journal_mode").fetchone() == ("delete",)
        backend.close()
    finally:
        reader.join()
    ready.clear()
    back = SqliteBackend(path)  # to WAL again, then a reader that outlasts the timeout
    back.list_headers()
    back.close()
    reader = threading.Thread(target=_hold_reader, args=(path, 1.0, ready))
    reader.start()
    ready.wait()
    try:
        with pytest.raises(StorageIOError, match="locked"):
            SqliteBackend(path, journal_mode="delete", busy_timeout_ms=100).list_headers()
    finally:
        reader.join()
