"""The lease rows of the PostgreSQL backend: take, check (inside a write), renew,
release, probe. See :mod:`harness.persistence._postgres_lease` for the handle, holder
liveness and the keeper thread, and ``docs/postgres.md`` for the protocol.

The lease row is always locked (``FOR UPDATE``) before anything it guards: a takeover
waits for a write in flight, and a write after a takeover sees it. Expiry is in the
database server's clock, so hosts' clocks never have to agree.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, Final

from psycopg import Connection

from harness.errors import LeaseLostError, SessionLockedError, StorageIOError
from harness.persistence._backend import WriterLease
from harness.persistence._postgres_conn import READ, PgConnections
from harness.persistence._postgres_lease import (
    LIVE_TOKENS,
    LeaseKeeper,
    PgLease,
    describe,
    holder,
    holder_dead,
    identity,
)

log = logging.getLogger("harness.persistence")

_LEASE_COLUMNS: Final = (
    "fence, token, host, pid, start_time, (extract(epoch FROM since) * 1000)::bigint, "
    "(extract(epoch FROM expires) * 1000)::bigint, "
    "(extract(epoch FROM expires - clock_timestamp()) * 1000)::bigint, pid_scope"
)


class LeaseTable:
    """The ``leases`` table of one backend: ``host`` names this holder, ``ttl_ms`` is the
    lease lifetime; held leases are renewed by a :class:`LeaseKeeper`."""

    def __init__(self, db: PgConnections, host: str, ttl_ms: int) -> None:
        self.db = db
        self.host = host
        self._ttl_ms = ttl_ms
        self.tokens: set[str] = set()  # tokens of leases handed out here and not released
        self.keeper = LeaseKeeper(f"postgres-lease-keeper {db.schema}", ttl_ms / 3000, self.renew_all)

    def row(self, conn: Connection[Any], sid: str) -> tuple[Any, ...] | None:
        rows = self.db.rows(
            conn, f"SELECT {_LEASE_COLUMNS} FROM {self.db.schema}.leases WHERE session_id = %s FOR UPDATE", (sid,)
        )
        return rows[0] if rows else None

    def live(self, row: tuple[Any, ...]) -> bool:
        _fence, token, host, pid, start, _since, _expires, remaining, scope = row
        if token is None or remaining is None or remaining <= 0:
            return False
        return not holder_dead(self.host, token, host, pid, start, scope)

    def check(self, conn: Connection[Any], sid: str, lease: WriterLease | None, n: int) -> None:
        """Inside a write transaction, before anything is written: the caller's lease
        must be the session's current one (its row stays locked until the commit, so
        no takeover can slip in); a caller without a lease may write only while nobody
        holds a live one. Renews the lease when less than two thirds of its TTL remain."""
        row = self.row(conn, sid)
        if lease is None:
            if row is not None and self.live(row):
                raise SessionLockedError(
                    f'cannot write session "{sid}" without its lease: it is open for writing by {describe(row)}',
                    session_id=sid,
                    holder=holder(row),
                )
            return
        if not isinstance(lease, PgLease) or lease.session_id != sid:
            raise TypeError(f"not a lease of session {sid!r} from a PostgreSQL backend: {lease!r}")
        if row is None or row[1] != lease.token or row[0] != lease.fence:
            raise self.lost(sid, lease, row, n)
        if row[7] is None or row[7] < self._ttl_ms * 2 // 3:
            self.db.exec(
                conn,
                f"UPDATE {self.db.schema}.leases SET expires = clock_timestamp() + %s * interval '1 millisecond' "
                "WHERE session_id = %s",
                (self._ttl_ms, sid),
            )

    def lost(self, sid: str, lease: PgLease, row: tuple[Any, ...] | None, n: int) -> LeaseLostError:
        new = "nobody (released)" if row is None or row[1] is None else describe(row)
        return LeaseLostError(
            f'session "{sid}": this writer\'s lease (fence {lease.fence}) was taken over by {new}'
            f"{'' if row is None else f' (fence {row[0]})'}; {n} event(s) were not written",
            session_id=sid,
            holder=None if row is None else holder(row),
        )

    def acquire(self, header: dict[str, Any]) -> WriterLease:
        """Take the session's lease now, with a fence above every earlier one, or raise
        :class:`SessionLockedError` naming the live holder. An expired lease, or one
        whose holder is provably dead, is taken over."""
        sid = header["id"]
        token = secrets.token_hex(16)
        host, pid, start, scope = identity(self.host)
        # Vouch for the token before it can be seen: another thread of this process
        # checking liveness must not find it "dead" between the commit and here.
        LIVE_TOKENS.add(token)
        self.tokens.add(token)
        try:
            with self.db.txn(sid, "taking the writer lease") as conn:
                values = (token, host, pid, start, scope, self._ttl_ms)
                fresh = (
                    "token = %s, host = %s, pid = %s, start_time = %s, pid_scope = %s, since = clock_timestamp(), "
                    "expires = clock_timestamp() + %s * interval '1 millisecond'"
                )
                rows = self.db.rows(
                    conn,
                    f"INSERT INTO {self.db.schema}.leases "
                    "(session_id, fence, token, host, pid, start_time, pid_scope, since, expires) "
                    "VALUES (%s, 1, %s, %s, %s, %s, %s, clock_timestamp(), "
                    "clock_timestamp() + %s * interval '1 millisecond') "
                    "ON CONFLICT (session_id) DO NOTHING RETURNING fence",
                    (sid, *values),
                )
                if not rows:
                    row = self.row(conn, sid)
                    if row is not None and self.live(row):
                        raise SessionLockedError(
                            f'session "{sid}" is already open for writing by {describe(row)}',
                            session_id=sid,
                            holder=holder(row),
                        )
                    rows = self.db.rows(
                        conn,
                        f"UPDATE {self.db.schema}.leases SET fence = fence + 1, {fresh} WHERE session_id = %s RETURNING fence",
                        (*values, sid),
                    )
                fence = int(rows[0][0])
        except BaseException:
            LIVE_TOKENS.discard(token)
            self.tokens.discard(token)
            raise
        lease = PgLease(self, sid, token, fence, self.release, self.renew)
        self.keeper.hold(lease)
        return lease

    def forget(self) -> None:
        """A simulated crash of this process: stop vouching for (and renewing) every
        lease handed out here, without touching their rows; another writer of this
        host then finds their holder dead, as after the process's death."""
        for token in list(self.tokens):
            LIVE_TOKENS.discard(token)
        self.tokens.clear()
        self.keeper.forget()

    def renew(self, lease: PgLease) -> None:
        with self.db.txn(lease.session_id, "renewing the writer lease") as conn:
            row = self.row(conn, lease.session_id)
            if row is None or row[1] != lease.token or row[0] != lease.fence:
                raise self.lost(lease.session_id, lease, row, 0)
            self.db.exec(
                conn,
                f"UPDATE {self.db.schema}.leases SET expires = clock_timestamp() + %s * interval '1 millisecond' "
                "WHERE session_id = %s",
                (self._ttl_ms, lease.session_id),
            )

    def renew_all(self, leases: list[PgLease]) -> set[str]:
        """The keeper's round: renew each lease (one short autocommit statement each,
        in session order, so two keepers never wait on each other in a cycle); return
        the tokens no longer current."""
        lost: set[str] = set()
        conn = self.db.pool.getconn()
        try:
            for lease in sorted(leases, key=lambda x: x.session_id):
                # Not through ``faults``: renewal timing varies from run to run.
                if not conn.execute(
                    f"UPDATE {self.db.schema}.leases SET expires = clock_timestamp() + %s * interval '1 millisecond' "
                    "WHERE session_id = %s AND token = %s AND fence = %s RETURNING 1",
                    (self._ttl_ms, lease.session_id, lease.token, lease.fence),
                ).fetchall():
                    lost.add(lease.token)
        finally:
            self.db.pool.putconn(conn)
        return lost

    def release(self, lease: PgLease) -> None:
        # Stop vouching first: even if the update fails, others wait at most the TTL.
        LIVE_TOKENS.discard(lease.token)
        self.tokens.discard(lease.token)
        self.keeper.drop(lease.token)
        try:
            with self.db.txn(lease.session_id, "releasing the writer lease") as conn:
                self.db.exec(
                    conn,
                    f"UPDATE {self.db.schema}.leases SET token = NULL, host = NULL, pid = NULL, start_time = NULL, "
                    "pid_scope = NULL, expires = NULL WHERE session_id = %s AND token = %s",
                    (lease.session_id, lease.token),
                )
        except StorageIOError as exc:
            # Best effort, as JSONL's flock release: the row keeps a token nobody
            # vouches for any more, so a writer of this host and pid scope takes it
            # over at once (its holder is provably dead) and any other at its expiry. Raising
            # would make a clean retirement (every event durable) look like a failure.
            log.warning("postgres: %s (the lease is taken over at its expiry)", exc)

    def held(self, header: dict[str, Any]) -> bool:
        """True if a live lease on the session exists (unexpired, holder not provably
        dead). Reads without locking, not through ``faults``."""
        sid = header["id"]
        with self.db.txn(sid, "probing the writer lease", begin=READ, hooked=False) as conn:
            rows = conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM {self.db.schema}.leases WHERE session_id = %s", (sid,)
            ).fetchall()
        return bool(rows) and self.live(tuple(rows[0]))
