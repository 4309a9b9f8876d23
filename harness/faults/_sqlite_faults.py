"""Statement-level faults for the SQLite backend."""

from __future__ import annotations

import sqlite3
import threading
from typing import Literal

from harness.persistence._files import SimulatedCrash

_ERRORS: dict[str, tuple[str, int, str]] = {
    "full": ("database or disk is full", sqlite3.SQLITE_FULL, "SQLITE_FULL"),
    "ioerr": ("disk I/O error", sqlite3.SQLITE_IOERR, "SQLITE_IOERR"),
}


class SqliteFaults:
    """Pass as ``SqliteBackend(path, faults=...)``: the backend calls :meth:`before`
    with every statement it is about to execute (``BEGIN``/``COMMIT``/``ROLLBACK``,
    PRAGMAs and their read-backs included), in order. A batch's insert is one statement
    (``INSERT INTO events …``), however many ``executemany`` segments it is bound in.

    Statements are counted 1-based (:attr:`count`, :attr:`statements`). The
    ``fail_at``-th raises ``sqlite3.OperationalError`` as SQLite would for a full disk
    (``error="full"``, ``SQLITE_FULL``) or an I/O error (``"ioerr"``, ``SQLITE_IOERR``);
    recorded in :attr:`injected` as ``(number, sql)``. Set :attr:`fail_at` again to fail
    a later statement.

    ``crash_at``: the process "dies" at that statement: it and every later one raise
    :class:`SimulatedCrash` (the statement does not run). SQLite's own journal gives
    the durability, so there is nothing to rewrite after the run; the backend drops its
    connection (rolling back the open transaction, as the OS would on process death)
    and its in-process lease tokens. Thread-safe.
    """

    def __init__(
        self,
        *,
        fail_at: int | None = None,
        error: Literal["full", "ioerr"] = "full",
        crash_at: int | None = None,
    ) -> None:
        if error not in _ERRORS:
            raise ValueError(f"unknown SQLite fault {error!r} (expected 'full' or 'ioerr')")
        self.fail_at = fail_at
        self.error: Literal["full", "ioerr"] = error
        self.crash_at = crash_at
        self.crashed = False
        self.count = 0
        self.statements: list[str] = []
        self.injected: list[tuple[int, str]] = []
        self._mutex = threading.Lock()

    def before(self, sql: str) -> None:
        """Count ``sql``; raise the injected failure or crash if it is this one."""
        with self._mutex:
            if self.crashed:
                raise SimulatedCrash(f"the world stopped before: {sql}")
            self.count += 1
            self.statements.append(sql)
            if self.crash_at is not None and self.count == self.crash_at:
                self.crashed = True
                raise SimulatedCrash(f"killed at statement {self.count}: {sql}")
            if self.fail_at is not None and self.count == self.fail_at:
                self.injected.append((self.count, sql))
                message, code, name = _ERRORS[self.error]
                exc = sqlite3.OperationalError(message)
                exc.sqlite_errorcode = code
                exc.sqlite_errorname = name
                raise exc
