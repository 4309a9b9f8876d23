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
import logging
import os
import secrets
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import orjson

from harness.errors import (
    LeaseLostError,
    PersistedSessionNotFoundError,
    PersistenceArgumentError,
    RecordEncodingError,
    SessionCorruptionError,
    SessionLockedError,
    SessionLogExistsError,
    SqliteSchemaError,
    StorageIOError,
)
from harness.persistence._backend import (
    GroupWrite,
    StoredLog,
    WriterLease,
    check_header_record,
    format_error,
)
from harness.persistence._files import OsFiles, SimulatedCrash
from harness.persistence._liveness import holder_dead, identity, process_start_time
from harness.persistence._sql_group import copy_error
from harness.persistence._sqlite_rows import (
    COLUMNS,
    INSERT,
    MAX_MEMBERS,
    Row,
    bind_segments,
    covers,
    fetch_batches,
    next_seq_of_tail,
    scan_batches,
    scan_rows,
)
from harness.persistence._sqlite_schema import (
    APPLICATION_ID,
    LEASE_SCHEMA,
    LEGACY_APPLICATION_ID,
    LEGACY_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    check_companions,
    check_database,
    check_directory,
    check_file,
    check_file_header,
    check_for_mutation,
    check_lease_file,
    check_objects,
    initialize,
    is_uuid,
    lease_path,
    read_store_id,
)
from harness.session import SESSION_FORMAT_VERSION, decode_storage_record
from harness.session._header import _is_absolute

log = logging.getLogger("harness.persistence")

__all__ = [
    "APPLICATION_ID",
    "DEFAULT_BUSY_TIMEOUT_MS",
    "DEFAULT_LEASE_TTL",
    "JOURNAL_MODES",
    "SCHEMA_VERSION",
    "SqliteBackend",
    "SqliteSchemaError",
    "lease_path",
    "migrate_legacy_sqlite",
    "process_start_time",
]

DEFAULT_LEASE_TTL: Final = 30.0
#: The reference's default wait for another connection's lock, and SQLite's largest.
DEFAULT_BUSY_TIMEOUT_MS: Final = 5_000
MAX_BUSY_TIMEOUT_MS: Final = 2_147_483_647
JournalMode = Literal["wal", "delete", "truncate", "persist"]
#: The durable journal modes the reference accepts (``journalMode``; default ``wal``).
JOURNAL_MODES: Final = ("wal", "delete", "truncate", "persist")
_JOURNAL_BUSY_RETRY: Final = 0.010  # seconds between journal-mode attempts on SQLITE_BUSY

_LEASE_COLUMNS = "fence, token, host, pid, start_time, since, expires, pid_scope"
_LEASES = f"{LEASE_SCHEMA}.leases"
_SESSION_COLUMNS = (
    "id, version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, agent_preset, "
    "incarnation, revision"
)
_CHUNK_TAGS_SQL = "('text-chunks', 'reasoning-chunks', 'tool-call-chunks')"
_GROUP_SAVEPOINT: Final = "harness_group_batch"
# The session row's incarnation and revision and its last row's seq (NULL: no rows).
_SESSION_TAIL: Final = (
    "SELECT incarnation, revision, (SELECT max(seq) FROM events WHERE session_id = ?1) FROM sessions WHERE id = ?1"
)


class StatementFaults(Protocol):
    """What the backend calls before every statement (``harness.faults.SqliteFaults``)."""

    def before(self, sql: str) -> None: ...


