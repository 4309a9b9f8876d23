"""The write-behind writer of one live session (reference §2.5)."""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import attrs
import outcome
import trio

from harness.errors import FlushError, PersistenceError, WriterWedgedError
from harness.persistence._backend import Backend, GroupWrite, WriterLease
from harness.persistence._committer import CommitJob, GroupCommitter, refuse_abort, thread_starter
from harness.session import Event, Session
from harness.session._events import event_to_write_record

if TYPE_CHECKING:
    from harness.persistence._service import Fingerprint
    from harness.runtime import Warnings

log = logging.getLogger("harness.persistence")

#: Seconds a shielded wait for a blocking storage call (a batch write, a lease release
#: or renewal) may last. Past it the wait is abandoned (the thread runs on) and the
#: writer fails closed: whether the write landed is unknown. Read at each call, so a
#: test or an application may change it.
WRITE_WAIT_LIMIT: float = 30.0

#: The wall clock the other half of that bound is read on (seconds, monotonic). Read
#: at each call: a test that must not depend on the machine's speed injects its own
#: (a loaded machine may run a worker thread's hand-off late by seconds, issue 24 §5).
wall_clock: Callable[[], float] = time.monotonic

T = TypeVar("T")

#: Seconds the write-behind window task of a writer lingers with no window armed before
#: it ends (the next window starts a new one).
WINDOW_TASK_LINGER: Final = 5.0


class WaitOverrun(Exception):
    """A bounded storage wait overran :data:`WRITE_WAIT_LIMIT` (internal signal)."""


#: Lock releases get a worker thread at once, whatever else holds Trio's default
#: thread tokens: a release queued behind stuck calls, then abandoned by its bound,
#: would never run, and the session would stay locked for the life of the process.
RELEASE_THREADS: Final = trio.CapacityLimiter(math.inf)


async def release_lease(lease: WriterLease) -> None:
    """Release ``lease`` on a worker thread of its own (:data:`RELEASE_THREADS`),
    shielded and bounded like every storage call; an overrun is logged, and the
    thread still releases the lease when its call returns.

    Cancellation: shielded, so a cancelled caller still releases the lease and sees
    ``Cancelled`` at its next checkpoint. Ownership: the lease is consumed.

    Best effort: a release that fails is logged, not raised. Every event was already
    durable or reported by then, and a lock that could not be released is freed by
    the process's exit (JSONL ``flock``) or by the lease's expiry (SQLite,
    PostgreSQL), which fencing makes safe; raising here made a clean retirement look
    like lost events (found by the postgres chaos campaign)."""
    try:
        await run_storage_call(lease.release, limiter=RELEASE_THREADS)
    except WaitOverrun:
        log.warning("releasing a writer lock did not finish within %s s", WRITE_WAIT_LIMIT)
    except Exception as exc:
        log.warning("releasing a writer lock failed (freed at process exit or lease expiry): %r", exc)


async def run_storage_call(fn: Callable[[], T], *, limiter: trio.CapacityLimiter | None = None) -> T:
    """Run blocking ``fn`` on a worker thread, shielded from cancellation but bounded
    by :data:`WRITE_WAIT_LIMIT` seconds on the Trio clock *and* the wall clock (as
    :func:`actors.run_bounded`, so a test's autojumping ``MockClock`` cannot make a
    real write "overrun").

    Cancellation: the caller's cancellation does not interrupt the wait (the storage
    call either completes or fails; a cancelled caller gets ``Cancelled`` at its next
    checkpoint). Raises :class:`WaitOverrun` if the limit passes first; the thread is
    then abandoned and still runs ``fn`` to its end. A call still queued for a worker
    thread when the bound passes never runs.
    """
    # The common case costs one thread hop and nothing else: one shielded scope whose
    # deadline is the Trio-clock half of the bound. No watchdog task (a nursery, a
    # spawn and a cancellation per call were most of a durable single append's Trio
    # overhead, issue 15). Only when that deadline fires -- a real overrun, or a
    # virtual clock that jumped -- does the slow path below look at the wall clock.
    limit = WRITE_WAIT_LIMIT
    wall = wall_clock
    started = wall()
    deadline = trio.current_time() + limit
    tokens = limiter if limiter is not None else trio.to_thread.current_default_thread_limiter()
    while True:
        call = _BoundedCall(fn)
        with trio.CancelScope(shield=True, deadline=deadline):
            try:
                tokens.acquire_on_behalf_of_nowait(call)
            except trio.WouldBlock:
                # No free token (or callers queued before us): wait in line like any
                # ``to_thread`` call; a call still queued when the bound passes is
                # withdrawn below and never runs.
                result = await trio.to_thread.run_sync(call.run, abandon_on_cancel=True, limiter=limiter)
            else:
                result = await _hop(call, tokens)
            return result.unwrap()
        # The Trio deadline passed with the call still out.
        if not call.withdraw_if_queued():
            return await call.wait_out(started, limit, deadline, wall)
        # It never reached a worker thread (it was queued behind the limiter) and now
        # never will: if the wall clock says the bound has not passed (a virtual
        # clock jumped), queue it again, else give up on it.
        if wall() - started >= limit:
            raise WaitOverrun(f"storage call still queued after {limit} s")
        deadline = trio.current_time() + max(limit - (wall() - started), 0.0)


