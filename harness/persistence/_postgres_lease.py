"""Writer leases of the PostgreSQL backend: the lease handle, holder identity and
liveness, and the keeper thread that renews held leases while their holder lives.

A lease row (see :mod:`harness.persistence._postgres_schema`) is *live* while it has
a token, its ``expires`` (server clock) is in the future, and its holder is not
provably dead. Provably dead is decidable only for a holder of this backend's host
name *and* this process's pid scope (boot id, pid and time namespaces: see
:mod:`harness.persistence._liveness`): its pid is gone, or now belongs to a process with
another start time. A holder anywhere else — another host, a container or pod sharing
the host's name, a row without a scope — or one that is merely stopped (SIGSTOP),
partitioned or slow is respected until its lease expires. Its keeper is stopped with
it, so the lease does expire; its writes are then refused by the fence.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from harness.persistence._backend import WriterLease
from harness.persistence._liveness import holder_dead as _holder_dead
from harness.persistence._liveness import identity

__all__ = ["LIVE_TOKENS", "LeaseKeeper", "PgLease", "describe", "holder", "holder_dead", "identity"]

log = logging.getLogger("harness.persistence")

#: Tokens of leases this process holds and has not released: exact liveness of a
#: lease whose holder is this very process (a pid check would always say "alive").
LIVE_TOKENS: set[str] = set()

def holder_dead(
    my_host: str, token: str, host: str | None, pid: int | None, start: int | None, scope: str | None
) -> bool:
    """Whether the holder of a lease row is provably dead (see the module docstring)."""
    return _holder_dead(my_host, LIVE_TOKENS, token, host, pid, start, scope)


def holder(row: tuple[Any, ...]) -> dict[str, Any]:
    """The public description of a lease row ``(fence, token, host, pid, start_time,
    since_ms, expires_ms, remaining_ms, pid_scope)``."""
    return {
        "pid": row[3],
        "host": row[2],
        "since": row[5],
        "startTime": row[4],
        "expires": row[6],
        "fence": row[0],
        "pidScope": row[8],
    }


def describe(row: tuple[Any, ...]) -> str:
    return f"process {row[3]} on {row[2]}"


class PgLease(WriterLease):
    """A PostgreSQL writer lease: session, random token, fence. ``release`` is
    idempotent; ``renew`` raises :class:`~harness.errors.LeaseLostError` once the
    lease was taken over."""

    def __init__(
        self,
        owner: object,
        sid: str,
        token: str,
        fence: int,
        release: Callable[[PgLease], None],
        renew: Callable[[PgLease], None],
    ) -> None:
        self.owner = owner  # the backend that handed it out (writes check it)
        self.session_id = sid
        self.token = token
        self.fence = fence
        self._release: Callable[[PgLease], None] | None = release
        self._renew = renew

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release(self)

    def renew(self) -> None:
        self._renew(self)

    def __repr__(self) -> str:
        return f"<postgres lease {self.session_id!r} fence {self.fence}>"


class LeaseKeeper:
    """Renews every held lease each ``interval`` seconds on a daemon thread, which
    runs only while leases are held. ``renew_all(leases)`` renews them in one
    statement and returns the tokens it no longer found (lost: dropped here; their
    next write is refused by the fence anyway). A storage error is logged and retried
    at the next round — the lease survives up to its TTL meanwhile.

    Wall-clock time, independent of Trio: a Trio program that blocks its event loop
    keeps its leases; a stopped or dead process does not."""

    def __init__(self, name: str, interval: float, renew_all: Callable[[list[PgLease]], set[str]]) -> None:
        self._name = name
        self._interval = interval
        self._renew_all = renew_all
        self._held: dict[str, PgLease] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Condition()

    def hold(self, lease: PgLease) -> None:
        with self._wake:
            self._held[lease.token] = lease
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def drop(self, token: str) -> None:
        with self._wake:
            self._held.pop(token, None)
            self._wake.notify_all()

    def forget(self) -> None:
        """Forget every lease without waiting (a dead process renews nothing)."""
        with self._wake:
            self._held.clear()
            self._wake.notify_all()

    def stop(self) -> None:
        """Forget every lease and wait (bounded) for a renewal under way to end."""
        with self._wake:
            self._held.clear()
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10.0)

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._held:
                    self._wake.wait(self._interval)
                leases = list(self._held.values())
                if not leases:
                    self._thread = None
                    return
            try:
                lost = self._renew_all(leases)
            except Exception as exc:
                log.warning("postgres: renewing %d lease(s) failed, retrying: %s", len(leases), exc)
                continue
            if lost:
                with self._wake:
                    for lease in leases:
                        if lease.token in lost and self._held.pop(lease.token, None) is not None:
                            log.warning(
                                'postgres: the lease of session "%s" (fence %d) was taken over',
                                lease.session_id,
                                lease.fence,
                            )
