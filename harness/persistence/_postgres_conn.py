"""Connections of the PostgreSQL backend: the pool, one transaction per call, and the
schema check before the first one.

psycopg's sync API, called from the coordinator's worker threads (the ``Backend``
protocol is blocking; no second event loop, no thread bridge), with a
``psycopg_pool.ConnectionPool``. Every :meth:`PgConnections.txn` is one transaction
ended before it exits: on an error it rolls back, and a connection whose state is
unknown (the rollback failed, the server went away, a ``BaseException`` such as a
simulated crash interrupted it) is closed, so the pool discards it instead of handing
out a poisoned one. Connections are checked when taken from the pool (the first call
after a server restart gets a fresh one), and server-side timeouts end a transaction
whose client stopped (SIGSTOP) while holding row locks.

psycopg and pool errors become :class:`StorageIOError` naming the session.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, Protocol

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from harness.errors import StorageIOError
from harness.persistence._files import SimulatedCrash
from harness.persistence._postgres_schema import open_schema

log = logging.getLogger("harness.persistence")

READ: Final = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


class StatementFaults(Protocol):
    """Called before every statement the backend runs (``BEGIN``/``COMMIT``/``COPY``
    included), in order; it may raise to inject a fault. Lease renewals by the
    keeper thread and probes are not reported (their timing varies from run to run).

    A hook may also define ``after(sql)``, called once a statement run through
    :meth:`PgConnections.exec` returned (not after ``COPY``): raising there models a
    statement that ran on the server but whose answer was lost (a ``COMMIT`` that
    landed, then the connection dropped)."""

    def before(self, sql: str) -> None: ...


def _plain(conn: Connection[Any], sql: str) -> Any:
    return conn.execute(sql)


class PgConnections:
    """The pool of one backend (schema ``schema``), opened on first use. ``idle_ms``
    bounds how long the server lets a transaction sit idle (a stopped client)."""

    def __init__(
        self,
        url: str,
        schema: str,
        *,
        idle_ms: int,
        pool_size: int,
        pool_timeout: float,
        application_name: str,
        faults: StatementFaults | None,
        create: bool,
        on_crash: Callable[[], None] | None = None,
    ) -> None:
        self.schema = schema
        self.faults = faults
        self._on_crash = on_crash
        self._create = create
        settings = (
            f"SET idle_in_transaction_session_timeout = {idle_ms}",
            f"SET lock_timeout = {2 * idle_ms}",
            "SET statement_timeout = 600000",
        )

        def configure(conn: Connection[Any]) -> None:
            for stmt in settings:
                conn.execute(stmt)

        self._url = url
        self._kwargs: dict[str, Any] = {
            "autocommit": True,  # transactions are explicit BEGIN ... COMMIT
            "application_name": application_name,
            "connect_timeout": 10,
            # A partitioned server is noticed in ~25 s instead of the OS's hours.
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
        }
        self.pool = ConnectionPool(
            url,
            kwargs=self._kwargs,
            min_size=1,
            max_size=pool_size,
            open=False,  # opened on first use, on a worker thread: no I/O here
            configure=configure,
            check=ConnectionPool.check_connection,
            timeout=pool_timeout,
            name=f"harness-postgres-{schema}",
        )
        self._open_lock = threading.Lock()
        self._opened = False
        self._closed = False
        self.store_id: str | None = None

    def ensure_open(self) -> str:
        """Open the pool and check (or create) the schema, once; return the store id.
        A failed check is retried by the next call (and refused again if foreign)."""
        with self._open_lock:
            if self._closed:
                raise StorageIOError(f"PostgreSQL backend for schema \"{self.schema}\" is closed")
            if not self._opened:
                self._probe()
                self.pool.open(wait=False)
                self._opened = True
            if self.store_id is None:
                with self.txn(None, "opening the schema", begin="BEGIN", checked=False) as conn:
                    self.store_id = open_schema(
                        lambda sql, params: self.rows(conn, sql, params), self.schema, create=self._create
                    )
            return self.store_id

    def _probe(self) -> None:
        """One direct connection before the pool first opens. A server that cannot be
        reached at all is then refused at once, with the driver's reason (``connection
        refused``, an unknown host, a bad password), instead of after the pool's
        ``pool_timeout`` with a warning logged for each of its background retries. Once
        the pool is open, it reconnects by itself (a server restart)."""
        try:
            conn = psycopg.connect(self._url, **self._kwargs)
        except psycopg.Error as exc:
            raise self.io_error(None, "connecting to the server", exc) from exc
        conn.close()

    def exec(self, conn: Connection[Any], sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        faults = self.faults
        if faults is None:
            return conn.execute(sql, params)
        faults.before(sql)
        cur = conn.execute(sql, params)
        after = getattr(faults, "after", None)
        if after is not None:
            after(sql)
        return cur

    def rows(self, conn: Connection[Any], sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self.exec(conn, sql, params)
        return [tuple(r) for r in cur.fetchall()] if cur.description is not None else []

    def io_error(self, sid: str | None, what: str, exc: BaseException) -> StorageIOError:
        where = f'session "{sid}"' if sid is not None else f'PostgreSQL schema "{self.schema}"'
        return StorageIOError(f"{where}: {what} failed: {exc}", session_id=sid)

    @contextmanager
    def txn(
        self, sid: str | None, what: str, *, begin: str = "BEGIN", checked: bool = True, hooked: bool = True
    ) -> Iterator[Connection[Any]]:
        """One transaction on a pooled connection, ended (committed, or rolled back)
        before this exits; a connection in an unknown state is closed (the pool drops
        it). ``what`` names the operation in errors; ``checked``: open the schema first;
        ``hooked``: report ``BEGIN``/``COMMIT`` to ``faults``."""
        ex = self.exec if hooked else _plain
        if checked:
            self.ensure_open()
        try:
            conn = self.pool.getconn()
        except PoolTimeout as exc:
            raise self.io_error(sid, f"{what} (no connection to the server)", exc) from exc
        except PoolClosed as exc:  # closed by another thread meanwhile
            raise self.io_error(sid, f"{what} (the backend is closed)", exc) from exc
        done = False
        try:
            try:
                ex(conn, begin)
                yield conn
                done = True  # a failed COMMIT rolls back by itself: nothing left open
                ex(conn, "COMMIT")
            except psycopg.Error as exc:
                if done:
                    raise self.io_error(sid, f"{what}: COMMIT (its outcome is unknown)", exc) from exc
                raise self.io_error(sid, what, exc) from exc
            except Exception:
                raise
            except BaseException as exc:
                # Interrupted anywhere (a simulated crash, KeyboardInterrupt): the
                # protocol state is unknown, so the connection goes, as with a dead
                # process; the server rolls its transaction back.
                conn.close()
                if isinstance(exc, SimulatedCrash) and self._on_crash is not None:
                    self._on_crash()  # the "process" died: it vouches for no lease any more
                raise
            finally:
                if not done:
                    self._abort(conn)
        finally:
            self.pool.putconn(conn)

    def _abort(self, conn: Connection[Any]) -> None:
        """Roll back whatever ``conn`` has open; close it when that is not certain."""
        if conn.closed:
            return
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")  # not through ``faults``: cleanup must not be injected
        except BaseException as exc:
            log.warning('postgres: rollback in schema "%s" failed, dropping the connection: %s', self.schema, exc)
            conn.close()
            if not isinstance(exc, Exception):
                raise
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.close()

    def close(self) -> None:
        """Close the pool (idempotent); later calls raise :class:`StorageIOError`."""
        with self._open_lock:
            self._closed = True
            if self._opened:
                self.pool.close()
