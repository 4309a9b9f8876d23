"""The SQLite backend (stdlib ``sqlite3``), behind the same protocol as JSONL (reference §3).

WAL journal, ``synchronous=FULL``, one ``BEGIN IMMEDIATE`` transaction per batch (so a
batch lands whole or not at all, and there are no torn tails), and a storage-level
stale-writer check: a batch must start at the stored next seq.

One live writer per session: a *lease* row per session naming its holder (host, pid,
the pid's start time, a random token), with an expiry (``lease_ttl``) and a *fence*: an
integer that grows with every acquisition. A lease is renewed by every write through
it, by :meth:`WriterLease.renew`, and, while its holder is idle, every ``lease_ttl / 3``
seconds by a daemon thread of the backend (wall-clock time, independent of Trio; it
runs only while the backend has leases out). Every write checks, in its own transaction, that the caller's lease is
still the current one (token and fence) and renews it; a writer whose lease was taken
over gets :class:`LeaseLostError` and nothing of its batch lands. A lease can be taken
over when it expired, or when its holder is provably dead: same host and its pid is
gone, or the pid now belongs to a process with another start time (a reused pid).
A live lease on another host is respected until it expires.

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
from typing import Any, Final, Protocol

import orjson

from harness.errors import (
    LeaseLostError,
    PersistedSessionNotFoundError,
    RecordEncodingError,
    SessionCorruptionError,
    SessionLockedError,
    SessionLogExistsError,
    StorageIOError,
)
from harness.persistence._backend import StoredLog, WriterLease, check_header_record, header_record
from harness.persistence._files import OsFiles, SimulatedCrash

log = logging.getLogger("harness.persistence")

APPLICATION_ID: Final = 0x54484E53  # "THNS"
SCHEMA_VERSION: Final = 2  # v2: lease holder identity, expiry and fence (v1 is migrated in place)
DEFAULT_LEASE_TTL: Final = 30.0

_LEASES_V2 = """
CREATE TABLE leases (
    session_id TEXT PRIMARY KEY,
    fence INTEGER NOT NULL,
    token TEXT,
    host TEXT,
    pid INTEGER,
    start_time INTEGER,
    since INTEGER,
    expires INTEGER
) STRICT
"""

_SCHEMA = f"""
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
{_LEASES_V2}
"""

_LEASE_COLUMNS = "fence, token, host, pid, start_time, since, expires"


class StatementFaults(Protocol):
    """What the backend calls before every statement (``harness.faults.SqliteFaults``)."""

    def before(self, sql: str) -> None: ...


class SqliteBackend:
    """Sessions in one SQLite database file. Blocking; one connection, serialised by a
    lock (thread-safe).

    ``lease_ttl``: seconds a writer lease stays valid without a write or a renewal.
    ``faults``: a statement hook for fault injection (see ``harness.faults``).
    ``files``: the file layer for the backend's own file operations (creating the
    database's directory and the file itself, mode 0600).
    """

    name = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        faults: StatementFaults | None = None,
        files: OsFiles | None = None,
    ) -> None:
        if not lease_ttl > 0:
            raise ValueError(f"lease_ttl must be positive, got {lease_ttl!r}")
        self.path = Path(path).resolve()
        self.lease_ttl = lease_ttl
        self.faults = faults
        self.files = files or OsFiles()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._tokens: set[str] = set()  # lease tokens this instance handed out
        # Idle renewal: the leases this instance holds, renewed by a daemon thread.
        self._held: dict[str, _LeaseRow] = {}  # token -> lease
        self._keeper: threading.Thread | None = None
        self._keeper_wake = threading.Condition()
        self._quiet = threading.local()  # set on the keeper thread: bypass ``faults``

    # -- statements ------------------------------------------------------------------------

    def _hook(self, sql: str) -> None:
        # Idle renewals are timing-dependent: counting them would make a scenario's
        # statement numbers (and so its fault points) differ from run to run.
        if self.faults is not None and not getattr(self._quiet, "on", False):
            self.faults.before(sql)

    def _exec(self, db: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        self._hook(sql)
        return db.execute(sql, params)

    def _execmany(self, db: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self._hook(sql)
        db.executemany(sql, rows)

    # -- connection ------------------------------------------------------------------------

    def _create_file(self) -> None:
        """Create the database's directories (fsynced) and the file itself (0600)
        through the file layer; SQLite would create the file world-readable."""
        missing = []
        p = self.path.parent
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                self.files.mkdir(str(d), 0o700)
            self.files.fsync_dir(str(d.parent))
        if not self.path.exists():
            try:
                fd = self.files.open(str(self.path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                return
            self.files.close(fd)
            self.files.fsync_dir(str(self.path.parent))

    def _conn(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        try:
            self._create_file()
        except OSError as exc:
            raise StorageIOError(f"creating session database {self.path} failed: {exc}") from exc
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
        except sqlite3.Error as exc:
            raise StorageIOError(f"opening session database {self.path} failed: {exc}") from exc
        try:
            self._exec(db, "PRAGMA foreign_keys=ON")
            self._exec(db, "PRAGMA trusted_schema=OFF")
            self._exec(db, "PRAGMA journal_mode=WAL")
            self._exec(db, "PRAGMA synchronous=FULL")
            self._exec(db, "BEGIN IMMEDIATE")
            try:
                self._init_schema(db)
                self._exec(db, "COMMIT")
            except BaseException:
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")  # direct: also after a simulated crash
                raise
        except BaseException as exc:
            db.close()
            if isinstance(exc, sqlite3.Error):
                raise StorageIOError(f"opening session database {self.path} failed: {exc}") from exc
            raise
        self._db = db
        return db

    def _init_schema(self, db: sqlite3.Connection) -> None:
        app_id = self._exec(db, "PRAGMA application_id").fetchone()[0]
        version = self._exec(db, "PRAGMA user_version").fetchone()[0]
        tables = self._exec(db, "SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app_id == 0 and version == 0 and tables == 0:
            # executescript() would COMMIT first: create table by table instead.
            for statement in filter(str.strip, _SCHEMA.split(";")):
                self._exec(db, statement)
            self._exec(db, f"PRAGMA application_id={APPLICATION_ID}")
            self._exec(db, f"PRAGMA user_version={SCHEMA_VERSION}")
        elif app_id == APPLICATION_ID and version == 1:
            self._migrate_v1(db)
        elif app_id != APPLICATION_ID or version != SCHEMA_VERSION:
            raise StorageIOError(
                f"session database {self.path} has application id {app_id:#x} and schema version "
                f"{version}, incompatible with this build ({APPLICATION_ID:#x}, {SCHEMA_VERSION})"
            )

    def _migrate_v1(self, db: sqlite3.Connection) -> None:
        """v1 leases named (token, pid, host, since) only: keep each as an unexpired
        lease of one TTL from its start, with fence 1 and an unknown start time. Runs
        inside the opening ``BEGIN IMMEDIATE``: all or nothing."""
        self._exec(db, "ALTER TABLE leases RENAME TO leases_v1")
        self._exec(db, _LEASES_V2)
        self._exec(
            db,
            "INSERT INTO leases (session_id, fence, token, host, pid, start_time, since, expires) "
            "SELECT session_id, 1, token, host, pid, NULL, since, since + ? FROM leases_v1",
            (int(self.lease_ttl * 1000),),
        )
        self._exec(db, "DROP TABLE leases_v1")
        self._exec(db, f"PRAGMA user_version={SCHEMA_VERSION}")

    def _die(self) -> None:
        """A simulated crash: drop the connection (SQLite rolls the open transaction
        back, as after process death) and forget this instance's leases as live."""
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
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
    def _txn(self, immediate: bool = True) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                db = self._conn()
                self._exec(db, "BEGIN IMMEDIATE" if immediate else "BEGIN")
            except sqlite3.Error as exc:
                raise StorageIOError(f"session database {self.path}: {exc}") from exc
            except SimulatedCrash:
                self._die()
                raise
            try:
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

    def close(self) -> None:
        """Close the connection and stop idle renewals (leases still out stay in the
        database until they expire or a later write through them renews them)."""
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

    def list_headers(self) -> list[dict[str, Any]]:
        with self._txn(immediate=False) as db:
            rows = self._exec(db, "SELECT id, header FROM sessions ORDER BY id").fetchall()
        return [check_header_record(_loads(sid, h), None) for (sid, h) in rows]

    def load(self, session_id: str) -> StoredLog:
        with self._txn(immediate=False) as db:
            row = self._exec(
                db, "SELECT header, incarnation, revision FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if row is None:
                raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
            lines = self._exec(
                db, "SELECT seq, record FROM events WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
        header = check_header_record(_loads(session_id, row[0]), session_id)
        records = []
        for i, (seq, record) in enumerate(lines):
            if seq != i:
                raise SessionCorruptionError(
                    f"corrupt session log: invalid committed physical row at seq {seq}", session_id=session_id
                )
            records.append(_loads(session_id, record))
        return StoredLog(header, records, None, f"sqlite:{row[1]}:{row[2]}")

    def revision(self, session_id: str) -> str | None:
        with self._txn(immediate=False) as db:
            row = self._exec(
                db, "SELECT incarnation, revision FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        return None if row is None else f"sqlite:{row[0]}:{row[1]}"

    # -- writing ---------------------------------------------------------------------------

    def materialize(
        self, header: dict[str, Any], records: list[dict[str, Any]], *, lease: WriterLease | None = None
    ) -> None:
        sid = header["id"]
        rows = _rows(sid, records)
        head = _dumps(sid, header_record(header))
        with self._txn() as db:
            self._check_lease(db, sid, lease, len(records))
            if self._exec(db, "SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
                raise SessionLogExistsError(
                    f'refusing to materialize "{sid}": a log already exists on disk (load/resume it instead)',
                    session_id=sid,
                )
            self._exec(
                db,
                "INSERT INTO sessions (id, header, incarnation, revision) VALUES (?, ?, ?, 0)",
                (sid, head, str(uuid.uuid4())),
            )
            self._insert(db, sid, rows, 0)

    def _insert(self, db: sqlite3.Connection, sid: str, rows: list[tuple[Any, ...]], next_seq: int) -> None:
        if rows and rows[0][1] != next_seq:
            raise SessionCorruptionError(
                f"session {sid} append starts at seq {rows[0][1]}, stored next seq is {next_seq}",
                session_id=sid,
            )
        self._execmany(db, "INSERT INTO events (session_id, seq, type, record) VALUES (?, ?, ?, ?)", rows)
        self._exec(db, "UPDATE sessions SET revision = revision + 1 WHERE id = ?", (sid,))

    def _next_seq(self, db: sqlite3.Connection, sid: str) -> int:
        if not self._exec(db, "SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
            raise PersistedSessionNotFoundError(f'session "{sid}" not found', session_id=sid)
        (n,) = self._exec(
            db, "SELECT coalesce(max(seq) + 1, 0) FROM events WHERE session_id = ?", (sid,)
        ).fetchone()
        return int(n)

    def append(self, session_id: str, records: list[dict[str, Any]], *, lease: WriterLease | None = None) -> None:
        """Append one batch in one transaction that also checks (and renews) the
        caller's lease: a lost lease raises :class:`LeaseLostError`, nothing lands."""
        if not records:
            return
        rows = _rows(session_id, records)
        with self._txn() as db:
            self._check_lease(db, session_id, lease, len(records))
            self._insert(db, session_id, rows, self._next_seq(db, session_id))

    def commit_repair(
        self,
        session_id: str,
        truncate_to: int | None,
        records: list[dict[str, Any]],
        *,
        lease: WriterLease | None = None,
    ) -> None:
        # Transactions leave no torn tails: there is never anything to truncate.
        self.append(session_id, records, lease=lease)

    def delete(self, session_id: str) -> None:
        with self._txn() as db:
            if not self._exec(db, "DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount:
                raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)

    # -- one writer per session ----------------------------------------------------------

    def _lease_row(self, db: sqlite3.Connection, sid: str) -> tuple[Any, ...] | None:
        row = self._exec(db, f"SELECT {_LEASE_COLUMNS} FROM leases WHERE session_id = ?", (sid,)).fetchone()
        return None if row is None else tuple(row)

    def _check_lease(self, db: sqlite3.Connection, sid: str, lease: WriterLease | None, n: int) -> None:
        """Inside a write transaction: the caller's lease must be the current one (it is
        renewed); a caller without a lease may write only while nobody holds one."""
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
        self._exec(
            db,
            "UPDATE leases SET expires = ? WHERE session_id = ?",
            (now + int(self.lease_ttl * 1000), sid),
        )

    def acquire_writer(self, header: dict[str, Any]) -> WriterLease:
        """Take the session's lease at once (a fresh fence), or raise
        :class:`SessionLockedError` naming a live holder."""
        sid = header["id"]
        token = secrets.token_hex(8)
        host, pid, start = _identity()
        now = _now_ms()
        with self._txn() as db:
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
                "INSERT OR REPLACE INTO leases (session_id, fence, token, host, pid, start_time, since, expires) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (sid, fence, token, host, pid, start, now, now + int(self.lease_ttl * 1000)),
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
        with self._txn() as db:
            self._check_lease(db, lease.session_id, lease, 0)

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
                    log.warning("sqlite: %s", exc)
                    with self._keeper_wake:
                        self._held.pop(lease.token, None)
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
        with self._txn() as db:
            self._exec(
                db,
                "UPDATE leases SET token = NULL, host = NULL, pid = NULL, start_time = NULL, expires = NULL "
                "WHERE session_id = ? AND token = ?",
                (sid, token),
            )

    def lock_held(self, header: dict[str, Any]) -> bool:
        """True if a live lease on the session exists (unexpired, holder not provably
        dead). Reads through a fresh read-only connection, not through ``faults``."""
        if not self.path.exists():
            return False
        try:
            db = sqlite3.connect(f"{self.path.as_uri()}?mode=ro", uri=True, timeout=5.0)
        except sqlite3.Error:
            return False
        try:
            row = db.execute(f"SELECT {_LEASE_COLUMNS} FROM leases WHERE session_id = ?", (header["id"],)).fetchone()
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


# -- lease helpers ---------------------------------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` (``/proc/<pid>/stat`` field 22, clock ticks after
    boot), or ``None`` where that is unavailable (not Linux, no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        # Field 2 (comm) may hold spaces and parentheses: split after the last ")".
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


_SELF_START: int | None = None


def _identity() -> tuple[str, int, int | None]:
    global _SELF_START
    if _SELF_START is None:
        _SELF_START = process_start_time(os.getpid())
    return socket.gethostname(), os.getpid(), _SELF_START


def _holder_dead(token: str, host: str | None, pid: int | None, start: int | None) -> bool:
    """Provably dead: only decidable on this host."""
    my_host, my_pid, my_start = _identity()
    if host != my_host or pid is None:
        return False
    if pid == my_pid and (start is None or start == my_start):
        return token not in _LIVE_TOKENS  # this process: exact knowledge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # exists, owned by someone else
    if start is None:
        return False
    current = process_start_time(pid)
    return current is not None and current != start  # the pid was reused


def _lease_live(row: tuple[Any, ...], now: int) -> bool:
    _fence, token, host, pid, start, _since, expires = row
    if token is None:
        return False  # released
    if expires is not None and expires <= now:
        return False
    return not _holder_dead(token, host, pid, start)


def _holder(row: tuple[Any, ...]) -> dict[str, Any]:
    return {"pid": row[3], "host": row[2], "since": row[5], "startTime": row[4], "expires": row[6], "fence": row[0]}


def _describe(row: tuple[Any, ...]) -> str:
    return f"process {row[3]} on {row[2]}"


# -- encoding --------------------------------------------------------------------------------


def _dumps(sid: str, obj: Any) -> str:
    try:
        return orjson.dumps(obj).decode()
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        seq = obj.get("seq") if isinstance(obj, dict) else None
        raise RecordEncodingError(
            f'session "{sid}": event seq {seq} cannot be stored: {exc}', session_id=sid
        ) from exc


def _rows(sid: str, records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Encode before any transaction: an unencodable record fails the batch up front."""
    return [(sid, r["seq"], r["type"], _dumps(sid, r)) for r in records]


def _loads(sid: str, text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise SessionCorruptionError(f"corrupt session log: a stored row is not JSON: {exc}", session_id=sid) from exc
