"""The SQLite backend's connection: its settings, the path checks, opening (the
reference's ``openDatabase`` sequence: pragmas read back, identity checks, a pristine
database's schema, the journal mode, the attached lease file), the statement hook for
fault injection, transactions (and the ownership re-check before a write), a simulated
crash, closing. The base of :class:`~harness.persistence._sqlite.SqliteBackend`.

All methods block: call them from a worker thread."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from harness.errors import (
    PersistenceArgumentError,
    SqliteSchemaError,
    StorageCorruptionError,
    StorageIOError,
)
from harness.persistence._files import OsFiles, SimulatedCrash
from harness.persistence._sqlite_lease_row import _LIVE_TOKENS, _LeaseRow
from harness.persistence._sqlite_schema import (
    LEASE_SCHEMA,
    check_companions,
    check_database,
    check_directory,
    check_file,
    check_file_header,
    check_for_mutation,
    check_lease_file,
    check_objects,
    initialize,
    lease_path,
    read_store_id,
)

log = logging.getLogger("harness.persistence")

DEFAULT_LEASE_TTL: Final = 30.0
#: The reference's default wait for another connection's lock, and SQLite's largest.
DEFAULT_BUSY_TIMEOUT_MS: Final = 5_000
MAX_BUSY_TIMEOUT_MS: Final = 2_147_483_647
JournalMode = Literal["wal", "delete", "truncate", "persist"]
#: The durable journal modes the reference accepts (``journalMode``; default ``wal``).
JOURNAL_MODES: Final = ("wal", "delete", "truncate", "persist")
_JOURNAL_BUSY_RETRY: Final = 0.010  # seconds between journal-mode attempts on SQLITE_BUSY
PageCheck = Literal["quick", "integrity", "none"]
#: What opening a connection checks of each file's pages before anything is written
#: (``SqliteBackend(check=)``): ``PRAGMA quick_check`` (the default), ``PRAGMA
#: integrity_check`` (also every index against its table), or nothing.
PAGE_CHECKS: Final = ("quick", "integrity", "none")
#: The most problems a page check reports (SQLite stops looking after that many).
CHECK_LINES: Final = 10


class StatementFaults(Protocol):
    """What the backend calls before every statement (``harness.faults.SqliteFaults``)."""

    def before(self, sql: str) -> None: ...


class SqliteConnection:
    """The connection and transactions of a :class:`~harness.persistence._sqlite.SqliteBackend`
    (its parameters are documented there). Blocking; one connection, serialised by a lock."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        journal_mode: JournalMode = "wal",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        check: PageCheck = "quick",
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
        if check not in PAGE_CHECKS:
            raise PersistenceArgumentError(f"SQLite check must be one of {', '.join(PAGE_CHECKS)}, got {check!r}")
        # Lexically absolute, as the reference's path.resolve: Path.resolve() would follow
        # a symbolic link to the database (or its directory) instead of refusing it.
        self.path = Path(os.path.abspath(os.fspath(path)))
        self.lease_path = lease_path(self.path)
        self.lease_ttl = lease_ttl
        self.journal_mode: JournalMode = journal_mode
        self.busy_timeout_ms = busy_timeout_ms
        self.check: PageCheck = check
        self.faults = faults
        self.files = files or OsFiles()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._identity = ""  # "file:<dev>:<ino>:<birth>:store:<store id>" of the open database
        self._store_id = ""
        self._cookie: int | None = None  # schema_version at the last ownership check that passed
        # ``PRAGMA data_version`` when that check passed (None: not on this connection):
        # unchanged, no other connection has committed to the database since.
        self._checked_version: int | None = None
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
            if isinstance(exc, SqliteSchemaError | StorageCorruptionError):
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
        self._checked_version = None  # data_version is per connection
        self._db = db
        return db

    def _open(self, db: sqlite3.Connection) -> None:
        """The reference's opening sequence (``openDatabase``): connection security
        (``trusted_schema=OFF``, ``mmap_size=0``, each read back), this port's page check
        (:meth:`_check_pages`), identity checks and a pristine database's schema in one
        ``BEGIN IMMEDIATE``, the journal mode (retried every 10 ms while SQLite answers
        busy, until ``busy_timeout_ms`` after the start), ``synchronous=FULL`` (read
        back); then the lease file, the same way (its page check right after it is
        attached)."""
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        with _corruption_of(self.path, "session database"):
            self._open_main(db, deadline)
        with _corruption_of(self.lease_path, "lease file"):
            self._open_lease(db, deadline)

    def _open_main(self, db: sqlite3.Connection, deadline: float) -> None:
        ex = self._exec
        where = f'session database at "{self.path}"'
        ex(db, "PRAGMA trusted_schema=OFF")
        _expect(ex(db, "PRAGMA trusted_schema"), 0, f"{where} retained trusted_schema={{}}, expected 0")
        ex(db, "PRAGMA mmap_size=0")
        _expect(ex(db, "PRAGMA mmap_size"), 0, f"{where} retained mmap_size={{}}, expected 0")
        ex(db, "PRAGMA foreign_keys=ON")
        # Before the first statement that can write (a pristine database's schema): a
        # damaged page is not always noticed by the statements that write next to it
        # (a damaged index page took acknowledged rows in and then did not return them).
        self._check_pages(db, "main", self.path, "session database")

        def exec_(sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
            return ex(db, sql, params)

        self._in_txn(db, lambda: self._check_main(exec_), before_attach=True)
        self._select_journal_mode(db, "", where, deadline)
        ex(db, "PRAGMA synchronous=FULL")
        _expect(ex(db, "PRAGMA synchronous"), 2, f"{where} retained synchronous={{}}, expected FULL (2)")

    def _open_lease(self, db: sqlite3.Connection, deadline: float) -> None:
        ex = self._exec

        def exec_(sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
            return ex(db, sql, params)

        try:
            self._create_file(self.lease_path, "lease file")
        except OSError as exc:
            raise StorageIOError(f"creating lease file {self.lease_path} failed: {exc}") from exc
        ex(db, f"ATTACH DATABASE ? AS {LEASE_SCHEMA}", (str(self.lease_path),))
        self._check_pages(db, LEASE_SCHEMA, self.lease_path, "lease file")
        lease_where = f'lease file at "{self.lease_path}"'
        self._select_journal_mode(db, f"{LEASE_SCHEMA}.", lease_where, deadline)
        ex(db, f"PRAGMA {LEASE_SCHEMA}.synchronous=FULL")
        _expect(
            ex(db, f"PRAGMA {LEASE_SCHEMA}.synchronous"), 2, f"{lease_where} retained synchronous={{}}, expected FULL (2)"
        )
        self._in_txn(db, lambda: check_lease_file(exec_, self.lease_path, self._store_id))

    def _check_pages(self, db: sqlite3.Connection, schema: str, path: Path, what: str) -> None:
        """``PRAGMA <schema>.quick_check`` (``check="integrity"``: ``integrity_check``;
        ``"none"``: nothing): SQLite reads every page of the file and checks its
        structure (cell and free-space accounting, b-tree order, record formats, NOT
        NULL and CHECK constraints; ``integrity_check`` also checks every index against
        its table). It runs in a read transaction of its own, not in the opening
        ``BEGIN IMMEDIATE``, so another process's writer is not held up by it in WAL
        mode. Anything but ``ok`` refuses the file with
        :class:`~harness.errors.StorageCorruptionError` (nothing was written yet).
        Its cost is one read of the whole file (docs/decisions/0016)."""
        if self.check == "none":
            return
        pragma = "quick_check" if self.check == "quick" else "integrity_check"
        try:
            rows = self._exec(db, f"PRAGMA {schema}.{pragma}({CHECK_LINES})").fetchall()
        except UnicodeDecodeError as exc:  # a later row's text (as in ``_exec``)
            raise sqlite3.DatabaseError(f"database disk image is malformed: {exc}") from exc
        findings = tuple(str(r[0]) for r in rows)
        if findings != ("ok",):
            raise corruption_error(path, what, findings, f"PRAGMA {pragma}", at_open=True)

    def db_error(self, exc: sqlite3.Error, what: str = "", session_id: str | None = None) -> StorageIOError:
        """The typed error for a ``sqlite3`` error of a statement on this database:
        :class:`~harness.errors.StorageCorruptionError` if SQLite reported damage
        (:func:`is_corrupt`), else :class:`~harness.errors.StorageIOError`.
        ``what`` prefixes SQLite's message (e.g. ``"commit failed: "``)."""
        if is_corrupt(exc):
            return corruption_error(
                self.path, "session database", (str(exc),), "SQLite", at_open=False, session_id=session_id
            )
        return StorageIOError(f"session database {self.path}: {what}{exc}", session_id=session_id)

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

    def _in_txn(self, db: sqlite3.Connection, body: Any, *, before_attach: bool = False) -> None:
        """``body`` in one ``BEGIN IMMEDIATE`` transaction, committed (rolled back on
        any exception).

        ``before_attach``: the lease file is not attached yet. SQLite compiles
        ``BEGIN IMMEDIATE`` into one write-lock step per database attached *when the
        statement is prepared*, and ``sqlite3`` keeps prepared statements in a cache
        keyed by their text: a ``BEGIN IMMEDIATE`` prepared before the ``ATTACH`` would
        be reused by every later transaction on the connection and lock the database
        but not the lease file. A transaction that then wrote the lease file after
        reading it could not wait for the lock (SQLite answers ``database is locked``
        at once rather than risk a deadlock: seen with 8 processes on one file), and
        the lease check would not be in the write's critical section. So this one is
        run through ``executescript``, which prepares it afresh and caches nothing."""
        if before_attach:
            self._hook("BEGIN IMMEDIATE")
            db.executescript("BEGIN IMMEDIATE")
        else:
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
                raise self.db_error(exc) from exc
            except SimulatedCrash:
                self._die()
                raise
            try:
                if immediate and owned:
                    self._check_ownership(db)
                yield db
            except SimulatedCrash:
                self._die()
                raise
            except sqlite3.Error as exc:
                self._rollback(db)
                raise self.db_error(exc) from exc
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
                raise self.db_error(exc, "commit failed: ") from exc
            finally:
                pending = self._pending_tails
                self._pending_tails = {}
            if not db.in_transaction:  # committed: the tails it left are the stored ones
                self._tails.update(pending)

    def _check_ownership(self, db: sqlite3.Connection) -> None:
        """Inside a write transaction (its write lock held, so its snapshot is the
        latest): the database is still ours (:func:`check_for_mutation`, the
        reference's re-validation before every mutation) -- unless no other connection
        committed to it since the last check that passed on this connection, which
        ``PRAGMA data_version`` tells (it moves exactly when another connection, of
        any process, commits; this connection's own commits do not move it, and this
        connection changes no header field or schema object after opening). Then the
        header fields and the schema cannot have changed, and the check (three pragma
        table functions, each re-preparing a ``PRAGMA`` statement: ~8 us of the
        writer thread hot, ~40 us cold, per transaction; decision 0019) is skipped."""
        row = self._exec(db, "PRAGMA data_version").fetchone()
        version = None if row is None else row[0]
        if version is not None and version == self._checked_version:
            return
        self._checked_version = None
        self._cookie = check_for_mutation(
            lambda sql, params=(): self._exec(db, sql, params), self.path, self._cookie
        )
        self._checked_version = version

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


_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)


def is_corrupt(exc: BaseException) -> bool:
    """SQLite reported damage: ``SQLITE_CORRUPT`` (any extended code of it), or its
    wording for it where no code is attached (a text that is not UTF-8 in a damaged
    page, translated by ``_exec``)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF == sqlite3.SQLITE_CORRUPT
    text = str(exc)
    return "database disk image is malformed" in text or "malformed database schema" in text


def corruption_error(
    path: Path,
    what: str,
    findings: tuple[str, ...],
    found_by: str,
    *,
    at_open: bool,
    session_id: str | None = None,
) -> StorageCorruptionError:
    """The refusal of a damaged file: what the check (``found_by``: the pragma) or a
    statement (``"SQLite"``) found, what became of the write (``at_open``: nothing was
    written; later: the failed statement's transaction rolled back), how to recover."""
    shown = "; ".join(" ".join(f.split()) for f in findings[:3]) + (" ..." if len(findings) > 3 else "")
    if at_open:
        outcome = "refused when opened, before anything was written to it"
    else:
        outcome = "the transaction was rolled back, nothing of it acknowledged"
    if what == "lease file":
        advice = (
            "it holds only writer leases: with no writer running on the database, delete it "
            "(and its -wal and -shm files) and it is created again"
        )
    else:
        advice = (
            "restore a backup, or salvage what is readable into a new file and open that "
            f'(sqlite3 "{path}" .dump | sqlite3 NEW_FILE, then set its application_id and user_version: '
            'docs/persistence.md, "A damaged database file")'
        )
    return StorageCorruptionError(
        f'{what} "{path}" is damaged ({found_by} found: {shown}); {outcome}. To go on, {advice}',
        path=path,
        findings=findings,
        session_id=session_id,
    )


@contextmanager
def _corruption_of(path: Path, what: str) -> Iterator[None]:
    """While opening ``path``: SQLite's report of damage from any statement (the page
    check raises it itself for some damage) refuses that file, typed."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if is_corrupt(exc):
            raise corruption_error(path, what, (str(exc),), "SQLite", at_open=True) from exc
        raise


def _expect(cursor: sqlite3.Cursor, want: int, message: str) -> None:
    """A connection setting read back must be ``want`` (``message`` formats the value)."""
    row = cursor.fetchone()
    got = None if row is None else row[0]
    if got != want:
        raise StorageIOError(message.format(got))
