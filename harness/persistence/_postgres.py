"""The PostgreSQL backend (psycopg 3, sync API, a ``psycopg_pool`` connection pool),
behind the same protocol and contract suite as JSONL and SQLite. See ``docs/postgres.md``.

Driver choice: the :class:`~harness.persistence.Backend` protocol is blocking and the
coordinator already runs every call on a worker thread (shielded, bounded, never
abandoned half-way), so this backend uses psycopg's *sync* API from those threads —
no second event loop, no thread bridge. A pool hands each call its own connection.

Every call is one transaction on one pooled connection (``BEGIN`` … ``COMMIT``), ended
before the call returns: on any failure the backend rolls back, and if the
connection's state is unknown (the rollback failed, the server went away, or a
``BaseException`` such as :class:`SimulatedCrash` interrupted it) it closes the
connection, which the pool then discards. So an interrupted or abandoned call never
leaves a transaction open or a poisoned connection in the pool, and the server-side
``idle_in_transaction_session_timeout`` ends a transaction whose process stopped
(SIGSTOP) holding row locks. Connections are checked when taken from the pool, so the
first call after a server restart already gets a fresh one.

Writes: one transaction per batch that locks the lease row and then the session row
(``FOR UPDATE``: a takeover waits for a write in flight, and a write after a takeover
sees it), checks the caller's lease (token and fence) and renews it, checks that the
batch continues the stored log, and inserts the packed rows with ``COPY``. A writer
whose lease was taken over gets :class:`LeaseLostError` and nothing of its batch
lands. A batch retried after a commit whose outcome was unknown (the connection died
during ``COMMIT``) is recognised: the part already stored is skipped, the rest lands.
So is a first write (``materialize``) retried that way: its session row carries the
incarnation that very write generated (remembered while the commit is in doubt), its
header and the head of the retried batch; anything else is still refused.

psycopg and pool errors never escape: they become :class:`StorageIOError` naming the
session (the original chained as the cause).

Modules: connections and transactions :mod:`._postgres_conn`; the schema and its checks
:mod:`._postgres_schema`; lease rows :mod:`._postgres_lease_table`; the lease handle,
holder liveness and the keeper thread :mod:`._postgres_lease`; this module, the rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Final

import attrs
import orjson
import psycopg
from psycopg import Connection

from harness.errors import (
    PersistedSessionNotFoundError,
    SessionCorruptionError,
    SessionLogExistsError,
    StorageIOError,
)
from harness.persistence._backend import (
    GroupWrite,
    StoredLog,
    WriterLease,
    check_header_record,
    header_record,
)
from harness.persistence._postgres_conn import READ, PgConnections, StatementFaults
from harness.persistence._postgres_lease import LeaseKeeper, identity
from harness.persistence._postgres_lease_table import LeaseTable
from harness.persistence._postgres_schema import DEFAULT_SCHEMA, check_name
from harness.persistence._sql_group import copy_error
from harness.persistence._sqlite_rows import (
    MAX_MEMBERS,
    PACKED,
    Row,
    bind_records,
    covers,
    fetch_batches,
    next_seq_of_tail,
    scan_batches,
)
from harness.session import gc_paused

__all__ = ["DEFAULT_LEASE_TTL", "PostgresBackend", "StatementFaults"]

DEFAULT_LEASE_TTL: Final = 30.0

_COLUMNS = "seq, type, time, data, data_z, source_event_seqs, surface_op, ignorable"
# The tail's columns as the locking tail query (:meth:`PostgresBackend._next_seq`) selects them.
_TAIL_COLUMNS = ", ".join(f"t.{c}" for c in _COLUMNS.split(", "))
_COPY_COLUMNS = "session_id, seq, type, time, data, data_z, source_event_seqs, surface_op, ignorable"
_CHUNK_TAGS_SQL = "('text-chunks', 'reasoning-chunks', 'tool-call-chunks')"


def _row(values: Sequence[Any]) -> Row:
    """A stored row as :mod:`~harness.persistence._sqlite_rows` reads it: the two data
    columns (text, or a Zstandard frame) folded into one."""
    seq, type_, time_, data, data_z, seqs, op, ignorable = values
    return (seq, type_, time_, data_z if data is None else data, seqs, op, ignorable)


def _row_factory(_cursor: Any) -> Any:
    return _row


def _copy_row(bound: tuple[Any, ...]) -> tuple[Any, ...]:
    sid, seq, type_, time_, data, seqs, op, ignorable = bound
    text = isinstance(data, str)
    return (sid, seq, type_, time_, data if text else None, None if text else data, seqs, op, ignorable)


class PostgresBackend:
    """Sessions in a PostgreSQL schema (namespace). Blocking and thread-safe.

    ``url``: a libpq connection string or ``postgresql://`` URL. ``schema``: the
    namespace this backend owns (created on first use). ``lease_ttl``: seconds a writer
    lease stays valid without a write or a renewal; the keeper renews held leases
    every ``lease_ttl / 3``. ``host``: the holder's host name in lease rows (default
    the machine's; a distinct name makes this backend a separate "host"). ``pool_size``
    and ``pool_timeout`` size the pool and bound the wait for a connection. Nothing
    connects at construction; the first use connects once directly before opening the
    pool, so a server that cannot be reached is a
    :class:`~harness.errors.StorageIOError` at once, with the driver's reason
    (``Connection refused``, a bad password), not after ``pool_timeout``; that first
    use is tried again by the next call.
    ``faults``: a statement hook for fault injection. ``create=False``: refuse a schema
    that does not exist yet instead of creating it. ``idle_timeout``: seconds the server
    lets a transaction of this backend sit idle (a stopped process holding row locks)
    before ending it; default ``max(10, 2 * lease_ttl)``. Call :meth:`close` when done.
    """

    name = "postgres"

    def __init__(
        self,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        host: str | None = None,
        pool_size: int = 4,
        pool_timeout: float = 30.0,
        application_name: str = "trio-harness",
        faults: StatementFaults | None = None,
        create: bool = True,
        idle_timeout: float | None = None,
    ) -> None:
        if not lease_ttl > 0:
            raise ValueError(f"lease_ttl must be positive, got {lease_ttl!r}")
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size!r}")
        self.url = url
        self.schema = check_name(schema)
        self.lease_ttl = lease_ttl
        self.host = identity(host)[0]
        self.faults = faults
        ttl_ms = int(lease_ttl * 1000)
        # A transaction left idle by a stopped process (SIGSTOP) must not hold the lease
        # and session rows forever: the server ends it. Past the lease TTL its lease may
        # be taken over anyway; the floor leaves room for a long repair scan.
        if idle_timeout is not None and not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be positive, got {idle_timeout!r}")
        idle_ms = max(10_000, 2 * ttl_ms) if idle_timeout is None else int(idle_timeout * 1000)
        self._db = PgConnections(
            url,
            self.schema,
            idle_ms=idle_ms,
            pool_size=pool_size,
            pool_timeout=pool_timeout,
            application_name=application_name,
            faults=faults,
            create=create,
            on_crash=self._die,
        )
        self._leases = LeaseTable(self._db, self.host, ttl_ms)
        # sid -> (incarnation, header text) of a first write (materialize) whose COMMIT
        # outcome is unknown: its retry recognises the session it created itself.
        self._in_doubt: dict[str, tuple[str, str]] = {}

    def __repr__(self) -> str:
        return f"<PostgresBackend schema={self.schema!r}>"

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> PostgresBackend:
        """A backend for ``postgresql://…[#schema]``: the fragment, if any, names the
        schema (libpq never sees it); ``kw`` as for the constructor."""
        base, _, fragment = url.partition("#")
        if fragment:
            kw.setdefault("schema", fragment)
        return cls(base, **kw)

    def _die(self) -> None:
        """A simulated crash (:class:`SimulatedCrash` through ``faults``): this
        "process" is dead; its leases are no longer vouched for nor renewed (their
        rows stay, as after a real death) and it forgets its in-doubt first writes."""
        self._leases.forget()
        self._in_doubt.clear()

    def close(self) -> None:
        """Stop lease renewals and close the pool (its connections close; a lease still
        held stays in its row until it expires or a write through it renews it)."""
        self._leases.keeper.stop()
        self._db.close()

    # -- the protocol's lease calls ---------------------------------------------------

    def acquire_writer(self, header: dict[str, Any]) -> WriterLease:
        """Take the session's lease now, with a fence above every earlier one, or raise
        :class:`SessionLockedError` naming the live holder. An expired lease, or one
        whose holder is provably dead, is taken over."""
        return self._leases.acquire(header)

    def lock_held(self, header: dict[str, Any]) -> bool:
        """True if a live lease on the session exists (unexpired, holder not provably
        dead). Reads without locking, not through ``faults``."""
        return self._leases.held(header)

    @property
    def _keeper(self) -> LeaseKeeper:
        return self._leases.keeper

    # -- reading ------------------------------------------------------------------------

    def _revision(self, incarnation: Any, revision: int) -> str:
        return f"pg:{self._db.store_id}:{self.schema}:incarnation:{incarnation}:revision:{revision}"

    def _header(self, sid: str, text: str) -> dict[str, Any]:
        try:
            raw = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise SessionCorruptionError(
                f'corrupt session log: stored header of "{sid}" is not JSON: {exc}', session_id=sid
            ) from exc
        return check_header_record(raw, sid)

    def list_headers(self) -> list[dict[str, Any]]:
        with self._db.txn(None, "listing sessions", begin=READ) as conn:
            rows = self._db.rows(conn, f"SELECT id, header FROM {self.schema}.sessions ORDER BY id")
        return [self._header(str(sid), text) for sid, text in rows]

    def _session(self, conn: Connection[Any], sid: str, *, lock: bool = False) -> tuple[Any, ...]:
        rows = self._db.rows(
            conn,
            f"SELECT header, incarnation, revision FROM {self.schema}.sessions WHERE id = %s"
            + (" FOR UPDATE" if lock else ""),
            (sid,),
        )
        if not rows:
            raise PersistedSessionNotFoundError(f'session "{sid}" not found', session_id=sid)
        return rows[0]

    def _scan(self, conn: Connection[Any], sid: str, from_seq: int = 0) -> tuple[list[dict[str, Any]], int | None]:
        sql = f"SELECT {_COLUMNS} FROM {self.schema}.events WHERE session_id = %s AND seq >= %s ORDER BY seq"
        if self.faults is not None:
            self.faults.before(sql)
        # The decoded events are acyclic: collector passes over them would dominate a
        # bulk load (see harness.session.gc_paused), as on JSONL.
        with conn.cursor(row_factory=_row_factory) as cur, gc_paused():
            cur.execute(sql, (sid, from_seq))
            return scan_batches(sid, fetch_batches(cur, 1024), from_seq)

    def load(self, session_id: str) -> StoredLog:
        """The stored log: header, events (packed rows expanded), where a torn tail
        starts (``None`` if none), and the revision — one consistent snapshot."""
        sid = session_id
        with self._db.txn(sid, "loading", begin=READ) as conn:
            text, incarnation, revision = self._session(conn, sid)
            records, torn = self._scan(conn, sid)
        return StoredLog(self._header(sid, text), records, torn, self._revision(incarnation, revision))

    def load_from(self, session_id: str, from_seq: int) -> StoredLog:
        """The stored events with ``seq >= from_seq``: a seek to the row that holds
        ``from_seq`` (a packed predecessor may), not a scan of the whole log."""
        sid = session_id
        with self._db.txn(sid, "loading", begin=READ) as conn:
            text, incarnation, revision = self._session(conn, sid)
            records, torn = self._scan(conn, sid, self._row_holding(conn, sid, from_seq))
        return StoredLog(
            self._header(sid, text),
            [r for r in records if r["seq"] >= from_seq],
            torn,
            self._revision(incarnation, revision),
        )

    def _row_holding(self, conn: Connection[Any], sid: str, seq: int) -> int:
        """The seq of the row that holds event ``seq``: a packed predecessor that covers
        it (or does not decode: the scan must then fail closed), else ``seq`` itself."""
        predecessors = self._db.rows(
            conn,
            f"SELECT {_COLUMNS} FROM {self.schema}.events WHERE session_id = %s AND seq >= %s "
            f"AND seq < %s AND type IN {_CHUNK_TAGS_SQL} AND ignorable = {PACKED} ORDER BY seq",
            (sid, max(0, seq - MAX_MEMBERS + 1), seq),
        )
        base = seq
        for p in predecessors:
            if covers(sid, _row(p), seq):
                base = min(base, int(p[0]))
        return base

    def revision(self, session_id: str) -> str | None:
        with self._db.txn(session_id, "reading the revision", begin=READ) as conn:
            rows = self._db.rows(
                conn, f"SELECT incarnation, revision FROM {self.schema}.sessions WHERE id = %s", (session_id,)
            )
        return None if not rows else self._revision(rows[0][0], rows[0][1])

    # -- writing ------------------------------------------------------------------------

    def materialize(
        self, header: dict[str, Any], records: list[dict[str, Any]], *, lease: WriterLease | None = None
    ) -> None:
        """Create the session with its first events, in one transaction; refuses
        (:class:`SessionLogExistsError`) when it already exists.

        A retry after a ``COMMIT`` whose outcome was unknown recognises the session
        this backend created itself, the way JSONL recognises its own link ("same
        inode, same bytes"): the stored row carries the incarnation (a fresh UUID)
        that write generated, the header it wrote, and events that are exactly the
        head of the retried batch. The rest of the batch is then appended. Anything
        else (another writer's session, a re-created one, different content) is
        refused as before: a second materialize never overwrites."""
        sid = header["id"]
        text = orjson.dumps(header_record(header)).decode()
        mine = str(uuid.uuid4())
        committing = False
        try:
            with self._db.txn(sid, "creating the session") as conn:
                mine = self._materialize_in(conn, header, text, mine, records, lease)
                committing = True
        except Exception as exc:
            if committing:  # the COMMIT failed: it may have landed
                self._in_doubt[sid] = (mine, text)
            elif isinstance(exc, SessionLogExistsError):
                self._in_doubt.pop(sid, None)
            raise
        self._in_doubt.pop(sid, None)

    def _materialize_in(
        self,
        conn: Connection[Any],
        header: dict[str, Any],
        text: str,
        incarnation: str,
        records: list[dict[str, Any]],
        lease: WriterLease | None,
        reach: int | None = None,
    ) -> str:
        """Inside a write transaction: the first write with the fresh ``incarnation``,
        or the completion of this backend's own in-doubt one; returns the incarnation
        of the stored session (to remember should the commit's outcome be unknown)."""
        sid = header["id"]
        doubt = self._in_doubt.get(sid)
        self._leases.check(conn, sid, lease, len(records))
        inserted = self._db.rows(
            conn,
            f"INSERT INTO {self.schema}.sessions (id, header, incarnation, revision) VALUES (%s, %s, %s, 1) "
            "ON CONFLICT (id) DO NOTHING RETURNING 1",
            (sid, text, incarnation),
        )
        if inserted:
            self._copy(conn, bind_records(sid, records, pack=True))
            return incarnation
        stored = None if doubt is None else self._own_first_write(conn, sid, doubt, text, records, reach)
        if stored is None or doubt is None:
            raise SessionLogExistsError(
                f'refusing to materialize "{sid}": a log already exists on disk (load/resume it instead)',
                session_id=sid,
            )
        if stored < len(records):  # our own first write did land: complete it
            self._copy(conn, bind_records(sid, records[stored:], pack=True))
            self._bump(conn, sid)
        return doubt[0]

    def _own_first_write(
        self,
        conn: Connection[Any],
        sid: str,
        doubt: tuple[str, str],
        text: str,
        records: list[dict[str, Any]],
        reach: int | None = None,
    ) -> int | None:
        """How many leading ``records`` the in-doubt first write ``doubt`` stored, if
        the stored session is that write's (same incarnation and header, its events
        starting with exactly the head of ``records``); ``None`` if it is not."""
        header_text, incarnation, _revision = self._session(conn, sid, lock=True)
        if str(incarnation) != doubt[0] or header_text != doubt[1] or text != doubt[1]:
            return None
        stored, torn = self._scan(conn, sid)
        if torn is not None:
            return None
        if len(stored) > len(records):
            # Only a group's retry: its commit of unknown outcome stored this batch and
            # the group's later batches of the session, exactly up to ``reach``.
            if reach is None or len(stored) != reach:
                return None
            stored = stored[: len(records)]
        return len(stored) if _same(stored, records[: len(stored)]) else None

    def _copy(self, conn: Connection[Any], rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        sql = f"COPY {self.schema}.events ({_COPY_COLUMNS}) FROM STDIN"
        if self.faults is not None:
            self.faults.before(sql)
        with conn.cursor() as cur, cur.copy(sql) as copy:
            for row in rows:
                copy.write_row(_copy_row(row))

    def _bump(self, conn: Connection[Any], sid: str) -> None:
        self._db.exec(conn, f"UPDATE {self.schema}.sessions SET revision = revision + 1 WHERE id = %s", (sid,))

    def _next_seq(self, conn: Connection[Any], sid: str) -> int:
        """Lock the session row (``FOR UPDATE``: the append's writes to it wait for no
        one, a concurrent one waits for this commit) and return the stored next seq,
        from the logical tail (the last rows, and the packed row before them if it
        overlaps them), in ONE statement: the session row left-joined to its last
        three rows (one row of NULLs when it has none). One round trip instead of two
        per batch (issue 26). No session row: :class:`PersistedSessionNotFoundError`.
        A tail that does not decode refuses the append."""
        rows = self._db.rows(
            conn,
            f"SELECT {_TAIL_COLUMNS} FROM {self.schema}.sessions AS s LEFT JOIN LATERAL "
            f"(SELECT {_COLUMNS} FROM {self.schema}.events WHERE session_id = s.id ORDER BY seq DESC LIMIT 3) AS t "
            "ON true WHERE s.id = %s ORDER BY t.seq DESC FOR UPDATE OF s",
            (sid,),
        )
        if not rows:
            raise PersistedSessionNotFoundError(f'session "{sid}" not found', session_id=sid)
        tail = [_row(r) for r in rows if r[0] is not None]
        return next_seq_of_tail(sid, tail)

    def append(self, session_id: str, records: list[dict[str, Any]], *, lease: WriterLease | None = None) -> None:
        """Append one batch in one transaction that checks (and renews) the caller's
        lease: a lost lease raises :class:`LeaseLostError` and nothing lands. The batch
        must continue the stored log; a batch whose head is already stored exactly
        (a retry after a commit of unknown outcome) lands only its new part."""
        if not records:
            return
        rows = bind_records(session_id, records, pack=True)
        with self._db.txn(session_id, f"appending {len(records)} event(s)") as conn:
            self._append_in(conn, session_id, records, rows, lease)

    def _append_in(
        self,
        conn: Connection[Any],
        sid: str,
        records: list[dict[str, Any]],
        rows: list[tuple[Any, ...]],
        lease: WriterLease | None,
        reach: int | None = None,
    ) -> None:
        """Inside a write transaction: an append (``rows`` bound from ``records``).
        ``reach`` (a group's batch): the next seq after the group's last batch of the
        session (see :meth:`_stored_prefix`)."""
        self._leases.check(conn, sid, lease, len(records))
        next_seq = self._next_seq(conn, sid)  # also locks the session row
        first = records[0].get("seq") if type(records[0]) is dict else None
        if type(first) is int and first < next_seq:
            stored = self._stored_prefix(conn, sid, records, first, next_seq, reach)
            if stored is None:
                raise SessionCorruptionError(
                    f"session {sid} append starts at seq {first}, stored next seq is {next_seq}",
                    session_id=sid,
                )
            if stored == len(records):
                return  # all of it landed already: nothing to do, no new revision
            rows = bind_records(sid, records[stored:], pack=True)
        elif rows[0][1] != next_seq:
            raise SessionCorruptionError(
                f"session {sid} append starts at seq {rows[0][1]}, stored next seq is {next_seq}",
                session_id=sid,
            )
        self._copy(conn, rows)
        self._bump(conn, sid)

    def write_group(self, writes: Sequence[GroupWrite]) -> list[BaseException | None]:
        """Several sessions' batches in ONE transaction (one ``COMMIT``, one WAL flush
        for all of them; group commit, issue 26; the contract is
        :func:`~harness.persistence._backend.write_each`'s).

        Each batch runs inside its own ``SAVEPOINT``: a batch refused by its own checks
        (a lost lease, an existing session for a first write, a batch that does not
        continue the stored log, a record that cannot be stored, a statement of its
        own failing) is rolled back alone and reported with the exception ``append``
        or ``materialize`` would raise for it alone, and the others go on. A failure
        of a shared step (``BEGIN``, a savepoint that cannot be rolled back to, the
        ``COMMIT``) fails every batch not already refused; a ``COMMIT`` whose outcome
        is unknown leaves every first write of the group recognisable by its retry,
        as for ``materialize``. The batches run in session-id order (one session's
        in the order given), so the row locks of two groups are always taken in the
        same order and never deadlock. A lone batch is exactly ``append`` or
        ``materialize``."""
        results: list[BaseException | None] = [None] * len(writes)
        todo = [i for i, w in enumerate(writes) if w.records or not w.materialized]
        if len(todo) == 1:
            w = writes[todo[0]]
            try:
                if w.materialized:
                    self.append(w.session_id, w.records, lease=w.lease)
                else:
                    self.materialize(w.header, w.records, lease=w.lease)
            except Exception as exc:
                results[todo[0]] = exc
            return results
        if not todo:
            return results
        todo.sort(key=lambda i: writes[i].session_id)  # stable: one session's order kept
        plans: dict[int, _Planned] = {}
        for i in todo:
            try:
                plans[i] = self._plan(writes[i])
            except Exception as exc:
                results[i] = exc
        todo = [i for i in todo if i in plans]
        reach: dict[str, int | None] = {}
        for i in todo:  # in session order: the last batch of each session wins
            last = writes[i].records[-1].get("seq") if writes[i].records else None
            reach[writes[i].session_id] = last + 1 if type(last) is int else None
        for i in todo:
            plans[i].reach = reach[writes[i].session_id]
        committing = False
        try:
            with self._db.txn(None, f"writing a group of {len(todo)} batches") as conn:
                for i in todo:
                    results[i] = self._group_batch(conn, writes[i], plans[i])
                committing = True
        except Exception as exc:
            for i in todo:
                if results[i] is None:
                    results[i] = self._group_error(exc, writes[i].session_id, plans[i].what, committing)
            if committing:
                for i in todo:
                    w, plan = writes[i], plans[i]
                    if not w.materialized and results[i] is not None and plan.stored is not None:
                        self._in_doubt[w.session_id] = (plan.stored, plan.text)
            return results
        for i in todo:
            w = writes[i]
            if not w.materialized and (results[i] is None or isinstance(results[i], SessionLogExistsError)):
                self._in_doubt.pop(w.session_id, None)
        return results

    def _plan(self, w: GroupWrite) -> _Planned:
        """What a batch needs before its transaction (as ``append``/``materialize``
        compute it first: an unencodable record is refused before any statement)."""
        if w.materialized:
            return _Planned(f"appending {len(w.records)} event(s)", bind_records(w.session_id, w.records, pack=True))
        return _Planned("creating the session", [], orjson.dumps(header_record(w.header)).decode())

    def _group_batch(self, conn: Connection[Any], w: GroupWrite, plan: _Planned) -> BaseException | None:
        """One batch of a group in its own savepoint: its own failure is returned (the
        savepoint rolled back); one that leaves the transaction unusable is raised."""
        self._db.exec(conn, f"SAVEPOINT {_GROUP_SAVEPOINT}")
        try:
            if w.materialized:
                self._append_in(conn, w.session_id, w.records, plan.rows, w.lease, plan.reach)
            else:
                plan.stored = self._materialize_in(
                    conn, w.header, plan.text, str(uuid.uuid4()), w.records, w.lease, plan.reach
                )
            self._db.exec(conn, f"RELEASE SAVEPOINT {_GROUP_SAVEPOINT}")
        except Exception as exc:
            # Undo this batch alone; if even that fails, the whole group goes.
            self._db.exec(conn, f"ROLLBACK TO SAVEPOINT {_GROUP_SAVEPOINT}")
            self._db.exec(conn, f"RELEASE SAVEPOINT {_GROUP_SAVEPOINT}")
            plan.stored = None
            if isinstance(exc, psycopg.Error):
                return self._db.io_error(w.session_id, plan.what, exc)
            return exc
        return None

    def _group_error(self, exc: Exception, sid: str, what: str, committing: bool) -> BaseException:
        """The exception a batch alone would have got from the group's shared failure."""
        cause = exc.__cause__
        if type(exc) is StorageIOError and isinstance(cause, psycopg.Error):
            err = self._db.io_error(sid, f"{what}: COMMIT (its outcome is unknown)" if committing else what, cause)
            err.__cause__ = cause
            return err
        return copy_error(exc, sid)

    def _stored_prefix(
        self,
        conn: Connection[Any],
        sid: str,
        records: list[dict[str, Any]],
        first: int,
        next_seq: int,
        reach: int | None = None,
    ) -> int | None:
        """How many leading ``records`` are stored exactly as given (from seq ``first``
        on), or ``None`` if they are not. The batch's head must be the end of the log
        (seqs ``first`` to ``next_seq - 1``); or, for a group's batch, the whole batch
        is stored and the log goes on exactly to ``reach``: the group's commit of unknown
        outcome stored it and the group's later batches of the session, and the group's
        retry sends them all again."""
        if next_seq - first > len(records) and next_seq != reach:
            return None
        count = min(next_seq - first, len(records))
        head = records[:count]
        end = first + count
        if [r.get("seq") for r in head] != list(range(first, end)):
            return None
        stored, torn = self._scan(conn, sid, self._row_holding(conn, sid, first))
        stored = [e for e in stored if first <= e["seq"] < end]
        if torn is not None or len(stored) != count:
            return None
        return count if _same(stored, head) else None

    def commit_repair(
        self,
        session_id: str,
        truncate_to: int | None,
        records: list[dict[str, Any]],
        *,
        lease: WriterLease | None = None,
    ) -> None:
        """The repair a :meth:`load` asked for, in one transaction: delete the torn rows
        from seq ``truncate_to`` on (still where the torn tail starts), then append the
        closers ``records`` (they must start at the stored next seq)."""
        if truncate_to is None and not records:
            return
        sid = session_id
        rows = bind_records(sid, records, pack=False)
        with self._db.txn(sid, "repairing") as conn:
            self._leases.check(conn, sid, lease, len(records))
            self._session(conn, sid, lock=True)
            events, torn = self._scan(conn, sid)
            if truncate_to is not None:
                if torn != truncate_to:
                    raise SessionCorruptionError(
                        f"session {sid} repair is stale: physical tail no longer starts at seq {truncate_to}",
                        session_id=sid,
                    )
                self._db.exec(
                    conn, f"DELETE FROM {self.schema}.events WHERE session_id = %s AND seq >= %s", (sid, truncate_to)
                )
            elif torn is not None:
                raise SessionCorruptionError(f"session {sid} repair omitted current torn tail at seq {torn}", session_id=sid)
            if rows:
                expected = int(events[-1]["seq"]) + 1 if events else 0
                if rows[0][1] != expected:
                    raise SessionCorruptionError(
                        f"session {sid} repair is stale: closer starts at seq {rows[0][1]}, stored next seq is {expected}",
                        session_id=sid,
                    )
                self._copy(conn, rows)
            self._bump(conn, sid)

    def delete(self, session_id: str) -> None:
        """Delete the session and its events (its lease row stays: fences never repeat)."""
        with self._db.txn(session_id, "deleting") as conn:
            if not self._db.rows(conn, f"DELETE FROM {self.schema}.sessions WHERE id = %s RETURNING 1", (session_id,)):
                raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)


@attrs.define
class _Planned:
    """A group batch's precomputed part: what it does (for errors), its bound rows (an
    append), its header text (a first write) and the incarnation it stored."""

    what: str
    rows: list[tuple[Any, ...]]
    text: str = ""
    stored: str | None = None
    reach: int | None = None  # the next seq after the group's last batch of the session


_GROUP_SAVEPOINT: Final = "harness_group_batch"


def _same(stored: list[dict[str, Any]], given: list[dict[str, Any]]) -> bool:
    """Whether the stored events are exactly the given records (key order aside)."""
    opt = orjson.OPT_SORT_KEYS
    dumps, loads = orjson.dumps, orjson.loads
    try:
        # A given record's data may be an appended event's encoded JSON (an
        # ``orjson.Fragment``, decision 0023), which OPT_SORT_KEYS writes as it is:
        # decoded first, so both sides sort every level.
        return len(stored) == len(given) and all(
            dumps(a, option=opt) == dumps(loads(dumps(b)), option=opt) for a, b in zip(stored, given, strict=True)
        )
    except TypeError:
        return False