async def _hop(call: _BoundedCall[T], tokens: trio.CapacityLimiter) -> outcome.Outcome[T]:
    """Run ``call`` on a cached worker thread, holding a token of ``tokens`` (already
    taken on its behalf) until the thread is done: ``to_thread.run_sync(call.run,
    abandon_on_cancel=True)`` without its per-call machinery (a limiter wait, a context
    copy, a report-back task). A thread round trip is most of a durable single
    append's overhead on a small VM (issue 15: ~150 us through ``to_thread`` vs ~105
    us here).

    Cancellation: as ``abandon_on_cancel=True``: a cancellation abandons the wait at
    once (the caller's scope is shielded, so only its deadline can); the thread runs
    on and its token is returned when it ends."""
    task = trio.lowlevel.current_task()
    trio_token = trio.lowlevel.current_trio_token()
    waiting = True  # read and written on the Trio thread only

    def back(result: outcome.Outcome[outcome.Outcome[T]]) -> None:  # Trio thread
        nonlocal waiting
        tokens.release_on_behalf_of(call)
        if waiting:
            waiting = False
            trio.lowlevel.reschedule(task, result)

    def deliver(result: outcome.Outcome[outcome.Outcome[T]]) -> None:  # worker thread
        with contextlib.suppress(trio.RunFinishedError):
            trio_token.run_sync_soon(back, result)

    def abort(_: Any) -> trio.lowlevel.Abort:
        nonlocal waiting
        waiting = False  # abandoned: the thread's result is dropped, its token returned
        return trio.lowlevel.Abort.SUCCEEDED

    start = thread_starter()  # where ``to_thread`` finds it: the explorer's gate sees this hop
    try:
        start(call.run, deliver)
    except BaseException:
        tokens.release_on_behalf_of(call)
        raise
    return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]


