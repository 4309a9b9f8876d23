"""The SQLite backend (stdlib ``sqlite3``), behind the same protocol as JSONL.

The database is the reference's schema 17 (reference §3; see
:mod:`harness.persistence._sqlite_schema` and :mod:`harness.persistence._sqlite_rows`):
a database written by either implementation opens in the other. Identity checks
(application id, ``user_version``, schema objects, store id) run in the opening
``BEGIN IMMEDIATE`` before any statement that writes, and again inside every write
transaction; a foreign file is refused (:class:`SqliteSchemaError`) unchanged.

The reference's path checks run at construction and before every connection (an
unsafe directory, database, lease file or journal sidecar raises
:class:`~harness.errors.UnsafeStoragePathError`; see ``_sqlite_schema``). A WAL journal
by default (``journal_mode``: the reference's four modes), ``synchronous=FULL`` read
back, one ``BEGIN IMMEDIATE`` transaction per batch (a batch lands whole or not at all;
its rows bound while they are inserted, the common ones with five parameters: see
:func:`~harness.persistence._sqlite_rows.bind_segments`), chunk runs packed per batch,
and a storage-level
stale-writer check: a batch must start at the stored next seq. Reading applies the
reference's torn-tail rule to physical rows; a repair (delete the torn rows, append
the closers) is one transaction.

One live writer per session (this port's addition): a *lease* row per session naming
its holder (host, pid, the pid's start time, its pid scope, a random token), with an expiry
(``lease_ttl``) and a *fence*: an integer that grows with every acquisition. The lease
rows live in a separate file, ``<db>-leases`` (the reference refuses any schema object
of its own database that it did not create), attached to the connection: a
``BEGIN IMMEDIATE`` locks both files, so the lease check and the write are one critical
section. A lease is renewed by a write through it when less than two thirds of its TTL
remain, by :meth:`WriterLease.renew`,
and, while its holder is idle, every ``lease_ttl / 3`` seconds by a daemon thread of
the backend (wall-clock time, independent of Trio; it runs only while the backend has
leases out). Every write checks, in its own transaction, that the caller's lease is
still the current one (token and fence) and renews it; a writer whose lease was taken
over gets :class:`LeaseLostError` and nothing of its batch lands. A lease can be taken
over when it expired, or when its holder is provably dead: same host *and* same pid
scope (boot id, pid and time namespaces: :mod:`harness.persistence._liveness`) and its
pid is gone, or the pid now belongs to a process with another start time (a reused
pid). A live lease of any other holder (another host, another container or pod on
this host, a row without a scope) is respected until it expires. A reference process
writing the same database ignores the leases; the stale-writer check still holds.

All methods block: call them from a worker thread. ``sqlite3`` errors never escape:
they become :class:`StorageIOError` (the original chained as the cause).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import orjson

from harness.errors import (
    SessionCorruptionError,
    SqliteSchemaError,
    StorageIOError,
)
from harness.persistence._backend import check_header_record
from harness.persistence._liveness import process_start_time
from harness.persistence._sqlite_conn import (
    DEFAULT_BUSY_TIMEOUT_MS,
    DEFAULT_LEASE_TTL,
    JOURNAL_MODES,
    PAGE_CHECKS,
)
from harness.persistence._sqlite_read import SqliteReads
from harness.persistence._sqlite_schema import (
    APPLICATION_ID,
    LEGACY_APPLICATION_ID,
    LEGACY_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    check_file_header,
    lease_path,
)
from harness.persistence._sqlite_write import SqliteWrites
from harness.session import decode_storage_record

__all__ = [
    "APPLICATION_ID",
    "DEFAULT_BUSY_TIMEOUT_MS",
    "DEFAULT_LEASE_TTL",
    "JOURNAL_MODES",
    "PAGE_CHECKS",
    "SCHEMA_VERSION",
    "SqliteBackend",
    "SqliteSchemaError",
    "lease_path",
    "migrate_legacy_sqlite",
    "process_start_time",
]


class SqliteBackend(SqliteWrites, SqliteReads):
    """Sessions in one SQLite database file (schema 17) and its lease file. Blocking;
    one connection, serialised by a lock (thread-safe).

    ``lease_ttl``: seconds a writer lease stays valid without a write or a renewal.
    ``journal_mode``: the reference's ``journalMode``, one of :data:`JOURNAL_MODES`
    (default ``"wal"``); the lease file uses the same.
    ``busy_timeout_ms``: the reference's ``busyTimeoutMs`` (default 5000): how long a
    statement waits for another connection's lock, and how long opening retries a
    journal-mode change that finds the database busy.
    ``check``: what opening a connection checks of each file's pages before anything
    is written, one of :data:`PAGE_CHECKS`: ``"quick"`` (the default: ``PRAGMA
    quick_check``, one read of the whole file: about 0.1 s per 100k stored events,
    docs/decisions/0016), ``"integrity"`` (``PRAGMA integrity_check``: also every index
    against its table, several times slower), ``"none"``. A file the check finds damaged
    is refused with :class:`~harness.errors.StorageCorruptionError` (``STORAGE_CORRUPT``),
    as is a statement SQLite reports corruption for later (its transaction rolled
    back); another value raises :class:`~harness.errors.PersistenceArgumentError`.
    ``faults``: a statement hook for fault injection (see ``harness.faults``).
    ``files``: the file layer for the backend's own file operations (creating the
    database's directory, mode 0700, and the two files, mode 0600).

    Construction checks the path as the reference's service init does (see
    :mod:`~harness.persistence._sqlite_schema`): it creates the missing directories
    (0700) and refuses, with :class:`~harness.errors.UnsafeStoragePathError`, a
    directory that is a symbolic link, not the current user's, or group/world-writable,
    and a database (lease file, journal sidecar) that is a symbolic link, not a regular
    file, not the current user's, or open to group/world. ``path`` is made absolute
    without following symbolic links (the reference's ``path.resolve``), so a link is
    refused, never followed. Opening the database (lazily) checks again.
    """

    name = "sqlite"


# -- the pre-issue-11 schema --------------------------------------------------------------------


def migrate_legacy_sqlite(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> int:
    """Copy every session of a database in this port's own pre-schema-17 format
    (application id ``0x54484e53``, ``user_version`` 1 or 2) into a new schema-17
    database at ``dst`` (which must not exist). Returns the number of sessions copied.

    ``src`` is opened read-only and never changed; its leases are not copied (no
    writer may be running against it). The copy is all or nothing: on any failure
    (:class:`RecordEncodingError` for a record schema 17 cannot hold,
    :class:`SqliteSchemaError` if ``src`` is not such a database, ...) the new files
    are removed. Header keys schema 17 has no column for are dropped. Blocking."""
    src_path, dst_path = Path(src).resolve(), Path(dst).resolve()
    if any(p.exists() for p in (dst_path, lease_path(dst_path), Path(f"{dst_path}-wal"))):
        raise StorageIOError(f'cannot migrate into "{dst_path}": it already exists')
    check_file_header(src_path)
    try:
        con = sqlite3.connect(f"{src_path.as_uri()}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise StorageIOError(f"opening {src_path} failed: {exc}") from exc
    backend = SqliteBackend(dst_path)
    copied = 0
    try:
        backend.list_headers()  # creates the new database, even for no session
        try:
            app_id = int(con.execute("PRAGMA application_id").fetchone()[0])
            version = int(con.execute("PRAGMA user_version").fetchone()[0])
            if app_id != LEGACY_APPLICATION_ID or version not in LEGACY_SCHEMA_VERSIONS:
                raise SqliteSchemaError(
                    f'"{src_path}" is not a trio-harness database of before schema 17 '
                    f"(application id {app_id}, schema version {version})",
                    path=src_path,
                    application_id=app_id,
                    user_version=version,
                )
            sessions = con.execute("SELECT id, header FROM sessions ORDER BY id").fetchall()
            for sid, header_text in sessions:
                lines = con.execute(
                    "SELECT record FROM events WHERE session_id = ? ORDER BY seq", (sid,)
                ).fetchall()
                header = check_header_record(orjson.loads(header_text), sid)
                records = [ev for (text,) in lines for ev in decode_storage_record(orjson.loads(text))]
                backend.materialize(header, records)
                copied += 1
        except sqlite3.Error as exc:
            raise StorageIOError(f"reading {src_path} failed: {exc}") from exc
        except orjson.JSONDecodeError as exc:
            raise SessionCorruptionError(f"corrupt session log in {src_path}: a stored row is not JSON: {exc}") from exc
    except BaseException:
        backend.close()
        for p in (dst_path, lease_path(dst_path)):
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{p}{suffix}")
        raise
    finally:
        con.close()
    backend.close()
    return copied
