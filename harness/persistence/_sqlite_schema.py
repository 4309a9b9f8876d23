"""The SQLite schema 17 of the reference (§3), its identity checks, and the lease file.

The session database is exactly the reference's: ``PRAGMA application_id =
0x44534850``, ``user_version = 17``, the three STRICT tables below (same column
order, same DDL up to whitespace: the reference compares every schema object's SQL,
whitespace-normalised, with its own), one ``persistence_state`` row holding the store
id (a UUID). Nothing else may live in it: the reference refuses a database with any
other schema object (``… does not contain the required schema objects``), on open and
before every mutation.

So the single-writer lease of this port (not in the reference) lives in a *separate*
SQLite file next to the database, :func:`lease_path` (``<db>-leases``), attached to
the backend's connection as schema ``lease``: a ``BEGIN IMMEDIATE`` takes the write
locks of both files, so a lease check and the write it guards are one critical
section. The reference never opens that file, which is how it tolerates it; the lease
file records the store id of the database it guards, and forgets its leases when the
database beside it is another store (deleted and created again).

Identity checks (:func:`check_database`) run inside the opening ``BEGIN IMMEDIATE``,
before any statement that writes, in the reference's order and with its wording; a
file that is not empty and not a SQLite database is refused before it is even opened
(:func:`check_file_header`), since SQLite would treat a file shorter than a page as an
empty database and write over it.

Path checks (reference ``validatePath``, ``validateParentDirectory``,
``validateDatabaseFile``), before SQLite opens anything: the database's directory must be
a real directory (not a symbolic link) owned by the current user and not group- or
world-writable; the database, when it exists, a regular file (not a symbolic link) owned
by the current user with no group or world permission bit. The same file rule covers
what this port keeps beside it (:func:`check_companions`): the lease file and the
journal sidecars SQLite creates (``-wal``, ``-shm``, ``-journal``; SQLite gives them the
database's mode, so they are 0600 too). Off POSIX (no ``os.getuid``) only the
kind-of-file checks apply, as in the reference.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from harness.errors import SqliteSchemaError, StorageIOError, UnsafeStoragePathError

APPLICATION_ID: Final = 0x44534850  # "DSHP", the reference's
SCHEMA_VERSION: Final = 17

#: This port's own schema before issue 11 ("THNS", user_version 1 or 2): refused.
LEGACY_APPLICATION_ID: Final = 0x54484E53
LEGACY_SCHEMA_VERSIONS: Final = (1, 2)

#: The lease file: its own application id ("THNL") and version. Version 2 (issue 24)
#: added ``pid_scope``; a version-1 file is upgraded in place on open (its rows get no
#: scope: their holders are remote, respected until they expire).
LEASE_APPLICATION_ID: Final = 0x54484E4C
LEASE_SCHEMA_VERSION: Final = 2
LEASE_UPGRADABLE_VERSIONS: Final = (1,)
LEASE_SCHEMA: Final = "lease"  # the name it is attached under

SQLITE_MAGIC: Final = b"SQLite format 3\x00"

# The reference's resources/sql/schema.sql, statement by statement. The layout matters
# only up to whitespace runs (both sides compare whitespace-normalised SQL), but every
# token, its order and the spaces *between* tokens must stay exactly as they are.
SCHEMA: Final = (
    """CREATE TABLE persistence_state (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  store_id  TEXT NOT NULL
) STRICT""",
    """CREATE TABLE sessions (
  id               TEXT PRIMARY KEY,
  version          INTEGER NOT NULL,
  created_at       INTEGER NOT NULL,
  cwd              TEXT,
  parent_session   TEXT,
  seed_length      INTEGER,
  origin           TEXT,
  delegation_depth INTEGER,
  agent_preset     TEXT,
  incarnation      TEXT NOT NULL,
  revision         INTEGER NOT NULL
) STRICT""",
    """CREATE TABLE events (
  session_id        TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq               INTEGER NOT NULL,
  type              TEXT NOT NULL,
  time              INTEGER NOT NULL,
  data              ANY NOT NULL,
  source_event_seqs ANY,
  surface_op        TEXT,
  ignorable         INTEGER CHECK (ignorable IS NULL OR ignorable IN (0, 1)),
  PRIMARY KEY (session_id, seq)
) STRICT""",
)

LEASE_TABLES: Final = (
    f"""CREATE TABLE {LEASE_SCHEMA}.leases (
  session_id TEXT PRIMARY KEY,
  fence      INTEGER NOT NULL,
  token      TEXT,
  host       TEXT,
  pid        INTEGER,
  start_time INTEGER,
  since      INTEGER,
  expires    INTEGER,
  pid_scope  TEXT
) STRICT""",
    f"""CREATE TABLE {LEASE_SCHEMA}.lease_store (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  store_id  TEXT NOT NULL
) STRICT""",
)

SCHEMA_OBJECTS_SQL: Final = (
    "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT GLOB 'sqlite_*' ORDER BY type, name"
)
_UUID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$", re.I)

Exec = Callable[..., sqlite3.Cursor]
"""``exec(sql, params=())``: the backend's statement hook (counted by the fault layer)."""