class _BoundedCall(Generic[T]):
    """One storage call between the Trio side and a worker thread (see
    :func:`run_storage_call`): the thread runs it unless the Trio side withdrew it
    first, and reports its outcome to a Trio waiter only if one asked (the common
    case, a waiter still inside ``to_thread.run_sync``, needs no extra wake-up)."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._mutex = threading.Lock()
        self._started = False
        self._withdrawn = False
        self._outcome: outcome.Outcome[T] | None = None
        self._waiter: tuple[trio.lowlevel.TrioToken, trio.Event] | None = None

    def run(self) -> outcome.Outcome[T]:
        """Worker thread."""
        with self._mutex:
            if self._withdrawn:
                return outcome.Error(WaitOverrun("withdrawn before it started"))
            self._started = True
        result: outcome.Outcome[T] = outcome.capture(self._fn)
        with self._mutex:
            self._outcome = result
            waiter = self._waiter
        if waiter is not None:
            token, done = waiter
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)
        return result

    def withdraw_if_queued(self) -> bool:
        """Trio side, after the wait was cut: withdraw the call if no thread started
        it yet (True: it never runs)."""
        with self._mutex:
            if not self._started:
                self._withdrawn = True
            return self._withdrawn

    async def wait_out(self, started: float, limit: float, deadline: float, wall: Callable[[], float]) -> T:
        """Trio side: wait for a started call until the bound passes on both clocks;
        its result, or :class:`WaitOverrun` (the thread runs on, abandoned)."""
        done = trio.Event()
        with self._mutex:
            if self._outcome is None:
                self._waiter = (trio.lowlevel.current_trio_token(), done)
        while True:
            result = self._outcome
            if result is not None:
                return result.unwrap()
            remaining = limit - (wall() - started)
            if remaining <= 0 and trio.current_time() >= deadline:
                raise WaitOverrun(f"storage call still running after {limit} s")
            with trio.CancelScope(shield=True, deadline=trio.current_time() + max(remaining, 0.0)):
                await done.wait()


@attrs.frozen
class Leftover:
    """What a writer whose retirement failed still owes storage: just enough to retry
    (the header record, the unwritten records, where they go), not the session."""

    id: str
    header: dict[str, Any]
    pending: list[dict[str, Any]]
    materialized: bool
    durable: int  # events on disk before ``pending``
    #: A digest of those ``durable`` events, when known: a log rewritten with the same
    #: count is then told apart from the one the writer left (set by the coordinator).
    durable_digest: Fingerprint | None = None
    #: The writer that left it (its ``token``, not the writer: that would pin the
    #: session): a later successful retirement of that writer makes it stale.
    writer_token: object = attrs.field(default=None, eq=False, repr=False)


class SessionWriter:
    """Buffers a live session's events and writes them in order, one batch at a time.

    * Write-behind: the first event into an empty buffer arms one fixed window
      (``delay`` seconds); later events join it without resetting it. At the deadline the
      whole buffer is written as one batch.
    * :meth:`flush` is a barrier: it returns only when every event enqueued before
      the call is durable, or raises :class:`FlushError` (the batch is kept, in order,
      and retried by the next flush or window; it is never dropped or reordered).
    * A failed background write is logged once and pauses the window until the next
      enqueue. No failure of a background write escapes into the nursery.
    * Writes go through the persistence's :class:`~._committer.GroupCommitter` (its
      writer thread writes the batches of every session queued meanwhile in one round:
      group commit), waited for shielded (:meth:`GroupCommitter.wait_bounded`), bounded by
      :data:`WRITE_WAIT_LIMIT` on both clocks: a durable write is never abandoned
      half-way by a cancellation; a cancelled caller gets ``Cancelled`` once it
      returns. A write that overruns the bound *wedges* the writer: every later flush
      raises :class:`WriterWedgedError` (fail closed), and the lock is released by the
      abandoned round when (if) it finishes; a batch whose round had not started by
      then is withdrawn and never written.
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
        committer: GroupCommitter,
        before_first_write: Callable[[], Awaitable[None]] | None = None,
        warnings: Warnings | None = None,
    ) -> None:
        self.backend = backend
        self._committer = committer
        self.warnings = warnings  # the store's channel: background failures go there too
        self.session = session
        self.id = session.id
        self._header = session.header.to_record()
        self._nursery = nursery
        self._delay = delay
        self.materialized = materialized
        self.lease = lease
        self.durable = cursor  # seqs below are on disk
        self.token = object()  # names this writer in its Leftover (see Leftover.writer_token)
        self.queued = cursor  # next seq to buffer
        self.pending: list[dict[str, Any]] = []
        self._lock = trio.Lock()
        self._due = math.inf  # Trio-clock deadline of the armed window (inf: none armed)
        self._window_task = False  # the window task (:meth:`_run_windows`) is running
        self._window_scope: trio.CancelScope | None = None  # its sleep, while it sleeps
        self._paused = False
        self.failure: BaseException | None = None
        self.wedged: str | None = None  # why the writer fails closed
        self.closed = False
        self._before_first_write = before_first_write
        # Between the Trio side and a (possibly abandoned) write thread.
        self._thread_mutex = threading.Lock()
        self._in_thread = False  # a write thread is running (set by the thread itself)
        self._retired = False  # retire() ran: a write thread not started yet never will
        self._release_on_exit = False  # retired while a write thread was abandoned
        self.catch_up()

    # -- buffering -----------------------------------------------------------------------

    def catch_up(self) -> None:
        """Buffer every committed event not buffered yet (e.g. a seed, an end-seed)."""
        # The length first: the snapshot view is built only when there is something
        # to catch up on (every flush calls this; it usually has nothing to do).
        if self.queued >= self.session.seq or self.closed:
            return
        events = self.session.events
        if self.queued < len(events):
            self.pending.extend(map(event_to_write_record, events[self.queued :]))
            self.queued = len(events)
            self._arm()

    def enqueue(self, event: Event) -> None:
        """Buffer one committed event (see :meth:`enqueue_batch`)."""
        self.enqueue_batch((event,))

    def enqueue_batch(self, events: tuple[Event, ...]) -> None:
        """Buffer the events of one commit (consecutive seqs, in order): those not
        buffered yet; if the batch starts past the buffer (events committed before
        this writer listened), everything committed is caught up on instead. Arms the
        write-behind window once per batch."""
        if self.closed or not events:
            return
        first = events[0].seq
        queued = self.queued
        if first > queued:  # events committed before we were listening
            self.catch_up()
            return
        if first < queued:  # partly buffered already (a catch-up took them)
            events = events[queued - first :]
            if not events:
                return
        self.pending.extend(map(event_to_write_record, events))
        self.queued = queued + len(events)
        self._paused = False
        self._arm()

    def _disarm(self) -> None:
        # A flush takes over the armed window. The window task's sleep is left as it
        # is: woken at its old deadline it finds nothing due and sleeps on until the
        # next window. (Moving a cancel scope's deadline, or spawning and cancelling a
        # task, on every append + flush was a measurable share of a durable single
        # append, issue 15.) Once the writer is closed the task ends, so it does not
        # outlive the work (and pin a retired session in memory).
        self._due = math.inf
        if self.closed and self._window_scope is not None:
            self._window_scope.cancel()

    def _arm(self) -> None:
        if self._due != math.inf or self._paused or self.closed:
            return
        self._due = due = trio.current_time() + self._delay
        scope = self._window_scope
        if scope is not None:
            if scope.deadline > due:  # sleeping with no (or a later) deadline: wake it then
                scope.deadline = due
        elif not self._window_task:
            self._window_task = True
            self._nursery.start_soon(self._run_windows)
        # else: the window task is writing; its next sleep reads ``_due``.

    async def _run_windows(self) -> None:
        """The write-behind window task: sleeps until the armed window's deadline
        (``_due``), writes the buffer, sleeps again; ends when the writer closes or
        after :data:`WINDOW_TASK_LINGER` seconds with no window armed. Cancellation:
        ends the task (a write in progress is shielded)."""
        try:
            while not self.closed:
                # Disarmed, it lingers a while for the next window (a stream of
                # append + flush reuses it), then ends: an idle session holds no task.
                idle_until = trio.current_time() + WINDOW_TASK_LINGER
                with trio.CancelScope(deadline=min(self._due, idle_until)) as scope:
                    self._window_scope = scope
                    await trio.sleep_forever()
                self._window_scope = None
                now = trio.current_time()
                if self._due == math.inf and now >= idle_until:
                    return  # nothing armed for a while; the next window spawns a new task
                if self.closed or now < self._due:
                    continue  # closed, disarmed (a flush took over) or re-armed later
                self._due = math.inf
                await self._window_write()
        finally:
            self._window_scope = None
            self._window_task = False

    async def _window_write(self) -> None:
        try:
            await self._write_some()
        except Exception as exc:
            # Never into the nursery: a background failure must not tear the runtime
            # down. It is retained (self.failure) and surfaces at the next flush.
            self._paused = True
            cause = exc.__cause__ or exc
            message = (
                f'{self.backend.name}: background write for session "{self.id}" failed '
                f"(buffered events retained): {cause}"
            )
            if self.warnings is None:
                log.warning("%s", message)
            else:
                self.warnings.report(
                    log, "write-failed", "background-write", message, session_id=self.id, error=cause
                )

    # -- writing ---------------------------------------------------------------------------

    async def flush(self) -> None:
        """Barrier: everything enqueued before the call *and while it runs* is durable
        when it returns (reference §2.5: concurrent callers share the barrier, and
        events enqueued during a write are drained by the same barrier).

        Raises :class:`FlushError` (chained to the cause) while writes fail, and
        :class:`WriterWedgedError` for good once a write overran its bound. Cancelling
        the caller abandons the wait, never a write in progress.
        """
        self._disarm()
        while self.durable < self.queued:
            await self._write_some()

    async def _write_some(self) -> None:
        # The lock as ``async with self._lock`` would take it, minus the schedule point
        # of an uncontended acquire when a write follows: the write's wait is one (an
        # extra scheduler pass per durable flush, issue 26). A cancellation is still
        # seen here first; a path that writes nothing keeps its schedule point.
        await trio.lowlevel.checkpoint_if_cancelled()
        lock = self._lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
            yielded = True
        else:
            yielded = False
        try:
            try:
                wrote = await self._write_locked()
            finally:
                lock.release()
        except Exception:
            if not yielded:  # a failure keeps the schedule point it had (a rare path)
                await trio.lowlevel.cancel_shielded_checkpoint()
            raise
        if not (wrote or yielded):
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def _write_locked(self) -> bool:
        """Under the lock: write the buffer as one batch; whether a write was waited
        for (False: nothing to write). Raises as :meth:`flush` says."""
        if self.wedged is not None:
            raise WriterWedgedError(
                f'{self.backend.name}: session "{self.id}" fails closed: {self.wedged} '
                f"({len(self.pending)} event(s) not known to be durable)",
                session_id=self.id,
            )
        if not self.pending:
            return False
        if self._before_first_write is not None:
            try:
                await self._before_first_write()
            except Exception as exc:
                # E.g. the id is stored and the live log does not continue it: a
                # typed flush failure like any refused write; retried by the next.
                raise self._failed(exc) from exc
            self._before_first_write = None
        batch = list(self.pending)
        try:
            # Shielded on purpose: the batch either lands whole (and the buffer is
            # trimmed) or fails (and is kept); never "unknown" -- unless the bound
            # passes, and then the writer says so forever (wedged).
            await self._commit(batch)
        except WaitOverrun:
            raise self._wedge(len(batch)) from None
        except Exception as exc:
            # Any failure (storage, encoding, a lost lease, a bug) is a typed flush
            # failure with the batch retained, never a crash of the caller's task.
            raise self._failed(exc) from exc
        self._landed(len(batch))
        return True

    async def flush_direct(self, shielded: bool = False) -> None:
        """:meth:`flush` for a caller that has just passed a cancel point with no
        yield since (``Store.flush`` through the persistence's direct flush listener,
        :class:`~harness.runtime._listeners.DirectFlush`): the same barrier, errors and
        cancellation contract, without a cancel point of its own on entry.

        The common case -- something to write, the lock free, no first-write check
        pending, not wedged -- is :meth:`_write_locked` and :meth:`_commit` in this one
        frame, parked directly in the committer's bounded wait (issue 26: each
        coroutine frame between the flush and its wait is paid on the way down and up
        again, per durable message). Anything else, and events enqueued while the
        batch was written, take :meth:`flush`.

        ``shielded``: not cancellable at all (the flush of ``append(...,
        durable=True)``, whose append is applied already): :meth:`flush`, where taken,
        runs in a shielded scope; the common case needs none (its wait refuses
        cancellation)."""
        self._disarm()
        if self.durable >= self.queued:
            return
        lock = self._lock
        if self.wedged is not None or self._before_first_write is not None or not self.pending or lock.locked():
            await self._flush_maybe_shielded(shielded)
            return
        lock.acquire_nowait()
        try:
            batch = list(self.pending)
            try:
                job, started, limit, deadline = self._submit(batch)
                # GroupCommitter.wait_bounded, inlined: its result cannot be there yet
                # (a round completes on this thread, after a yield).
                self._committer.watch(job, deadline)
                result = await trio.lowlevel.wait_task_rescheduled(refuse_abort)
                if result is None:  # the Trio-clock bound passed: as _commit goes on
                    await self._wait_out(job, started, limit)
                else:
                    result.unwrap()
            except WaitOverrun:
                raise self._wedge(len(batch)) from None
            except Exception as exc:
                raise self._failed(exc) from exc
            self._landed(len(batch))
        finally:
            lock.release()
        if self.durable < self.queued:
            await self._flush_maybe_shielded(shielded)  # enqueued while the batch was written (rare)

    async def _flush_maybe_shielded(self, shielded: bool) -> None:
        if shielded:
            with trio.CancelScope(shield=True):
                await self.flush()
        else:
            await self.flush()

    def _landed(self, count: int) -> None:
        """The first ``count`` buffered events are durable: trim them."""
        del self.pending[:count]
        self.durable += count
        self.failure = None

    def _wedge(self, count: int) -> WriterWedgedError:
        """A write of ``count`` events overran its bound: the writer fails closed from
        now on; the error to raise."""
        self.wedged = (
            f"a write of {count} event(s) did not return within {WRITE_WAIT_LIMIT} s (it may still land)"
        )
        log.warning('%s: session "%s": %s; the writer fails closed', self.backend.name, self.id, self.wedged)
        return WriterWedgedError(
            f'{self.backend.name}: writing session "{self.id}" did not finish within {WRITE_WAIT_LIMIT} s; '
            f"{len(self.pending)} event(s) are not known to be durable and the writer fails closed",
            session_id=self.id,
        )

    def _failed(self, exc: Exception) -> FlushError:
        """Remember ``exc`` and describe it as the flush failure (the batch is kept)."""
        self.failure = exc
        return FlushError(
            f'{self.backend.name}: writing session "{self.id}" failed ({len(self.pending)} event(s) retained): {exc}',
            session_id=self.id,
        )

    async def _commit(self, batch: list[dict[str, Any]]) -> None:
        """Hand ``batch`` to the group committer and wait until its round wrote it:
        shielded, bounded by :data:`WRITE_WAIT_LIMIT` on the Trio clock *and* the wall
        clock (as :func:`run_storage_call`: an autojumping ``MockClock`` cannot make a
        real write "overrun"). Raises the batch's own error, or :class:`WaitOverrun`
        (the batch is withdrawn if its round has not reached it, else abandoned: the
        round runs on and this writer's part of it ends as :meth:`_thread_finish`
        says).

        Cancellation: shielded; the round is never cancelled (other sessions' batches
        are in it too); a cancelled caller sees ``Cancelled`` at its next checkpoint."""
        job, started, limit, deadline = self._submit(batch)
        result = await self._committer.wait_bounded(job, deadline)
        if result is not None:
            result.unwrap()
            return
        await self._wait_out(job, started, limit)

    def _submit(self, batch: list[dict[str, Any]]) -> tuple[CommitJob, float, float, float]:
        """Hand ``batch`` to the group committer: its job, the wall-clock start of
        the bound, the bound (:data:`WRITE_WAIT_LIMIT`, read once per write) and its
        first Trio-clock deadline."""
        limit = WRITE_WAIT_LIMIT
        started = wall_clock()
        deadline = trio.current_time() + limit
        job = CommitJob(lambda: self._thread_prepare(batch), self._thread_finish)
        self._committer.submit(job)
        return job, started, limit, deadline

    async def _wait_out(self, job: CommitJob, started: float, limit: float) -> None:
        """:meth:`_commit` after a bounded wait for ``job`` returned with its Trio-clock
        deadline passed: its outcome if it came back meanwhile; else, while the wall
        clock (from ``started``) says the bound ``limit`` has not passed, wait again;
        else withdraw or abandon the job and raise :class:`WaitOverrun`.
        Cancellation: as :meth:`_commit`."""
        committer = self._committer
        wall = wall_clock
        while True:
            if job.result is not None:  # it came back as the deadline fired
                job.result.unwrap()
                return
            if wall() - started >= limit:
                state = "withdrawn before its round" if committer.withdraw(job) else "still running"
                raise WaitOverrun(f"group commit of session {self.id!r}: {state} after {limit} s")
            # A virtual clock jumped: the wall clock says the bound has not passed.
            deadline = trio.current_time() + max(limit - (wall() - started), 0.0)
            result = await committer.wait_bounded(job, deadline)
            if result is not None:
                result.unwrap()
                return

    def _thread_prepare(self, batch: list[dict[str, Any]]) -> GroupWrite:
        """Writer thread, as its round reaches this batch: take the lock if the writer
        holds none, and say what to write. If the Trio side gave up waiting and retired
        meanwhile, :meth:`_thread_finish` releases the lease it left here (only then is
        nothing in flight).

        A round that reaches the batch only after a *wedged* writer retired writes
        nothing: nobody waits for it and the writer is gone. A writer that is not
        wedged still writes after a retirement: a second :meth:`retire` (``aclose``
        retrying a cancelled or failed one) waits for this very batch, and must not be
        told "durable" for a batch that was skipped."""
        with self._thread_mutex:
            if self._retired and self.wedged is not None:
                raise WriterWedgedError(
                    f'{self.backend.name}: session "{self.id}": a write started after its wedged writer '
                    "retired; nothing was written",
                    session_id=self.id,
                )
            self._in_thread = True
        if self.lease is None:
            self.lease = self.backend.acquire_writer(self._header)
        return GroupWrite(self.id, self._header, batch, self.materialized, self.lease)

    def _thread_finish(self, error: BaseException | None) -> None:
        """Writer thread, after the round (whatever its outcome)."""
        if error is None:
            self.materialized = True
        with self._thread_mutex:
            self._in_thread = False
            orphan = None
            if self._release_on_exit:
                # Retired while this batch was abandoned: whatever lock the writer
                # holds now (perhaps taken by this very round) is ours to release.
                orphan, self.lease = self.lease, None
        if orphan is not None:
            try:
                orphan.release()
            except Exception as exc:
                log.warning('%s: releasing the lease of wedged session "%s" failed: %s', self.backend.name, self.id, exc)

    async def retire(self) -> None:
        """Flush, then release the writer lock. The lock is released even if the final
        flush fails (the error propagates after); a wedged writer's lock is released by
        its abandoned write thread when that finishes.

        Calling it again (after a failure or a cancellation) retries the flush under a
        fresh lock, released again when it returns; no new events are buffered once it
        was called.

        Cancellation: as :meth:`flush`; the lock release is shielded (and bounded). A
        cancelled retirement leaves the unwritten events buffered (and the lock
        released) for the next call.
        """
        try:
            await self.flush()
        finally:
            self.closed = True
            self._disarm()
            with self._thread_mutex:
                self._retired = True
                if self._in_thread:
                    # An abandoned (wedged) write thread may still take or use the
                    # lock: it releases it when it ends.
                    self._release_on_exit = True
                    lease = None
                else:
                    lease, self.lease = self.lease, None
            if lease is not None:
                await release_lease(lease)

    def leftover(self) -> Leftover:
        """What is needed to retry a failed retirement (drop the writer after this)."""
        return Leftover(
            self.id, self._header, list(self.pending), self.materialized, self.durable, writer_token=self.token
        )


def retry_leftover(backend: Backend, leftover: Leftover) -> None:
    """Blocking: write a failed retirement's events under a fresh lock, if the stored
    log still ends where the writer left it (else nothing is written: the log moved on,
    e.g. the session was resumed meanwhile, and appending would fork its history).
    With a ``durable_digest`` the stored events must be exactly the ones the writer
    knew durable, not only as many (a log deleted and written again, or rewritten by
    another process, with the same count)."""
    sid = leftover.id
    lease = backend.acquire_writer(leftover.header)
    try:
        if leftover.materialized:
            records = backend.load(sid).records
            digest = leftover.durable_digest
            same_count = len(records) == leftover.durable
            if not same_count or (digest is not None and not digest.equals(records)):
                raise PersistenceError(
                    f'{backend.name}: session "{sid}" moved on since its retirement failed '
                    f"({len(records)} stored event(s), expected {leftover.durable}"
                    f"{', not the ones it wrote' if same_count else ''}): "
                    f"{len(leftover.pending)} event(s) dropped",
                    session_id=sid,
                )
            backend.append(sid, leftover.pending, lease=lease)
        else:
            backend.materialize(leftover.header, leftover.pending, lease=lease)
    finally:
        lease.release()
