"""A SQLite writer lease's row in the attached lease file: its columns, its liveness
(expiry, a holder provably dead: :mod:`harness.persistence._liveness`), how it names
its holder in errors, and the :class:`~harness.persistence._backend.WriterLease` a
backend hands out for it (see :mod:`harness.persistence._sqlite`)."""

from __future__ import annotations

import socket
from typing import Any, Protocol

from harness.persistence._backend import WriterLease
from harness.persistence._liveness import holder_dead
from harness.persistence._sqlite_schema import LEASE_SCHEMA

_LEASE_COLUMNS = "fence, token, host, pid, start_time, since, expires, pid_scope"
_LEASES = f"{LEASE_SCHEMA}.leases"


class LeaseOwner(Protocol):
    """The backend a lease was taken from (:class:`~harness.persistence._sqlite_leases.SqliteLeases`)."""

    def _release(self, sid: str, token: str) -> None: ...

    def _renew(self, lease: _LeaseRow) -> None: ...


# Tokens of leases this process holds (not released, not lost to a simulated crash):
# the exact liveness test for a lease whose holder is this very process.
_LIVE_TOKENS: set[str] = set()


class _LeaseRow(WriterLease):
    def __init__(self, backend: LeaseOwner, sid: str, token: str, fence: int) -> None:
        self._backend: LeaseOwner | None = backend
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