#: The journal sidecars SQLite keeps beside a database (WAL, its shared-memory index,
#: the rollback journal of the non-WAL modes).
SIDECAR_SUFFIXES: Final = ("-wal", "-shm", "-journal")


def _current_uid() -> int | None:
    getuid = getattr(os, "getuid", None)
    return None if getuid is None else int(getuid())


def _lstat(path: Path, what: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageIOError(f'{what} "{path}" cannot be inspected: {exc.strerror or exc}') from exc


def check_directory(path: Path) -> None:
    """The database's directory (reference ``validateParentDirectory``): a real
    directory, owned by the current user, not group/world-writable."""
    st = _lstat(path, "session database parent")
    if st is None:
        raise StorageIOError(f'session database parent "{path}" does not exist')
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeStoragePathError(f'session database parent "{path}" must be a real directory', path=path)
    uid = _current_uid()
    if uid is not None and (st.st_uid != uid or st.st_mode & 0o022):
        raise UnsafeStoragePathError(
            f'session database parent "{path}" must be owned by the current user and not group/world-writable',
            path=path,
        )


def check_file(path: Path, what: str = "session database", *, missing_ok: bool = True) -> bool:
    """A database file (reference ``validateDatabaseFile``): a regular file, not a
    symbolic link, owned by the current user, no group/world permission bit. Returns
    whether it exists (absent is refused unless ``missing_ok``)."""
    st = _lstat(path, what)
    if st is None:
        if missing_ok:
            return False
        raise StorageIOError(f'{what} "{path}" does not exist')
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise UnsafeStoragePathError(f'{what} "{path}" must be a regular file, not a symbolic link', path=path)
    uid = _current_uid()
    if uid is not None and (st.st_uid != uid or st.st_mode & 0o077):
        raise UnsafeStoragePathError(
            f'{what} "{path}" must be owned by the current user and accessible only by that user', path=path
        )
    return True


def check_companions(db_path: Path) -> None:
    """This port's addition to the reference's checks: the lease file and every journal
    sidecar (of the database and of the lease file) that exists obey the database
    file's rule, so SQLite never follows a planted link nor appends to a file others
    can read."""
    lease = lease_path(db_path)
    check_file(lease, "lease file")
    for base in (db_path, lease):
        for suffix in SIDECAR_SUFFIXES:
            check_file(Path(f"{base}{suffix}"), "session database journal")


def lease_path(db_path: str | Path) -> Path:
    """The lease file of the session database at ``db_path``."""
    p = Path(db_path)
    return p.with_name(p.name + "-leases")


def is_uuid(value: object) -> bool:
    return type(value) is str and _UUID.match(value) is not None


def normalize_sql(sql: str) -> str:
    return " ".join(sql.split())


def _objects(rows: Sequence[Sequence[Any]]) -> list[tuple[str, str, str, str]]:
    return [(str(t), str(n), str(tb), normalize_sql(str(s or ""))) for t, n, tb, s in rows]


_CANONICAL: list[tuple[str, str, str, str]] | None = None


def canonical_objects() -> list[tuple[str, str, str, str]]:
    """The schema objects a fresh schema-17 database holds (as the reference derives
    them: run the schema in memory, read ``sqlite_master`` back)."""
    global _CANONICAL
    if _CANONICAL is None:
        db = sqlite3.connect(":memory:")
        try:
            db.execute("PRAGMA foreign_keys=ON")
            for statement in SCHEMA:
                db.execute(statement)
            _CANONICAL = _objects(db.execute(SCHEMA_OBJECTS_SQL).fetchall())
        finally:
            db.close()
    return _CANONICAL


def check_file_header(path: Path, what: str = "session database") -> None:
    """Refuse a non-empty file that does not start with SQLite's magic (read only)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StorageIOError(f'{what} at "{path}" cannot be read: {exc}') from exc
    if head and head != SQLITE_MAGIC:
        raise SqliteSchemaError(f'{what} at "{path}" is not a SQLite database: file is not a database', path=path)


def _int(exec_: Exec, sql: str) -> int:
    return int(exec_(sql).fetchone()[0])


def check_database(exec_: Exec, path: Path) -> bool:
    """The opening identity checks, inside the caller's ``BEGIN IMMEDIATE`` (reference
    order and wording). Returns True for a pristine database (the caller initialises
    it), False for a schema-17 one; raises :class:`SqliteSchemaError` otherwise."""
    version = _int(exec_, "PRAGMA user_version")
    app_id = _int(exec_, "PRAGMA application_id")
    count = _int(exec_, "SELECT count(*) FROM sqlite_master WHERE name NOT GLOB 'sqlite_*'")

    def refuse(message: str) -> SqliteSchemaError:
        return SqliteSchemaError(message, path=path, application_id=app_id, user_version=version)

    if version == 0:
        if app_id != 0 or count > 0:
            raise refuse(f'session database at "{path}" has an unversioned schema or application identity')
        return True
    if version != SCHEMA_VERSION:
        message = f'session database at "{path}" has schema version {version}, incompatible with this build ({SCHEMA_VERSION})'
        if app_id == LEGACY_APPLICATION_ID and version in LEGACY_SCHEMA_VERSIONS:
            message += (
                f": it holds trio-harness's own schema v{version} from before the reference schema "
                "(application id 0x54484e53); copy its sessions into a new database with "
                "harness.persistence.migrate_legacy_sqlite(src, dst)"
            )
        raise refuse(message)
    if app_id != APPLICATION_ID:
        raise refuse(f'session database at "{path}" has application id {app_id}, expected {APPLICATION_ID}')
    check_objects(exec_, path)
    return False


def check_objects(exec_: Exec, path: Path) -> None:
    if _objects(exec_(SCHEMA_OBJECTS_SQL).fetchall()) != canonical_objects():
        raise SqliteSchemaError(
            f'session database at "{path}" does not contain the required schema objects',
            path=path,
            application_id=APPLICATION_ID,
            user_version=SCHEMA_VERSION,
        )


def initialize(exec_: Exec, store_id: str) -> None:
    """Create the schema of a pristine database (inside the opening transaction)."""
    for statement in SCHEMA:
        exec_(statement)
    exec_("INSERT INTO persistence_state (singleton, store_id) VALUES (1, ?)", (store_id,))
    exec_(f"PRAGMA application_id = {APPLICATION_ID}")
    exec_(f"PRAGMA user_version = {SCHEMA_VERSION}")


def read_store_id(exec_: Exec, path: Path) -> str:
    row = exec_("SELECT store_id FROM persistence_state WHERE singleton = 1").fetchone()
    if row is None or not is_uuid(row[0]):
        raise SqliteSchemaError(
            f'session database at "{path}" has no valid store identity',
            path=path,
            application_id=APPLICATION_ID,
            user_version=SCHEMA_VERSION,
        )
    return str(row[0])


_MUTATION_CHECK: Final = (
    "SELECT user_version, application_id, schema_version "
    "FROM pragma_user_version, pragma_application_id, pragma_schema_version"
)


def check_for_mutation(exec_: Exec, path: Path, checked_cookie: int | None = None) -> int:
    """Inside every write transaction: the database is still ours (reference
    ``validateSchemaForMutation``, same order and wording). Returns the schema cookie
    (``PRAGMA schema_version``, bumped by any schema change): given the cookie of a
    previous successful check, the schema objects are compared again only if it moved."""
    # One statement for the three values (the pragmas' table-valued forms): this runs
    # in every write transaction, and each statement costs a round trip through the
    # driver (issue 26 measured ~5 us each); the checks below keep the reference's order.
    version, app_id, cookie = (int(v) for v in exec_(_MUTATION_CHECK).fetchone())
    if app_id != APPLICATION_ID:
        raise SqliteSchemaError(
            f"session database application id changed before mutation (expected {APPLICATION_ID}, got {app_id})",
            path=path,
            application_id=app_id,
            user_version=version,
        )
    if cookie != checked_cookie:
        check_objects(exec_, path)
    if version != SCHEMA_VERSION:
        raise SqliteSchemaError(
            f"session database schema changed before mutation (expected {SCHEMA_VERSION}, got {version})",
            path=path,
            application_id=app_id,
            user_version=version,
        )
    return cookie


def check_lease_file(exec_: Exec, path: Path, store_id: str) -> None:
    """Inside a ``BEGIN IMMEDIATE`` with the lease file attached: initialise a pristine
    one, upgrade a version-1 one, refuse a foreign (or newer) one, bind it to
    ``store_id`` (forgetting the leases of another store)."""
    s = LEASE_SCHEMA
    version = _int(exec_, f"PRAGMA {s}.user_version")
    app_id = _int(exec_, f"PRAGMA {s}.application_id")
    count = _int(exec_, f"SELECT count(*) FROM {s}.sqlite_master WHERE name NOT GLOB 'sqlite_*'")
    if version == 0 and app_id == 0 and count == 0:
        for statement in LEASE_TABLES:
            exec_(statement)
        exec_(f"PRAGMA {s}.application_id = {LEASE_APPLICATION_ID}")
        exec_(f"PRAGMA {s}.user_version = {LEASE_SCHEMA_VERSION}")
    elif app_id == LEASE_APPLICATION_ID and version in LEASE_UPGRADABLE_VERSIONS:
        # Written by a build before the pid scope (issue 24): add the column, NULL in
        # every existing row, so those holders count as remote until they expire.
        exec_(f"ALTER TABLE {s}.leases ADD COLUMN pid_scope TEXT")
        exec_(f"PRAGMA {s}.user_version = {LEASE_SCHEMA_VERSION}")
    elif app_id != LEASE_APPLICATION_ID or version != LEASE_SCHEMA_VERSION:
        raise SqliteSchemaError(
            f'lease file at "{path}" has application id {app_id} and schema version {version}, '
            f"expected {LEASE_APPLICATION_ID} and {LEASE_SCHEMA_VERSION}",
            path=path,
            application_id=app_id,
            user_version=version,
        )
    row = exec_(f"SELECT store_id FROM {s}.lease_store WHERE singleton = 1").fetchone()
    if row is None:
        exec_(f"INSERT INTO {s}.lease_store (singleton, store_id) VALUES (1, ?)", (store_id,))
    elif row[0] != store_id:
        exec_(f"DELETE FROM {s}.leases")
        exec_(f"UPDATE {s}.lease_store SET store_id = ? WHERE singleton = 1", (store_id,))