class SqliteBackend:
    """Sessions in one SQLite database file (schema 17) and its lease file. Blocking;
    one connection, serialised by a lock (thread-safe).

    ``lease_ttl``: seconds a writer lease stays valid without a write or a renewal.
    ``journal_mode``: the reference's ``journalMode``, one of :data:`JOURNAL_MODES`
    (default ``"wal"``); the lease file uses the same.
    ``busy_timeout_ms``: the reference's ``busyTimeoutMs`` (default 5000): how long a
    statement waits for another connection's lock, and how long opening retries a
    journal-mode change that finds the database busy.
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

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        journal_mode: JournalMode = "wal",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        faults: StatementFaults | None = None,
        files: OsFiles | None = None,
    ) -> None:
        if not lease_ttl > 0:
            raise ValueError(f"lease_ttl must be positive, got {lease_ttl!r}")
        if journal_mode not in JOURNAL_MODES:
            raise PersistenceArgumentError(
                f"SQLite journal_mode must be one of {', '.join(JOURNAL_MODES)}, got {journal_mode!r}"
            )
        if type(busy_timeout_ms) is not int or not 0 <= busy_timeout_ms <= MAX_BUSY_TIMEOUT_MS:
            raise PersistenceArgumentError(
                f"SQLite busy_timeout_ms must be an integer in [0, {MAX_BUSY_TIMEOUT_MS}], got {busy_timeout_ms!r}"
            )
        # Lexically absolute, as the reference's path.resolve: Path.resolve() would follow
        # a symbolic link to the database (or its directory) instead of refusing it.
        self.path = Path(os.path.abspath(os.fspath(path)))
        self.lease_path = lease_path(self.path)
        self.lease_ttl = lease_ttl
        self.journal_mode: JournalMode = journal_mode
        self.busy_timeout_ms = busy_timeout_ms
        self.faults = faults
        self.files = files or OsFiles()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._identity = ""  # "file:<dev>:<ino>:<birth>:store:<store id>" of the open database
        self._store_id = ""
        self._cookie: int | None = None  # schema_version at the last ownership check that passed
        self._tokens: set[str] = set()  # lease tokens this instance handed out
        # Idle renewal: the leases this instance holds, renewed by a daemon thread.
        self._held: dict[str, _LeaseRow] = {}  # token -> lease
        self._keeper: threading.Thread | None = None
        self._keeper_wake = threading.Condition()
        self._quiet = threading.local()  # set on the keeper thread: bypass ``faults``
        # sid -> (incarnation, revision, next seq) that this instance's last committed
        # write left (``_next_seq``), and those of the open write transaction.
        # (incarnation, revision, last row's seq, next seq).
        self._tails: dict[str, tuple[str, int, int, int]] = {}
        self._pending_tails: dict[str, tuple[str, int, int, int]] = {}
        self._check_path()

    # -- statements ------------------------------------------------------------------------

    def _hook(self, sql: str) -> None:
        # Idle renewals are timing-dependent: counting them would make a scenario's
        # statement numbers (and so its fault points) differ from run to run.
        if self.faults is not None and not getattr(self._quiet, "on", False):
            self.faults.before(sql)

    def _exec(self, db: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        self._hook(sql)
        try:
            return db.execute(sql, params)
        except UnicodeDecodeError as exc:
            # A damaged page can hold text that is not UTF-8 (e.g. in the schema the
            # opening checks read): a database error like any other damage, not a
            # ValueError out of the backend (issue 16).
            raise sqlite3.DatabaseError(f"database disk image is malformed: {exc}") from exc

    # -- connection ------------------------------------------------------------------------

    def _check_path(self) -> None:
        """The reference's path validation (its service init; again before every
        connection): create the missing directories (0700, each parent fsynced), check
        the directory, then the database if it exists, then (this port) the lease file
        and the journal sidecars if they exist."""
        parent = self.path.parent
        missing = []
        p = parent
        while not os.path.lexists(p):
            missing.append(p)
            p = p.parent
        try:
            for d in reversed(missing):
                with contextlib.suppress(FileExistsError):
                    self.files.mkdir(str(d), 0o700)
                self.files.fsync_dir(str(d.parent))
        except OSError as exc:
            raise StorageIOError(
                f'creating the session database directory "{parent}" failed: {exc.strerror or exc}'
            ) from exc
        check_directory(parent)
        check_file(self.path)
        check_companions(self.path)

    def _create_file(self, path: Path, what: str) -> None:
        """Create ``path`` (0600, ``O_EXCL``: the reference's ``wx``; SQLite would create
        it world-readable, and would follow a link planted meanwhile) through the file
        layer, then check it. An existing file is left alone (not opened for writing)."""
        try:
            fd = self.files.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            self.files.close(fd)
            self.files.fsync_dir(str(path.parent))
        check_file(path, what, missing_ok=False)

    def _conn(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        # Read-only checks first: an unsafe path or a foreign file is refused before
        # anything touches it.
        self._check_path()
        check_file_header(self.path)
        check_file_header(self.lease_path, "lease file")
        try:
            self._create_file(self.path, "session database")
        except OSError as exc:
            raise StorageIOError(f"creating session database {self.path} failed: {exc}") from exc
        try:
            db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout_ms / 1000
            )
        except sqlite3.Error as exc:
            raise StorageIOError(f"opening session database {self.path} failed: {exc}") from exc
        try:
            self._open(db)
        except BaseException as exc:
            db.close()
            if isinstance(exc, SqliteSchemaError):
                raise
            if isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc):
                raise SqliteSchemaError(
                    f'session database at "{self.path}" is not a SQLite database: {exc}', path=self.path
                ) from exc
            if isinstance(exc, sqlite3.Error):
                raise StorageIOError(f"opening session database {self.path} failed: {exc}") from exc
            if isinstance(exc, OSError):
                raise StorageIOError(f"creating lease file {self.lease_path} failed: {exc}") from exc
            raise
        self._cookie = None
        self._db = db
        return db

    def _open(self, db: sqlite3.Connection) -> None:
        """The reference's opening sequence (``openDatabase``): connection security
        (``trusted_schema=OFF``, ``mmap_size=0``, each read back), identity checks and a
        pristine database's schema in one ``BEGIN IMMEDIATE``, the journal mode (retried
        every 10 ms while SQLite answers busy, until ``busy_timeout_ms`` after the start),
        ``synchronous=FULL`` (read back); then the lease file, the same way."""
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        ex = self._exec
        where = f'session database at "{self.path}"'
        ex(db, "PRAGMA trusted_schema=OFF")
        _expect(ex(db, "PRAGMA trusted_schema"), 0, f"{where} retained trusted_schema={{}}, expected 0")
        ex(db, "PRAGMA mmap_size=0")
        _expect(ex(db, "PRAGMA mmap_size"), 0, f"{where} retained mmap_size={{}}, expected 0")
        ex(db, "PRAGMA foreign_keys=ON")

        def exec_(sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
            return ex(db, sql, params)

        self._in_txn(db, lambda: self._check_main(exec_))
        self._select_journal_mode(db, "", where, deadline)
        ex(db, "PRAGMA synchronous=FULL")
        _expect(ex(db, "PRAGMA synchronous"), 2, f"{where} retained synchronous={{}}, expected FULL (2)")
        try:
            self._create_file(self.lease_path, "lease file")
        except OSError as exc:
            raise StorageIOError(f"creating lease file {self.lease_path} failed: {exc}") from exc
        ex(db, f"ATTACH DATABASE ? AS {LEASE_SCHEMA}", (str(self.lease_path),))
        lease_where = f'lease file at "{self.lease_path}"'
        self._select_journal_mode(db, f"{LEASE_SCHEMA}.", lease_where, deadline)
        ex(db, f"PRAGMA {LEASE_SCHEMA}.synchronous=FULL")
        _expect(
            ex(db, f"PRAGMA {LEASE_SCHEMA}.synchronous"), 2, f"{lease_where} retained synchronous={{}}, expected FULL (2)"
        )
        self._in_txn(db, lambda: check_lease_file(exec_, self.lease_path, self._store_id))

    def _select_journal_mode(self, db: sqlite3.Connection, schema: str, where: str, deadline: float) -> None:
        """``PRAGMA <schema>journal_mode=<mode>``, retried every 10 ms while SQLite
        answers ``SQLITE_BUSY`` (another connection holds the database) until
        ``deadline``; the mode SQLite reports must be the one asked for."""
        sql = f"PRAGMA {schema}journal_mode={self.journal_mode.upper()}"
        while True:
            try:
                row = self._exec(db, sql).fetchone()
                break
            except sqlite3.OperationalError as exc:
                remaining = deadline - time.monotonic()
                if (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF != sqlite3.SQLITE_BUSY or remaining <= 0:
                    raise
                time.sleep(min(_JOURNAL_BUSY_RETRY, remaining))
        selected = str(row[0]).lower() if row else ""
        if selected != self.journal_mode:
            raise StorageIOError(f"{where} selected journal mode {selected}, expected {self.journal_mode}")

    def _check_main(self, exec_: Any) -> None:
        if check_database(exec_, self.path):
            initialize(exec_, str(uuid.uuid4()))
            check_objects(exec_, self.path)
        store_id = self._store_id = read_store_id(exec_, self.path)
        st = os.stat(self.path)
        birth = getattr(st, "st_birthtime", None)
        birth_ns = 0 if birth is None else int(birth * 1_000_000_000)
        self._identity = f"file:{st.st_dev}:{st.st_ino}:{birth_ns}:store:{store_id}"

    def _in_txn(self, db: sqlite3.Connection, body: Any) -> None:
        self._exec(db, "BEGIN IMMEDIATE")
        try:
            body()
            self._exec(db, "COMMIT")
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")  # direct: also after a simulated crash
            raise

    def _die(self) -> None:
        """A simulated crash: drop the connection (SQLite rolls the open transaction
        back, as after process death) and forget this instance's leases as live."""
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
        self._tails.clear()
        for token in self._tokens:
            _LIVE_TOKENS.discard(token)
        self._tokens.clear()
        with self._keeper_wake:
            self._held.clear()  # a dead process renews nothing
            self._keeper_wake.notify_all()

    def _rollback(self, db: sqlite3.Connection) -> None:
        """Roll back after a failure; if even that fails, drop the connection (closing
        it discards the transaction) so the next call starts clean."""
        if not db.in_transaction:
            return
        try:
            self._exec(db, "ROLLBACK")
        except sqlite3.Error as exc:
            log.warning("sqlite: rollback in %s failed, reconnecting: %s", self.path, exc)
            self._db = None
            with contextlib.suppress(sqlite3.Error):
                db.close()

    @contextmanager
    def _txn(self, immediate: bool = True, *, owned: bool = True) -> Iterator[sqlite3.Connection]:
        """A transaction; a write one (``immediate``) that writes the database
        (``owned``: not a lease-only one) first re-checks that the database is still
        ours (the reference re-validates schema ownership on every mutation)."""
        with self._lock:
            self._pending_tails.clear()
            try:
                db = self._conn()
                self._exec(db, "BEGIN IMMEDIATE" if immediate else "BEGIN")
            except sqlite3.Error as exc:
                raise StorageIOError(f"session database {self.path}: {exc}") from exc
            except SimulatedCrash:
                self._die()
                raise
            try:
                if immediate and owned:
                    self._cookie = check_for_mutation(
                        lambda sql, params=(): self._exec(db, sql, params), self.path, self._cookie
                    )
                yield db
            except SimulatedCrash:
                self._die()
                raise
            except sqlite3.Error as exc:
                self._rollback(db)
                raise StorageIOError(f"session database {self.path}: {exc}") from exc
            except BaseException:
                self._rollback(db)
                raise
            try:
                self._exec(db, "COMMIT")
            except SimulatedCrash:
                self._die()
                raise
            except sqlite3.Error as exc:
                self._rollback(db)
                raise StorageIOError(f"session database {self.path}: commit failed: {exc}") from exc
            finally:
                pending = self._pending_tails
                self._pending_tails = {}
            if not db.in_transaction:  # committed: the tails it left are the stored ones
                self._tails.update(pending)

    def close(self) -> None:
        """Close the connection and stop idle renewals (leases still out stay in the
        lease file until they expire or a later write through them renews them)."""
        with self._keeper_wake:
            self._held.clear()
            self._keeper_wake.notify_all()
            keeper = self._keeper
        if keeper is not None and keeper is not threading.current_thread():
            # A renewal already under way would otherwise reopen the connection
            # after this close; the keeper exits once it sees no lease held.
            keeper.join(timeout=10.0)
        with self._lock:
            if self._db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
                self._db = None

    # -- reading ---------------------------------------------------------------------------

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

    # -- writing ---------------------------------------------------------------------------

    def materialize(
        self, header: dict[str, Any], records: list[dict[str, Any]], *, lease: WriterLease | None = None
    ) -> None:
        params = _session_params(header["id"], header)
        with self._txn() as db:
            self._materialize_in(db, header, records, lease, params)

    def _materialize_in(
        self,
        db: sqlite3.Connection,
        header: dict[str, Any],
        records: list[dict[str, Any]],
        lease: WriterLease | None,
        params: tuple[Any, ...],
    ) -> None:
        """Inside a write transaction: a first write (lease check, refusal of an
        existing session, the session row, the rows)."""
        sid = header["id"]
        self._check_lease(db, sid, lease, len(records))
        if self._exec(db, "SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
            raise SessionLogExistsError(
                f'refusing to materialize "{sid}": a log already exists on disk (load/resume it instead)',
                session_id=sid,
            )
        self._exec(
            db,
            f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
            params,
        )
        self._insert(db, sid, records, 0, (params[9], 0))

    def _insert(
        self,
        db: sqlite3.Connection,
        sid: str,
        records: list[dict[str, Any]],
        next_seq: int,
        stored: tuple[str, int] | None = None,
    ) -> None:
        """Insert a batch's rows (chunk runs packed), which must start at ``next_seq``,
        and bump the revision. The rows are bound while they are inserted, segment by
        segment (:func:`bind_segments`): a record the schema cannot hold raises
        :class:`RecordEncodingError` and the transaction rolls the batch back. The
        fault layer sees the batch's insert as one statement (:data:`INSERT`).

        ``stored``: the session row's (incarnation, revision) before this write, read
        in this transaction: the tail this write leaves is remembered for the next
        append (:meth:`_next_seq`) once the transaction commits."""
        segments = bind_segments(sid, records, pack=True)
        first = next(segments, None)
        if first is not None:
            start = first[1][0][1]
            if start != next_seq:
                raise SessionCorruptionError(
                    f"session {sid} append starts at seq {start}, stored next seq is {next_seq}",
                    session_id=sid,
                )
            self._hook(INSERT)
            db.executemany(*first)
            last_row = first[1][-1][1]
            for sql, rows in segments:
                db.executemany(sql, rows)
                last_row = rows[-1][1]
        self._bump(db, sid)
        if stored is not None and first is not None:
            last = records[-1].get("seq")
            if last == next_seq + len(records) - 1:  # contiguous, as the session core writes
                self._pending_tails[sid] = (stored[0], stored[1] + 1, last_row, next_seq + len(records))

    def _bump(self, db: sqlite3.Connection, sid: str) -> None:
        if self._exec(db, "UPDATE sessions SET revision = revision + 1 WHERE id = ?", (sid,)).rowcount != 1:
            raise PersistedSessionNotFoundError(f"session {sid} metadata row is missing", session_id=sid)

    def _next_seq(self, db: sqlite3.Connection, sid: str) -> tuple[int, tuple[str, int]]:
        """The stored next seq, and the session row's (incarnation, revision).

        If that row is still the one this instance's last committed write left (same
        incarnation and revision: every write, by either implementation, bumps the
        revision, and a re-created session has a new incarnation) and so is the last
        row's seq (an index seek in the same statement: rows added or removed behind
        the revision's back, by hand, are noticed too), the tail is the one that write
        stored and its next seq is remembered: no tail rows read and decoded. Otherwise from
        the logical tail: the last two rows, from the packed row before them if it
        overlaps them (the reference looks for such a row among the 1023 rows before;
        in a valid log only the adjacent one can, and a full load checks them all). A
        tail that does not decode refuses the append."""
        row = self._exec(db, _SESSION_TAIL, (sid,)).fetchone()
        if row is None:
            raise PersistedSessionNotFoundError(f'session "{sid}" not found', session_id=sid)
        stored = (row[0], row[1])
        known = self._pending_tails.get(sid) or self._tails.get(sid)
        if known is not None and known[:3] == (row[0], row[1], row[2]):
            return known[3], stored
        tail = self._exec(
            db, f"SELECT {COLUMNS} FROM events WHERE session_id = ? ORDER BY seq DESC LIMIT 3", (sid,)
        ).fetchall()
        return next_seq_of_tail(sid, tail), stored

    def append(self, session_id: str, records: list[dict[str, Any]], *, lease: WriterLease | None = None) -> None:
        """Append one batch in one transaction that also checks (and renews) the
        caller's lease: a lost lease raises :class:`LeaseLostError`, nothing lands."""
        if not records:
            return
        with self._txn() as db:
            self._append_in(db, session_id, records, lease)

    def _append_in(
        self, db: sqlite3.Connection, sid: str, records: list[dict[str, Any]], lease: WriterLease | None
    ) -> None:
        """Inside a write transaction: an append (lease check, continuity, the rows)."""
        self._check_lease(db, sid, lease, len(records))
        next_seq, stored = self._next_seq(db, sid)
        self._insert(db, sid, records, next_seq, stored)

    def write_group(self, writes: Sequence[GroupWrite]) -> list[BaseException | None]:
        """Several sessions' batches in ONE ``BEGIN IMMEDIATE`` transaction: one commit
        (one journal sync) for all of them (group commit, issue 26; the contract is
        :func:`~harness.persistence._backend.write_each`'s).

        Each batch runs inside its own ``SAVEPOINT``: a batch refused by its own checks
        (a lost lease, an existing session for a first write, a seq that does not
        continue the stored log, a record the schema cannot hold, a statement of its
        own failing) is rolled back alone and reported with the exception ``append``
        or ``materialize`` would raise for it alone; the others go on. A failure of a
        shared step (connecting, ``BEGIN``, the ownership check, ``COMMIT``, or a
        batch's failure that took the whole transaction down, as SQLite does on some
        I/O errors) fails every batch not already failed by its own checks. A single
        batch needs no savepoint (its failure is the transaction's). Batches of one
        session land in the order given (each is checked against the stored log as
        left by the ones before it in the same transaction). A simulated crash
        propagates (the connection is dropped, nothing of the group lands)."""
        results: list[BaseException | None] = [None] * len(writes)
        todo = [(i, w) for i, w in enumerate(writes) if w.records or not w.materialized]
        params: dict[int, tuple[Any, ...]] = {}
        for i, w in todo:
            if not w.materialized:
                try:
                    params[i] = _session_params(w.session_id, w.header)
                except RecordEncodingError as exc:
                    results[i] = exc
        todo = [(i, w) for i, w in todo if results[i] is None]
        if not todo:
            return results
        saved = len(todo) > 1
        try:
            with self._txn() as db:
                for i, w in todo:
                    results[i] = self._group_batch(db, w, params.get(i), saved)
        except Exception as exc:
            # Alone: the batch's own exception. In a group: the shared step failed
            # (BEGIN, the ownership check, COMMIT, or a batch's statement took the
            # whole transaction down), so nothing of it landed: every batch not
            # already refused on its own gets a copy of the exception.
            for i, w in todo:
                if results[i] is None:
                    results[i] = copy_error(exc, w.session_id) if saved else exc
        return results

    def _group_batch(
        self, db: sqlite3.Connection, w: GroupWrite, params: tuple[Any, ...] | None, saved: bool
    ) -> BaseException | None:
        """One batch of a group inside the open transaction (in a savepoint if
        ``saved``); its own failure is returned (its savepoint rolled back), a
        failure that leaves the transaction unusable is raised."""
        if not saved:
            self._group_write(db, w, params)
            return None
        self._exec(db, f"SAVEPOINT {_GROUP_SAVEPOINT}")
        tail = self._pending_tails.get(w.session_id)
        try:
            self._group_write(db, w, params)
            self._exec(db, f"RELEASE {_GROUP_SAVEPOINT}")
        except SimulatedCrash:
            raise
        except Exception as exc:
            if not db.in_transaction:
                raise  # SQLite rolled the whole transaction back (some I/O errors do)
            # Not the transaction's failure: undo this batch alone. If that fails,
            # the transaction's state is unknown and the whole group goes.
            self._exec(db, f"ROLLBACK TO {_GROUP_SAVEPOINT}")
            self._exec(db, f"RELEASE {_GROUP_SAVEPOINT}")
            if tail is None:
                self._pending_tails.pop(w.session_id, None)
            else:
                self._pending_tails[w.session_id] = tail
            if isinstance(exc, sqlite3.Error):
                return StorageIOError(f"session database {self.path}: {exc}", session_id=w.session_id)
            return exc
        return None

    def _group_write(self, db: sqlite3.Connection, w: GroupWrite, params: tuple[Any, ...] | None) -> None:
        if params is None:
            self._append_in(db, w.session_id, w.records, w.lease)
        else:
            self._materialize_in(db, w.header, w.records, w.lease, params)

    def commit_repair(
        self,
        session_id: str,
        truncate_to: int | None,
        records: list[dict[str, Any]],
        *,
        lease: WriterLease | None = None,
    ) -> None:
        """The repair a :meth:`load` asked for, in one transaction: delete the torn rows
        from seq ``truncate_to`` on (it must still be where the torn tail starts), then
        append the closers ``records`` (they must start at the stored next seq)."""
        if truncate_to is None and not records:
            return
        segments = list(bind_segments(session_id, records, pack=False))
        sid = session_id
        with self._txn() as db:
            self._check_lease(db, sid, lease, len(records))
            if not self._exec(db, "SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
                raise PersistedSessionNotFoundError(f"session {sid} metadata row is missing", session_id=sid)
            cursor = self._exec(db, f"SELECT {COLUMNS} FROM events WHERE session_id = ? ORDER BY seq", (sid,))
            events, torn = scan_batches(sid, fetch_batches(cursor))
            if truncate_to is not None:
                if torn != truncate_to:
                    raise SessionCorruptionError(
                        f"session {sid} repair is stale: physical tail no longer starts at seq {truncate_to}",
                        session_id=sid,
                    )
                self._exec(db, "DELETE FROM events WHERE session_id = ? AND seq >= ?", (sid, truncate_to))
            elif torn is not None:
                raise SessionCorruptionError(
                    f"session {sid} repair omitted current torn tail at seq {torn}", session_id=sid
                )
            if segments:
                expected = int(events[-1]["seq"]) + 1 if events else 0
                start = segments[0][1][0][1]
                if start != expected:
                    raise SessionCorruptionError(
                        f"session {sid} repair is stale: closer starts at seq {start}, stored next seq is {expected}",
                        session_id=sid,
                    )
                self._hook(INSERT)
                for sql, rows in segments:
                    db.executemany(sql, rows)
            self._bump(db, sid)

    def delete(self, session_id: str) -> None:
        with self._txn() as db:
            self._tails.pop(session_id, None)
            if not self._exec(db, "DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount:
                raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)

    # -- one writer per session ----------------------------------------------------------

    def _lease_row(self, db: sqlite3.Connection, sid: str) -> tuple[Any, ...] | None:
        row = self._exec(db, f"SELECT {_LEASE_COLUMNS} FROM {_LEASES} WHERE session_id = ?", (sid,)).fetchone()
        return None if row is None else tuple(row)

    def _check_lease(
        self, db: sqlite3.Connection, sid: str, lease: WriterLease | None, n: int, *, renew: bool = False
    ) -> None:
        """Inside a write transaction: the caller's lease must be the current one; a
        caller without a lease may write only while nobody holds one.

        The lease is renewed when less than two thirds of its TTL remain (always with
        ``renew``): so a stream of writes keeps it at least that far ahead while the
        lease file is written at most every TTL/3, not with every batch (a batch that
        writes only the database commits one file, not two)."""
        row = self._lease_row(db, sid)
        now = _now_ms()
        if lease is None:
            if row is not None and _lease_live(row, now):
                raise SessionLockedError(
                    f'cannot write session "{sid}" without its lease: it is open for writing by {_describe(row)}',
                    session_id=sid,
                    holder=_holder(row),
                )
            return
        if not isinstance(lease, _LeaseRow) or lease.session_id != sid:
            raise TypeError(f"not a lease of session {sid!r} from this SQLite backend: {lease!r}")
        if row is None or row[1] != lease.token or row[0] != lease.fence:
            new = "nobody (released)" if row is None or row[1] is None else _describe(row)
            raise LeaseLostError(
                f'session "{sid}": this writer\'s lease (fence {lease.fence}) was taken over by {new}'
                f"{'' if row is None else f' (fence {row[0]})'}; {n} event(s) were not written",
                session_id=sid,
                holder=None if row is None else _holder(row),
            )
        ttl_ms = int(self.lease_ttl * 1000)
        if renew or row[6] is None or row[6] - now < ttl_ms * 2 // 3:
            self._exec(db, f"UPDATE {_LEASES} SET expires = ? WHERE session_id = ?", (now + ttl_ms, sid))

    def acquire_writer(self, header: dict[str, Any]) -> WriterLease:
        """Take the session's lease at once (a fresh fence), or raise
        :class:`SessionLockedError` naming a live holder."""
        sid = header["id"]
        token = secrets.token_hex(8)
        host, pid, start, scope = identity()
        now = _now_ms()
        with self._txn(owned=False) as db:
            row = self._lease_row(db, sid)
            if row is not None and _lease_live(row, now):
                raise SessionLockedError(
                    f'session "{sid}" is already open for writing by {_describe(row)}',
                    session_id=sid,
                    holder=_holder(row),
                )
            fence = 1 if row is None else int(row[0]) + 1
            self._exec(
                db,
                f"INSERT OR REPLACE INTO {_LEASES} "
                "(session_id, fence, token, host, pid, start_time, since, expires, pid_scope) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (sid, fence, token, host, pid, start, now, now + int(self.lease_ttl * 1000), scope),
            )
        _LIVE_TOKENS.add(token)
        self._tokens.add(token)
        lease = _LeaseRow(self, sid, token, fence)
        with self._keeper_wake:
            self._held[token] = lease
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep, name=f"sqlite-lease-keeper {self.path}", daemon=True)
                self._keeper.start()
        return lease

    def _renew(self, lease: _LeaseRow) -> None:
        with self._txn(owned=False) as db:
            self._check_lease(db, lease.session_id, lease, 0, renew=True)

    def _keep(self) -> None:
        """The keeper thread: renew every held lease each ``lease_ttl / 3`` seconds
        until none is held. A lost lease is dropped (its next write is refused by the
        fence anyway); a storage error is logged and retried at the next round."""
        interval = self.lease_ttl / 3
        self._quiet.on = True
        while True:
            with self._keeper_wake:
                if self._held:
                    self._keeper_wake.wait(interval)
                leases = list(self._held.values())
                if not leases:
                    self._keeper = None
                    return
            for lease in leases:
                with self._keeper_wake:
                    if lease.token not in self._held:
                        continue  # released (or the backend closed) meanwhile
                try:
                    self._renew(lease)
                except LeaseLostError as exc:
                    with self._keeper_wake:
                        still_held = self._held.pop(lease.token, None) is not None
                    # Released between the check above and the renewal: not a loss
                    # (the release cleared the row), so no warning.
                    if still_held:
                        log.warning("sqlite: %s", exc)
                except Exception as exc:
                    log.warning('sqlite: renewing the lease of session "%s" failed: %s', lease.session_id, exc)

    def _release(self, sid: str, token: str) -> None:
        # Forget the token first: even if the update below fails, this process no
        # longer vouches for the lease (others wait at most for its expiry).
        _LIVE_TOKENS.discard(token)
        self._tokens.discard(token)
        with self._keeper_wake:
            self._held.pop(token, None)
            self._keeper_wake.notify_all()
        with self._txn(owned=False) as db:
            self._exec(
                db,
                f"UPDATE {_LEASES} SET token = NULL, host = NULL, pid = NULL, start_time = NULL, expires = NULL, "
                "pid_scope = NULL "
                "WHERE session_id = ? AND token = ?",
                (sid, token),
            )

    def lock_held(self, header: dict[str, Any]) -> bool:
        """True if a live lease on the session exists (unexpired, holder not provably
        dead). Reads the lease file through a fresh read-only connection, not through
        ``faults``."""
        if not self.lease_path.exists():
            return False
        try:
            db = sqlite3.connect(f"{self.lease_path.as_uri()}?mode=ro", uri=True, timeout=5.0)
        except sqlite3.Error:
            return False
        try:
            columns = {r[1] for r in db.execute("PRAGMA table_info(leases)")}
            if not columns:
                return False  # no schema yet: nobody can hold a lease
            # A version-1 file not yet upgraded (no pid scope): its holders are remote.
            select = _LEASE_COLUMNS if "pid_scope" in columns else _LEASE_COLUMNS.replace("pid_scope", "NULL")
            row = db.execute(f"SELECT {select} FROM leases WHERE session_id = ?", (header["id"],)).fetchone()
        except sqlite3.Error:
            return False  # no schema yet: nobody can hold a lease
        finally:
            db.close()
        return row is not None and _lease_live(tuple(row), _now_ms())


# Tokens of leases this process holds (not released, not lost to a simulated crash):
# the exact liveness test for a lease whose holder is this very process.
_LIVE_TOKENS: set[str] = set()


class _LeaseRow(WriterLease):
    def __init__(self, backend: SqliteBackend, sid: str, token: str, fence: int) -> None:
        self._backend: SqliteBackend | None = backend
        self._renewer = backend
        self.session_id = sid
        self.token = token
        self.fence = fence

    def release(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            backend._release(self.session_id, self.token)

    def renew(self) -> None:
        self._renewer._renew(self)

    def __repr__(self) -> str:
        return f"<sqlite lease {self.session_id!r} fence {self.fence}>"


_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)


def _expect(cursor: sqlite3.Cursor, want: int, message: str) -> None:
    """A connection setting read back must be ``want`` (``message`` formats the value)."""
    row = cursor.fetchone()
    got = None if row is None else row[0]
    if got != want:
        raise StorageIOError(message.format(got))


# -- lease helpers ---------------------------------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)


def _lease_live(row: tuple[Any, ...], now: int) -> bool:
    _fence, token, host, pid, start, _since, expires, scope = row
    if token is None:
        return False  # released
    if expires is not None and expires <= now:
        return False
    return not holder_dead(socket.gethostname(), _LIVE_TOKENS, token, host, pid, start, scope)


def _holder(row: tuple[Any, ...]) -> dict[str, Any]:
    return {
        "pid": row[3],
        "host": row[2],
        "since": row[5],
        "startTime": row[4],
        "expires": row[6],
        "fence": row[0],
        "pidScope": row[7],
    }


def _describe(row: tuple[Any, ...]) -> str:
    return f"process {row[3]} on {row[2]}"



# -- the session row ---------------------------------------------------------------------------


def _session_params(sid: str, header: dict[str, Any]) -> tuple[Any, ...]:
    """The ``sessions`` row of a header (new incarnation). Keys the schema has no column
    for are not stored (as in the reference); an absent ``delegationDepth`` is stored
    as 0 (as the JSONL header line does). Raises :class:`RecordEncodingError`."""

    def get(key: str, kind: type, default: Any = None) -> Any:
        value = header.get(key, default)
        if value is not None and type(value) is not kind:
            raise RecordEncodingError(
                f'session "{sid}": the header cannot be stored: {key} must be {"an integer" if kind is int else "a string"}',
                session_id=sid,
            )
        return value

    version, created_at = get("version", int), get("createdAt", int)
    if version is None or created_at is None:
        raise RecordEncodingError(
            f'session "{sid}": the header cannot be stored: version and createdAt are required', session_id=sid
        )
    return (
        sid,
        version,
        created_at,
        get("cwd", str),
        get("parentSession", str),
        get("seedLength", int),
        get("origin", str),
        get("delegationDepth", int, 0),
        get("agentPreset", str),
        str(uuid.uuid4()),
    )


def _header(row: tuple[Any, ...]) -> dict[str, Any]:
    """The header of a ``sessions`` row (reference ``decodeSessionRow`` + ``rowToMeta``):
    NULL columns are absent keys. A row that breaks the column rules is corruption; a
    format version other than 0 is refused after that (as the coordinator's check)."""
    sid, version, created_at, cwd, parent, seed_length, origin, depth, preset, incarnation, revision = row

    def bad(why: str) -> SessionCorruptionError:
        return SessionCorruptionError(
            f'corrupt session log: stored session metadata of "{sid}" is invalid: {why}', session_id=str(sid)
        )

    def nonneg(v: Any) -> bool:
        return type(v) is int and 0 <= v <= 2**53 - 1

    if type(sid) is not str or not sid:
        raise bad("stored id must not be empty")
    if type(version) is not int or abs(version) > 2**53 - 1:
        raise bad("stored version must be a safe integer")
    if cwd is not None and (type(cwd) is not str or not _is_absolute(cwd)):
        raise bad("stored session cwd must be absolute")
    if parent is not None and type(parent) is not str:
        raise bad("stored parent_session must be a string or null")
    if origin is not None and origin != "subagent":
        raise bad("stored session origin must be subagent or null")
    if not is_uuid(incarnation):
        raise bad("stored session incarnation must be a UUID")
    if not nonneg(created_at):
        raise bad("stored created_at must be non-negative")
    if seed_length is not None and not nonneg(seed_length):
        raise bad("stored seed_length must be non-negative or null")
    if depth is not None and not nonneg(depth):
        raise bad("stored delegation_depth must be non-negative or null")
    if preset is not None and type(preset) is not str:
        raise bad("stored agent_preset must be a string or null")
    if not nonneg(revision):
        raise bad("stored revision must be non-negative")
    if version != SESSION_FORMAT_VERSION:
        raise format_error(sid, version)
    header: dict[str, Any] = {"version": version, "id": sid, "createdAt": created_at}
    for key, value in (
        ("cwd", cwd),
        ("parentSession", parent),
        ("seedLength", seed_length),
        ("origin", origin),
        ("delegationDepth", depth),
        ("agentPreset", preset),
    ):
        if value is not None:
            header[key] = value
    return header


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
