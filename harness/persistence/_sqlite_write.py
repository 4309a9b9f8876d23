"""Writing the SQLite backend: a first write (materialize), an append (the stored next
seq, remembered from this instance's last write when the row still matches), a group of
batches in one transaction (a savepoint per batch), the repair of a torn tail, delete.
Every write checks (and renews) the caller's lease in its own transaction.

All methods block: call them from a worker thread."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from harness.errors import (
    PersistedSessionNotFoundError,
    RecordEncodingError,
    SessionCorruptionError,
    SessionLogExistsError,
)
from harness.persistence._backend import (
    GroupWrite,
    WriterLease,
)
from harness.persistence._files import SimulatedCrash
from harness.persistence._sql_group import copy_error
from harness.persistence._sqlite_lease_row import _LEASES, _LeaseRow
from harness.persistence._sqlite_leases import SqliteLeases
from harness.persistence._sqlite_rows import (
    COLUMNS,
    INSERT,
    bind_segments,
    fetch_batches,
    next_seq_of_tail,
    scan_batches,
)
from harness.persistence._sqlite_session_row import _SESSION_COLUMNS, _session_params

_GROUP_SAVEPOINT: Final = "harness_group_batch"
# An append's revision bump, which also reads what the append checks the stored log
# against: the session row's incarnation and revision before the bump and its last
# row's seq (NULL: no rows). One statement instead of a read and a later update (each
# costs a round trip through the driver, issue 26); inside the append's transaction
# (or savepoint) the order is not observable, and a refused batch rolls the bump back.
_BUMP_TAIL: Final = (
    "UPDATE sessions SET revision = revision + 1 WHERE id = ?1 "
    "RETURNING incarnation, revision - 1, (SELECT max(seq) FROM events WHERE session_id = ?1)"
)
# The same for an append under a lease (the writer's case), which also reads the lease
# row's fence, token and expiry: the lease check costs no statement of its own (one
# driver round trip less per batch, ~2.5 us of the writer thread's ~40 us for a single
# append, issue 26). A missing row or a mismatch falls back to the full check, which
# raises what it always raised (a lost lease before a missing session); the bump is
# then rolled back with the batch.
_BUMP_TAIL_LEASED: Final = (
    _BUMP_TAIL + f", (SELECT fence FROM {_LEASES} WHERE session_id = ?1)"
    f", (SELECT token FROM {_LEASES} WHERE session_id = ?1)"
    f", (SELECT expires FROM {_LEASES} WHERE session_id = ?1)"
)


class SqliteWrites(SqliteLeases):
    """The writes of a :class:`~harness.persistence._sqlite.SqliteBackend`."""

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
        self._bump(db, sid)

    def _insert(
        self,
        db: sqlite3.Connection,
        sid: str,
        records: list[dict[str, Any]],
        next_seq: int,
        stored: tuple[str, int] | None = None,
    ) -> None:
        """Insert a batch's rows (chunk runs packed), which must start at ``next_seq``
        (the caller bumps the revision, before or after). The rows are bound while they
        are inserted, segment by segment (:func:`bind_segments`): a record the schema
        cannot hold raises :class:`RecordEncodingError` and the transaction rolls the
        batch back. The fault layer sees the batch's insert as one statement
        (:data:`INSERT`).

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
        if stored is not None and first is not None:
            last = records[-1].get("seq")
            if last == next_seq + len(records) - 1:  # contiguous, as the session core writes
                self._pending_tails[sid] = (stored[0], stored[1] + 1, last_row, next_seq + len(records))

    def _bump(self, db: sqlite3.Connection, sid: str) -> None:
        if self._exec(db, "UPDATE sessions SET revision = revision + 1 WHERE id = ?", (sid,)).rowcount != 1:
            raise PersistedSessionNotFoundError(f"session {sid} metadata row is missing", session_id=sid)

    def _next_seq(
        self, db: sqlite3.Connection, sid: str, lease: _LeaseRow | None = None, n: int = 0
    ) -> tuple[int, tuple[str, int]]:
        """The stored next seq, and the session row's (incarnation, revision) before
        this write; bumps the revision (one statement, :data:`_BUMP_TAIL`).

        If that row is still the one this instance's last committed write left (same
        incarnation and revision: every write, by either implementation, bumps the
        revision, and a re-created session has a new incarnation) and so is the last
        row's seq (an index seek in the same statement: rows added or removed behind
        the revision's back, by hand, are noticed too), the tail is the one that write
        stored and its next seq is remembered: no tail rows read and decoded. Otherwise from
        the logical tail: the last two rows, from the packed row before them if it
        overlaps them (the reference looks for such a row among the 1023 rows before;
        in a valid log only the adjacent one can, and a full load checks them all). A
        tail that does not decode refuses the append.

        With ``lease`` (checked to be this session's), the same statement
        (:data:`_BUMP_TAIL_LEASED`) reads the lease row's fence, token and expiry and
        the lease is checked (and renewed) from them; on any mismatch, or with no
        session row, the full :meth:`_check_lease` decides (and raises)."""
        # fetchall: the statement runs to its end (an UPDATE ... RETURNING left
        # unfinished would hold the transaction's statement open).
        rows = self._exec(db, _BUMP_TAIL if lease is None else _BUMP_TAIL_LEASED, (sid,)).fetchall()
        row = rows[0] if rows else None
        if lease is not None and (row is None or row[3] != lease.fence or row[4] != lease.token):
            self._check_lease(db, sid, lease, n)  # raises LeaseLostError if it is lost
            if row is not None:  # unreachable: the same transaction read another row
                raise SessionCorruptionError(f"session {sid}: lease row changed within a transaction", session_id=sid)
        if row is None:
            raise PersistedSessionNotFoundError(f'session "{sid}" not found', session_id=sid)
        if lease is not None:
            self._renew_if_due(db, sid, row[5])
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
        """Inside a write transaction: an append (lease check, continuity, the rows).
        Under a lease the check is folded into :meth:`_next_seq`'s statement."""
        if isinstance(lease, _LeaseRow) and lease.session_id == sid:
            next_seq, stored = self._next_seq(db, sid, lease, len(records))
        else:
            self._check_lease(db, sid, lease, len(records))  # no lease, or a wrong one
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
                return self.db_error(exc, session_id=w.session_id)
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
