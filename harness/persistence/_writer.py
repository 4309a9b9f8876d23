"""The write-behind writer of one live session (reference §2.5)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from harness.errors import FlushError, HarnessError
from harness.persistence._backend import Backend, WriterLease
from harness.session import Event, Session, event_to_record

log = logging.getLogger("harness.persistence")


class SessionWriter:
    """Buffers a live session's events and writes them in order, one batch at a time.

    * Write-behind: the first event into an empty buffer arms one fixed window
      (``delay`` seconds); later events join it without resetting it. At the deadline the
      whole buffer is written as one batch.
    * :meth:`flush` is a barrier: it returns only when every event enqueued before
      the call is durable, or raises :class:`FlushError` (the batch is kept, in order,
      and retried by the next flush or window; it is never dropped or reordered).
    * A failed background write is logged once and pauses the window until the next
      enqueue.
    * Writes run on a worker thread inside a shielded scope: a durable write is
      never abandoned half-way; a cancelled caller gets ``Cancelled`` once it returns.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        session: Session,
        nursery: trio.Nursery,
        delay: float,
        materialized: bool,
        cursor: int,
        lease: WriterLease | None,
        before_first_write: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.backend = backend
        self.session = session
        self.id = session.id
        self._nursery = nursery
        self._delay = delay
        self.materialized = materialized
        self.lease = lease
        self.durable = cursor  # seqs below are on disk
        self.queued = cursor  # next seq to buffer
        self.pending: list[dict[str, Any]] = []
        self._lock = trio.Lock()
        self._window = 0  # generation of the armed window (0: none armed)
        self._window_scope: trio.CancelScope | None = None
        self._paused = False
        self.failure: BaseException | None = None
        self.closed = False
        self._before_first_write = before_first_write
        self.catch_up()

    # -- buffering -----------------------------------------------------------------------

    def catch_up(self) -> None:
        """Buffer every committed event not buffered yet (e.g. a seed, an end-seed)."""
        events = self.session.events
        if self.queued < len(events):
            self.pending.extend(event_to_record(e) for e in events[self.queued :])
            self.queued = len(events)
            self._arm()

    def enqueue(self, event: Event) -> None:
        if event.seq < self.queued or self.closed:
            return
        if event.seq > self.queued:  # events committed before we were listening
            self.catch_up()
            return
        self.pending.append(event_to_record(event))
        self.queued += 1
        self._paused = False
        self._arm()

    def _disarm(self) -> None:
        # A flush takes over the armed window: stop its sleep so that the task does
        # not outlive the work (and pin a retired session in memory).
        self._window = 0
        if self._window_scope is not None:
            self._window_scope.cancel()
            self._window_scope = None

    def _arm(self) -> None:
        if self._window or self._paused or self.closed:
            return
        self._window = generation = id(object())
        self._nursery.start_soon(self._run_window, generation)

    async def _run_window(self, generation: int) -> None:
        with trio.CancelScope() as scope:
            self._window_scope = scope
            await trio.sleep(self._delay)
        if self._window_scope is scope:
            self._window_scope = None
        if self._window != generation:
            return  # a flush took over (and cancelled the sleep)
        self._window = 0
        try:
            await self._write_some()
        except FlushError as exc:
            self._paused = True
            log.warning(
                '%s: background write for session "%s" failed (buffered events retained): %s',
                self.backend.name,
                self.id,
                exc.__cause__ or exc,
            )

    # -- writing ---------------------------------------------------------------------------

    async def flush(self) -> None:
        """Barrier: everything enqueued before the call is durable when it returns.

        Raises :class:`FlushError` (chained to the cause) while writes fail. Cancelling
        the caller abandons the wait, never a write in progress.
        """
        self._disarm()
        target = self.queued
        while self.durable < target:
            await self._write_some()

    async def _write_some(self) -> None:
        async with self._lock:
            if not self.pending:
                return
            if self._before_first_write is not None:
                await self._before_first_write()
                self._before_first_write = None
            batch = list(self.pending)
            try:
                with trio.CancelScope(shield=True):
                    # Shielded on purpose: the batch either lands whole (and the
                    # buffer is trimmed) or fails (and is kept); never "unknown".
                    await trio.to_thread.run_sync(self._write_sync, batch)
            except (HarnessError, OSError) as exc:
                self.failure = exc
                raise FlushError(
                    f'{self.backend.name}: writing session "{self.id}" failed '
                    f"({len(self.pending)} event(s) retained): {exc}",
                    session_id=self.id,
                ) from exc
            del self.pending[: len(batch)]
            self.durable += len(batch)
            self.failure = None

    def _write_sync(self, batch: list[dict[str, Any]]) -> None:
        if self.lease is None:
            self.lease = self.backend.acquire_writer(self.session.header.to_record())
        if self.materialized:
            self.backend.append(self.id, batch)
        else:
            self.backend.materialize(self.session.header.to_record(), batch)
            self.materialized = True

    async def retire(self) -> None:
        """Flush, then release the writer lock. The lock is released even if the final
        flush fails (the error propagates after).

        Cancellation: as :meth:`flush`; the lock release is shielded.
        """
        try:
            await self.flush()
        finally:
            self.closed = True
            self._disarm()
            lease, self.lease = self.lease, None
            if lease is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(lease.release)
