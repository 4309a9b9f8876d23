"""One live writer per session for the SQLite backend: the lease rows in the attached
lease file (``<db>-leases``), acquire, the check (and renewal) inside every write
transaction, renew, release, the keeper thread renewing idle leases, and
:meth:`~SqliteLeases.lock_held` (see :mod:`harness.persistence._sqlite`).

All methods block: call them from a worker thread."""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
import time
from typing import Any

from harness.errors import (
    LeaseLostError,
    SessionLockedError,
)
from harness.persistence._backend import WriterLease
from harness.persistence._liveness import identity
from harness.persistence._sqlite_conn import SqliteConnection
from harness.persistence._sqlite_lease_row import (
    _LEASE_COLUMNS,
    _LEASES,
    _LIVE_TOKENS,
    _describe,
    _holder,
    _lease_live,
    _LeaseRow,
)

log = logging.getLogger("harness.persistence")

class SqliteLeases(SqliteConnection):
    """The writer leases of a :class:`~harness.persistence._sqlite.SqliteBackend`."""

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
        self._renew_if_due(db, sid, None if renew else row[6], now)

    def _renew_if_due(self, db: sqlite3.Connection, sid: str, expires: int | None, now: int | None = None) -> None:
        """Inside a write transaction, the caller's lease checked: renew it if less
        than two thirds of its TTL remain (always if ``expires`` is None). ``now``:
        this module's clock (:func:`_now_ms`) unless given."""
        if now is None:
            now = _now_ms()
        ttl_ms = int(self.lease_ttl * 1000)
        if expires is None or expires - now < ttl_ms * 2 // 3:
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


# The lease clock (wall time, ms); tests patch it here (``harness.persistence._sqlite_leases._now_ms``).
def _now_ms() -> int:
    return int(time.time() * 1000)
