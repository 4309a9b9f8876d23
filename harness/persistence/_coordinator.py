"""The persistence coordinator: makes a store's sessions durable (reference §2)."""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import math
import sys
import weakref
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from itertools import repeat
from typing import Any, final

import attrs
import orjson
import trio

from harness.errors import (
    EventError,
    HarnessError,
    PersistenceArgumentError,
    PersistenceCloseError,
    PersistenceError,
    PreparationDisposedError,
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    SessionLiveError,
    SessionLockedError,
    SessionLogExistsError,
    SessionNotLiveError,
)
from harness.persistence._backend import Backend, StoredLines, StoredLog, WriterLease, header_record
from harness.persistence._committer import GroupCommitter
from harness.persistence._restore import build_session as build_session
from harness.persistence._restore import check_restores
from harness.persistence._service import (
    Fingerprint,
    ServiceMixin,
    _canonical,
    _EnvelopeState,
    raw_log_suffix,
    refuse_legacy,
    reproduces,
)
from harness.persistence._writer import (
    Leftover,
    SessionWriter,
    release_lease,
    retry_leftover,
    run_storage_call,
)
from harness.runtime import SessionHandle, Store
from harness.runtime._listeners import DirectFlush
from harness.session import (
    KNOWN_EVENT_TYPES,
    Session,
    check_lookup_id,
    closers_for_records,
    event_to_record,
    gc_paused,
)
from harness.session._json import js_string

log = logging.getLogger("harness.persistence")


@final
class SessionPreparation:
    """An unpublished session restored from storage, owned by whoever holds this.

    The session was built in restore mode (no copy) from the stored events plus any
    crash-repair closers, which are already durable. The preparation holds the
    session's writer lock. :meth:`dispose` is idempotent: it releases everything the
    preparation held, unless the session was published (the live writer then owns
    the lock). Every concurrent caller of ``dispose`` waits for the same release.
    """

    def __init__(self, persistence: Persistence, session: Session, lease: WriterLease, cursor: int, repaired: int) -> None:
        self._persistence = persistence
        self.session = session
        self.cursor = cursor  # events durable on disk (stored + closers)
        self.repaired = repaired  # how many closers repair appended
        self._lease: WriterLease | None = lease
        self.published = False
        self.disposed = False
        self._released = trio.Event()

    @property
    def id(self) -> str:
        return self.session.id

    def _claim(self) -> WriterLease:
        lease, self._lease = self._lease, None
        assert lease is not None
        self.published = True
        self._persistence._prep_counts[1] += 1
        self._released.set()
        return lease

    async def dispose(self) -> None:
        """Release the writer lock (unless published). Idempotent; shielded (and
        bounded by ``WRITE_WAIT_LIMIT``): a cancelled caller still leaves the lock
        released. A disposed preparation can no longer be published."""
        if self.disposed:
            await self._released.wait()
            return
        self.disposed = True
        persistence = self._persistence
        if not self.published:
            persistence._prep_counts[2] += 1
            # Remembered while this preparation lives, so that the store's created
            # listener refuses its session too (not only publish()).
            persistence._disposed[id(self.session)] = self
        lease, self._lease = self._lease, None
        try:
            if lease is not None:
                await release_lease(lease)
        finally:
            # The id stays reserved until the lock is released: a prepare or load of it
            # meanwhile waits for ``_released`` instead of meeting this process's own
            # lock (SessionLockedError).
            if persistence._reserved.get(self.id) is self:
                del persistence._reserved[self.id]
            self._released.set()


@attrs.frozen
class PreparationRecord:
    """How many preparations a :class:`Persistence` made (``prepared``), how many of
    them were published (their session went live) and how many were disposed
    unpublished; ``outstanding`` are the ones neither yet (held: their lock with
    them). Once everything settled, ``prepared == published + disposed``: a late
    preparation (its caller gone) is always disposed, never left holding its lock."""

    prepared: int
    published: int
    disposed: int

    @property
    def outstanding(self) -> int:
        return self.prepared - self.published - self.disposed


@final
class Persistence(ServiceMixin):
    """Durable sessions for one store. Get one with :func:`open_persistence`.

    The store's listeners feed it: ``created`` starts a writer for the session (or
    claims a prepared one's lock), ``event`` buffers, ``flush`` is the durability
    barrier, ``disposed`` retires the writer (flush, then release the lock).
    """

    def __init__(self, store: Store, backend: Backend, nursery: trio.Nursery, *, write_delay: float) -> None:
        self.store = store
        self.backend = backend
        self._nursery = nursery
        self._delay = write_delay
        # Every writer's batches go through it: one writer thread, group commit.
        self.committer = GroupCommitter(backend)
        self._writers: dict[str, SessionWriter] = {}
        self._reserved: dict[str, SessionPreparation] = {}
        # id(session) -> its disposed preparation; weak: the entry lives exactly as
        # long as the preparation (and so its session), so ids cannot be reused.
        self._disposed: weakref.WeakValueDictionary[int, SessionPreparation] = weakref.WeakValueDictionary()
        self._retiring: set[SessionWriter] = set()
        self._prep_counts = [0, 0, 0]  # prepared, published, disposed unpublished
        # Failed retirements: only what a retry needs (not the session).
        self._leftovers: list[Leftover] = []
        # Retirement failures nothing can retry (a wedged write): reported by aclose.
        self._unrecoverable: list[PersistenceError] = []
        # id -> every incarnation still retiring, oldest first.
        self._retirements: dict[str, list[tuple[SessionWriter, trio.Event]]] = {}
        self._init_service()
        self._unsubscribe = [
            store.on_created(self._on_created),
            store.on_event_batch(self._on_events),
            store.on_flush(DirectFlush(self._on_flush, self._flush_direct)),
            store.on_disposed(self._on_disposed),
            store.add_pre_commit_hook(self._refuse_unreadable),
        ]

    @property
    def preparations(self) -> PreparationRecord:
        """The public record of this persistence's preparations (a snapshot)."""
        prepared, published, disposed = self._prep_counts
        return PreparationRecord(prepared, published, disposed)

    # -- listeners -----------------------------------------------------------------------

    def _writer_for(self, handle: SessionHandle) -> SessionWriter:
        session = handle._entry.session
        writer = self._writers.get(handle.id)
        if writer is not None and writer.session is session:
            return writer
        disposed = self._disposed.get(id(session))
        if disposed is not None and disposed.session is session:
            raise PreparationDisposedError(
                f'cannot publish session "{handle.id}": its preparation was disposed (its lock is released; '
                "prepare the session again)",
                session_id=handle.id,
            )
        if handle.id in self._cold_loads:
            raise SessionLockedError(
                f'cannot publish session "{handle.id}": persisted state already owns this identity',
                session_id=handle.id,
            )
        reserved = self._reserved.get(handle.id)
        if reserved is not None:
            if reserved.session is not session:
                raise SessionLockedError(
                    f'cannot publish session "{handle.id}": persisted state already owns this identity',
                    session_id=handle.id,
                )
            del self._reserved[handle.id]
            # An ownerless state a load left is this session's now (reference: the
            # attach binds the owner); it must not outlive it as a stale claim check.
            self._states.pop(handle.id, None)
            writer = self._new_writer(session, materialized=True, cursor=reserved.cursor, lease=reserved._claim())
        elif (claimed := self._claim_state(handle.id, session)) is not None:
            # An envelope session of this service (create/append): the live session's
            # seed reproduced it, so it continues the stored log; the stored header wins.
            claim_box: list[SessionWriter] = []

            async def verify_claim() -> None:
                await self._verify_claim(claim_box[0], claimed)

            writer = self._new_writer(
                session,
                materialized=claimed.materialized,
                cursor=claimed.cursor,
                lease=None,
                before_first_write=verify_claim if claimed.materialized else None,
            )
            writer._header = dict(claimed.meta)
            claim_box.append(writer)
        else:
            sid = handle.id
            box: list[SessionWriter] = []

            async def before_first_write() -> None:
                await self._wait_retired(sid, box[0])
                await self._adopt_stored_prefix(box[0])

            writer = self._new_writer(
                session, materialized=False, cursor=0, lease=None, before_first_write=before_first_write
            )
            box.append(writer)
        self._writers[handle.id] = writer
        return writer

    async def _adopt_stored_prefix(self, writer: SessionWriter) -> None:
        """Reference §2.4 case 3 (HMR adoption): a new live session whose id is already
        stored (and not tracked here) continues that log if the stored events are a prefix
        of its own: a torn tail is cut (no closers: the live turn stays open), the writer
        takes the lock and writes only the rest, under the stored header (it wins, as in
        a claim). Otherwise its first write fails with the reference's id-collision
        message (a log under another cwd keeps the first write's ``SessionIdInUseError``).

        The decision is taken on what is stored *under the lock*: the log is read, the
        lock taken, and if the revision moved meanwhile (another process appended) the
        log is read again and checked again before anything is written; a log whose
        header changed meanwhile (deleted and written again) starts the round again.

        Runs under the writer's lock, before its first batch. Cancellation: the storage
        work runs on a worker thread and is not abandoned; what it took (the lock) is
        the writer's either way."""
        events = writer.session.events  # an immutable snapshot, read on the worker thread
        cwd = writer.session.header.cwd
        sid = writer.id

        def decide(stored: StoredLog) -> int | None:
            """The stored length to continue from; ``None``: not this project's log."""
            self._refuse_unknown(sid, stored.records, stored)
            if stored.header.get("cwd") != cwd:
                return None  # another project's session: the first write refuses the id
            if not reproduces(events, [_canonical(r) for r in stored.records]):
                raise SessionLogExistsError(
                    f'session "{sid}" already has a persisted log on disk that does not match this live '
                    "session (id collision)",
                    session_id=sid,
                )
            return len(stored.records)

        def work() -> tuple[int, WriterLease, dict[str, Any]] | None:
            while True:
                if self.backend.revision(sid) is None:
                    return None  # nothing stored: the usual first write
                stored = self.backend.load(sid)
                if decide(stored) is None:
                    return None
                lease = self.backend.acquire_writer(stored.header)
                try:
                    n: int | None = None
                    restart = False
                    current = self.backend.revision(sid)
                    if current is not None and current != stored.revision:
                        # Written meanwhile (by another process: this one serialises its
                        # own writers): decide again on what is stored now, which the
                        # lock keeps still.
                        header = stored.header
                        stored = self.backend.load(sid)
                        restart = stored.header != header  # another log under this id
                    if current is not None and not restart:
                        n = decide(stored)
                        if n is not None and stored.truncate_to is not None:
                            self.backend.commit_repair(sid, stored.truncate_to, [], lease=lease)
                except BaseException:
                    lease.release()
                    raise
                if n is not None:
                    return n, lease, header_record(stored.header)
                lease.release()
                if not restart:
                    return None  # deleted meanwhile, or not this project's log
                # else: start over (read, lock, check)

        adopted = await trio.to_thread.run_sync(work)
        if adopted is None:
            return
        n, lease, header = adopted
        writer.lease = lease
        writer.materialized = True
        writer._header = header  # later locks, a retirement's retry, a live load's meta
        writer.pending = [r for r in writer.pending if r["seq"] >= n]
        writer.durable = max(writer.durable, n)

    async def _verify_claim(self, writer: SessionWriter, claimed: _EnvelopeState) -> None:
        """Before the first batch of a live session that claimed an ownerless stored log
        (left by :meth:`load`, :meth:`append` or their adoption): take the writer lock
        and check, under it, that the log is still the one the claim was checked
        against (:meth:`_verify_unchanged`: same revision, else the same events and no
        torn tail). Another process may have appended to it since: the write then
        fails with :class:`SessionLogExistsError` (``FlushError`` caused by it), the
        lock is released and nothing is written; every later write checks again.

        Runs under the writer's lock (``before_first_write``). Cancellation: the
        storage work runs on a worker thread and is not abandoned; a lock it took is
        the writer's (released by its retirement), even if the caller is cancelled."""
        sid = writer.id
        assert writer.lease is None  # a claim holds no lock until its first write

        def work() -> WriterLease:
            lease = self.backend.acquire_writer(writer._header)
            try:
                self._verify_unchanged(sid, claimed, live=True)
            except BaseException:
                lease.release()
                raise
            return lease

        writer.lease = await trio.to_thread.run_sync(work)

    def _new_writer(self, session: Session, **kwargs: Any) -> SessionWriter:
        return SessionWriter(
            backend=self.backend,
            session=session,
            nursery=self._nursery,
            delay=self._delay,
            warnings=self.store.warnings,
            committer=self.committer,
            **kwargs,
        )

    def _refuse_unreadable(self, handle: SessionHandle, events: tuple[Any, ...]) -> None:
        """Pre-commit veto: an event type a load would refuse ("unknown to this harness
        and not marked ignorable"; a chunk-row tag the reader would expand) is refused
        before it is logged. Accepted, it would be acknowledged by a flush and then
        make the whole session unreadable (issue 16)."""
        for ev in events:
            refuse_unreadable_type(handle.id, ev.type, ev.seq, ev.ignorable)

    def _on_created(self, handle: SessionHandle) -> None:
        session = handle._entry.session
        if session.first_live_seq:  # a seed: the rule of the appends
            # A scan of the type column: building every seed event here cost a resumed
            # 100k-event session ~70 ms on the store actor (W7); only the rare event of
            # an unknown type is built, to read its ``ignorable`` flag.
            events = session.events
            for seq in events.seqs_outside(KNOWN_EVENT_TYPES):
                ev = events[seq]
                refuse_unreadable_type(handle.id, ev.type, ev.seq, ev.ignorable)
        self._writer_for(handle)  # raises (vetoes) on an identity conflict

    def _on_events(self, handle: SessionHandle, events: tuple[Any, ...]) -> None:
        """The events of one commit (the batch form of ``session/event``: one call and
        one buffering per commit, not per event)."""
        writer = self._writers.get(handle.id)
        if writer is None or writer.session is not handle._entry.session:
            if not handle._entry.announced:
                # Entered, not announced: its writer starts at its session/created
                # (and catches up on these events), after the creation checks (the
                # id-collision veto, the seed's types). Started here, it would write a
                # session that may never be published, and no session/disposed would
                # retire it when it is detached unannounced (its lock held for ever).
                return
            writer = self._writer_for(handle)
        writer.enqueue_batch(events)

    def _flush_direct(self, handle: SessionHandle, shielded: bool) -> Awaitable[None]:
        """The store's direct form of :meth:`_on_flush` (see ``DirectFlush``: a live,
        announced, idle session, right after the store's cancel point): a session with
        its writer flushes through :meth:`SessionWriter.flush_direct`; anything else
        through :meth:`_on_flush` (in a shielded scope if ``shielded``)."""
        writer = self._writers.get(handle.id)
        if writer is not None and writer.session is handle._entry.session:
            writer.catch_up()
            return writer.flush_direct(shielded)
        if shielded:
            return self._on_flush_shielded(handle)
        return self._on_flush(handle)

    async def _on_flush_shielded(self, handle: SessionHandle) -> None:
        with trio.CancelScope(shield=True):
            await self._on_flush(handle)

    async def _on_flush(self, handle: SessionHandle) -> None:
        """The durability barrier for a live session. A session that is no longer live
        (detached while the flush was on its way) is flushed through its retiring
        writer (or the one about to retire) if it has one, and refused otherwise:
        never build a writer for a dead session (it would take the lock and keep it)."""
        writer = self._writers.get(handle.id)
        if writer is not None and writer.session is handle._entry.session and handle.alive:
            # The common case, decided first: a live session with its writer (the
            # checks below would reach the same writer, a few lookups later).
            writer.catch_up()
            await writer.flush()
            return
        if not handle.alive:
            session = handle._entry.session
            if writer is not None and writer.session is session:
                # Detached, its session/disposed not emitted yet (the detach drains its
                # queue, e.g. a durable append): this writer is the one that retires.
                retiring: SessionWriter | None = writer
            else:
                retiring = next(
                    (w for w, _ in self._retirements.get(handle.id, ()) if w.session is session), None
                )
            if retiring is None:
                raise SessionNotLiveError(f'session "{handle.id}" is not live in this store', session_id=handle.id)
            await retiring.flush()
            return
        current = self._writers.get(handle.id)
        if not handle.announced and (current is None or current.session is not handle._entry.session):
            # Entered, not announced: nothing of it is written yet (its writer starts
            # at its session/created), and a flush must not start one (see _on_events):
            # a session detached unannounced gets no session/disposed, so that writer
            # would never retire (its lock held, the id "live" here for ever).
            return
        writer = self._writer_for(handle)
        writer.catch_up()
        await writer.flush()

    def _on_disposed(self, handle: SessionHandle) -> None:
        writer = self._writers.get(handle.id)
        if writer is None or writer.session is not handle._entry.session:
            return
        del self._writers[handle.id]
        self._retiring.add(writer)
        done = trio.Event()
        self._retirements.setdefault(handle.id, []).append((writer, done))
        self._nursery.start_soon(self._retire, writer, done)

    async def _retire(self, writer: SessionWriter, done: trio.Event) -> None:
        """Background retirement. Never raises into the nursery: a failure is logged
        and only what a retry needs is kept (retried by :meth:`aclose`)."""
        try:
            await writer.retire()
        except Exception as exc:
            self.store.warnings.report(
                log,
                "write-failed",
                "retirement",
                f'{self.backend.name}: session "{writer.id}" retirement failed: {exc}',
                session_id=writer.id,
                error=exc,
            )
            if writer.pending and writer.wedged is None:
                leftover = writer.leftover()
                if leftover.materialized:
                    # A retry appends only to exactly the log its writer left (a count
                    # alone misses one rewritten with as many events).
                    digest = Fingerprint()
                    digest.extend(event_to_record(e) for e in writer.session.events[: leftover.durable])
                    leftover = attrs.evolve(leftover, durable_digest=digest)
                self._leftovers.append(leftover)
            elif writer.pending:
                # A fresh error, not ``exc``: its traceback would pin the writer's
                # frames, and with them the session, until aclose.
                self._unrecoverable.append(
                    PersistenceError(f'{self.backend.name}: session "{writer.id}": {exc}', session_id=writer.id)
                )
                log.error(
                    '%s: session "%s": %d event(s) of a wedged write are dropped (state unknown)',
                    self.backend.name,
                    writer.id,
                    len(writer.pending),
                )
        finally:
            self._retiring.discard(writer)  # the writer (and its session) can go now
            done.set()
            entries = self._retirements.get(writer.id, [])
            entries[:] = [e for e in entries if e[1] is not done]
            if not entries:
                self._retirements.pop(writer.id, None)

    async def wait_retired(self, session_id: str) -> None:
        """Wait until the disposed incarnation of ``session_id`` (if any) has written its
        last batch and released its writer lock. Returns at once if none is retiring.

        A disposed session's writer retires in the background: its final writes land
        after ``dispose`` returns. Call this to know they are durable (or were given
        up with a logged error) and the session's memory is released.

        Cancellation: only the wait is cancelled; the retirement goes on in the
        persistence nursery.
        """
        check_lookup_id(session_id)
        await self._wait_retired(session_id)

    async def _wait_retired(self, session_id: str, me: SessionWriter | None = None) -> None:
        """Wait until every earlier incarnation of this id has released its writer lock
        (all of them, oldest first; never ``me`` or later: a retiring writer still
        writes its last batch, and waiting for a later one would deadlock)."""
        while True:
            earlier: list[trio.Event] = []
            for writer, done in self._retirements.get(session_id, ()):
                if writer is me:
                    break
                earlier.append(done)
            if not earlier:
                return
            for done in earlier:
                await done.wait()

    # -- the load path -----------------------------------------------------------------

    async def prepare(self, session_id: str) -> SessionPreparation:
        """Load a stored session for writing: lock it, read it, repair it durably, and
        build the unpublished session in restore mode.

        A second ``prepare`` of an id already prepared here waits (cancellably) until
        that preparation is published or disposed.

        Raises :class:`SessionLiveError` if it is live here, :class:`SessionLockedError`
        at once if another process's writer holds it, ``PersistedSessionNotFoundError``,
        :class:`SessionCorruptionError` or :class:`SessionFormatUnsupportedError`.

        Cancellation: the blocking work runs on a worker thread that is not abandoned;
        if the caller is cancelled meanwhile, the finished preparation is disposed
        (lock released) before ``Cancelled`` propagates, so nothing leaks.
        """
        check_lookup_id(session_id)
        result: list[SessionPreparation] = []
        try:
            while True:
                await self._wait_retired(session_id)
                if await self.store.get(session_id) is not None:
                    raise SessionLiveError(
                        f'cannot prepare session "{session_id}" while it is live', session_id=session_id
                    )
                held = self._reserved.get(session_id)
                if held is not None:
                    # Another preparation of this id holds it: wait (cancellably) until it
                    # is published (then the id is live: refused above) or disposed
                    # (reference §2.6).
                    await held._released.wait()
                    continue
                # Serialised with the id's other operations (a load, an append's
                # adoption, another prepare still reading): none of them fails on the
                # lock this process itself holds, and none reads a log another rewrites.
                async with self._chain(session_id):
                    if self._taken(session_id) or self.store.get_nowait(session_id) is not None:
                        continue  # prepared, live or retiring meanwhile: look again
                    session, lease, cursor, repaired = await trio.to_thread.run_sync(self._prepare_sync, session_id)
                    prep = SessionPreparation(self, session, lease, cursor, repaired)
                    self._prep_counts[0] += 1
                    result.append(prep)
                    self._reserved[session_id] = prep
                break
            await trio.lowlevel.checkpoint()
        except BaseException:
            if result:
                await result[0].dispose()
            raise
        return prep

    def _prepare_sync(self, session_id: str) -> tuple[Session, WriterLease, int, int]:
        with gc_paused():
            # One pause for read, decode and restore (decision 0003).
            return self._prepare_paused(session_id)

    def _prepare_paused(self, session_id: str) -> tuple[Session, WriterLease, int, int]:
        fast = self._prepare_from_lines(session_id)
        if fast is not None:
            return fast
        stored = self.backend.load(session_id)
        lease = self.backend.acquire_writer(stored.header)
        try:
            if self.backend.revision(session_id) != stored.revision:
                stored = self.backend.load(session_id)  # written meanwhile: read it again
            records, closers = self._check_and_repair(session_id, stored)
            repaired = 0
            while stored.truncate_to is not None or closers:
                # Reference §2.8: the session is built (validated) before the repair is
                # committed, so a log that does not restore is refused unchanged.
                check_restores(session_id, stored, records, closers)
                self.backend.commit_repair(session_id, stored.truncate_to, closers, lease=lease)
                repaired += len(closers)
                # Reference §2.7: after a repair commit the log is read again, so the
                # session is built from what is stored now (the repair, and anything a
                # writer that ignores the lease appended after it), never from the
                # pre-repair read; a new open turn or torn tail is repaired in turn.
                stored = self.backend.load(session_id)
                records, closers = self._check_and_repair(session_id, stored)
            session = build_session(session_id, stored.header, records)
            cursor = len(records)
            records.clear()  # adopted by the session: drop the envelopes now
            return session, lease, cursor, repaired
        except BaseException:
            lease.release()
            raise

    def _prepare_from_lines(self, session_id: str) -> tuple[Session, WriterLease, int, int] | None:
        """The common resume in one pass over undecoded lines (decision 0010): every
        line a plain event of a known type with seq = its index, no open turn to close.
        The session keeps each line instead of its decoded tree. ``None`` (nothing
        held) whenever anything else holds — a bad or torn-inside line, a chunk row, an
        unknown or legacy type, an open turn, a validation failure, a log that moved
        while it was read — and the general path then reads the log again and applies
        the exact rules and messages. Runs on a worker thread."""
        load_lines = getattr(self.backend, "load_lines", None)
        if load_lines is None:
            return None
        stored: StoredLines | None = load_lines(session_id)
        if stored is None or _ends_in_open_turn(stored.lines):
            return None
        session: Session | None = None
        # Restored before the lock is taken, as the general path reads before it locks:
        # a log that does not read is reported as such even while another process
        # holds it, and a declined read has taken nothing.
        with contextlib.suppress(HarnessError):
            session = Session.restore_stored_lines(session_id, stored.lines, stored.header, KNOWN_EVENT_TYPES)
        if session is None:
            return None
        cursor = len(stored.lines)
        stored.lines.clear()  # adopted by the session
        lease = self.backend.acquire_writer(stored.header)
        try:
            if self.backend.revision(session_id) != stored.revision:
                lease.release()  # written meanwhile: the general path reads it again
                return None
            if stored.truncate_to is not None:
                self.backend.commit_repair(session_id, stored.truncate_to, [], lease=lease)
            return session, lease, cursor, 0
        except BaseException:
            lease.release()
            raise

    def _check_and_repair(self, session_id: str, stored: StoredLog) -> tuple[list[Any], list[Any]]:
        # Both checks read only the types, gathered once at C speed (on a 100k-event
        # log an interpreted pass costs ~40 ms, mostly cache misses). Envelope faults
        # (a missing or non-string type) are left to restore, which reports them as
        # corruption.
        records = stored.records
        types = list(map(dict.get, records, repeat("type")))
        if not KNOWN_EVENT_TYPES.issuperset(types):
            # Legacy shapes are refused as such before "unknown type" (§2.9 order).
            if not _LEGACY_TYPES.isdisjoint(types):
                for rec in records:
                    refuse_legacy(session_id, rec, self._raw_path(stored))
            self._refuse_unknown(session_id, records, stored)
        last_marker = max(_last_index_of(types, "turn/start"), _last_index_of(types, "turn/end"))
        if last_marker < 0:
            return records, []  # no turn was ever started: nothing to close
        try:
            # Only the events from the last turn marker on can hold an open turn.
            closers = [event_to_record(e) for e in closers_for_records(records[last_marker:])]
        except Exception as exc:
            raise SessionCorruptionError(
                f'stored session "{session_id}" failed validation: {exc}', session_id=session_id
            ) from exc
        return records, closers

    def _raw_path(self, stored: StoredLog | None) -> str | None:
        """The session's raw log for a backend with per-session files, else ``None``."""
        log_path = getattr(self.backend, "log_path", None)
        if stored is None or log_path is None:
            return None
        return str(log_path(stored.header))

    def _refuse_unknown(self, session_id: str, records: list[Any], stored: StoredLog | None = None) -> None:
        for rec in records:
            t = rec.get("type")
            if t not in KNOWN_EVENT_TYPES and type(t) is str and rec.get("ignorable") is not True:
                location = self._raw_path(stored)
                raise SessionFormatUnsupportedError(
                    f'session "{session_id}" contains event type "{t}" (seq {js_string(rec.get("seq"))}) unknown to '
                    "this harness and not marked ignorable; refusing to interpret the log — it was "
                    f"likely written by a newer harness{raw_log_suffix(location)}",
                    session_id=session_id,
                    location=location,
                )

    async def delete(self, session_id: str) -> None:
        """Delete a stored session (also one whose events do not read, if its header
        does). Refused (:class:`SessionLiveError`) while it is live
        or prepared here; waits for a pending retirement first. Another process
        writing it makes the backend's lock check fail with :class:`SessionLockedError`.

        Cancellation: the deletion is not abandoned once started (worker thread).
        """
        check_lookup_id(session_id)
        while True:
            await self._wait_retired(session_id)
            if await self.store.get(session_id) is not None or session_id in self._reserved:
                raise SessionLiveError(f'cannot delete session "{session_id}" while it is live', session_id=session_id)
            # Serialised with the id's other operations: a load (or an append's
            # adoption, a prepare) reading the log now would otherwise record state for
            # a log this deletes.
            async with self._chain(session_id):
                if self._taken(session_id) or self.store.get_nowait(session_id) is not None:
                    continue  # prepared, live or retiring meanwhile: look again
                await self._delete_stored(session_id)
                return

    async def _delete_stored(self, session_id: str) -> None:
        def work() -> None:
            try:
                header = self.backend.load(session_id).header
            except (SessionCorruptionError, SessionFormatUnsupportedError):
                # A log that does not read can still be deleted: its header (for the
                # writer lock) comes from the listing, which reads only headers.
                found = [h for h in self.backend.list_headers() if h.get("id") == session_id]
                if not found:
                    raise
                header = {k: v for k, v in found[0].items() if k != "type"}
            lease = self.backend.acquire_writer(header)
            try:
                self.backend.delete(session_id)
            finally:
                lease.release()

        await trio.to_thread.run_sync(work)
        self._states.pop(session_id, None)  # a created, appended or loaded id is gone with its log

    async def list(self) -> list[dict[str, Any]]:
        """Stored session headers (records with camelCase keys).

        Cancellation: the listing runs on a worker thread; its result is dropped.
        """
        return await trio.to_thread.run_sync(self.backend.list_headers)

    async def publish(self, prep: SessionPreparation) -> SessionHandle:
        """Enter and announce a preparation in the store. On failure the store is left
        as it was and the preparation is disposed.

        Cancellation: any step may be cancelled; the unwinding (detach, dispose) is
        shielded, so a cancelled caller leaves nothing half-published.

        Raises :class:`PreparationDisposedError` for a disposed preparation (it no
        longer holds the lock: publishing it would write without one).
        """
        if prep.disposed or prep.published:
            raise PreparationDisposedError(
                f'cannot publish session "{prep.id}": its preparation was '
                f"{'disposed' if prep.disposed else 'already published'}",
                session_id=prep.id,
            )
        handle: SessionHandle | None = None
        try:
            prepared = await self.store.adopt(prep.session)
            handle = await self.store.enter(prepared)
            await self.store.announce(handle)
        except BaseException:
            with trio.CancelScope(shield=True):
                try:
                    if handle is None:
                        # Reconcile from the store, not from the reply: an enter whose
                        # outcome is unknown (ReplyOverdueError) may have happened.
                        live = await self.store.get(prep.id)
                        if live is not None and live._entry.session is prep.session:
                            handle = live
                    if handle is not None:
                        await self.store.detach(handle)
                except HarnessError as exc:
                    # The store refuses (e.g. it closed): nothing more to undo there,
                    # and the preparation must still let its lock go.
                    log.warning('session "%s": unwinding a failed publication: %s', prep.id, exc)
                finally:
                    await prep.dispose()
            raise
        return handle

    async def aclose(self) -> None:
        """Flush and retire every writer, retry every failed retirement, dispose every
        unpublished preparation; after trying all of them, report every session whose
        last events could not be made durable.

        Each failed session is reported once to the store's warnings channel
        (:class:`~harness.runtime.WarningReport` ``kind="write-failed"``,
        ``source="close"``, its ``session_id`` and error; logged too), then one
        :class:`PersistenceCloseError` is raised naming them all (``failures``: session
        id -> error, ``errors``: every error; the first is the ``__cause__``). The
        warnings reach the application even when the close error itself is dropped
        (``open_persistence`` exiting with the body's own exception).

        Cancellation: call it shielded (:func:`open_persistence` does). Each storage
        wait inside is shielded and bounded (``WRITE_WAIT_LIMIT``), so a cancelled
        caller never leaves a batch half-written; but ``Cancelled`` then propagates at
        the next checkpoint, the writers not retired yet stay registered with their
        locks held (a later ``aclose`` retries them), and the failures met so far are
        still reported to the warnings channel (not raised). Idempotent per writer.

        Ownership: after it returns (or raises :class:`PersistenceCloseError`) this
        persistence holds no writer, lock or preparation.
        """
        unsubscribe, self._unsubscribe = self._unsubscribe, []
        for f in unsubscribe:
            f()
        failures: list[tuple[str, Exception]] = []
        finished = False
        try:
            for writer in [*self._writers.values(), *self._retiring]:
                if await self._retire_at_close(writer, failures):
                    # Its background retirement may have failed meanwhile and left a
                    # retry behind: the events it owed are written now, and replaying
                    # it would report a loss that did not happen.
                    self._leftovers = [lo for lo in self._leftovers if lo.writer_token is not writer.token]
            self._writers.clear()
            self._retiring.clear()
            unrecoverable, self._unrecoverable = self._unrecoverable, []
            failures.extend((exc.session_id or "", exc) for exc in unrecoverable)
            while self._leftovers:
                # One at a time: a cancelled close keeps the ones it did not try.
                leftover = self._leftovers.pop(0)
                try:
                    await run_storage_call(functools.partial(retry_leftover, self.backend, leftover))
                except Exception as exc:
                    failures.append((leftover.id, exc))
            for prep in list(self._reserved.values()):
                await prep.dispose()
            await self._drain_chains()
            finished = True
        finally:
            # Its thread ends once idle (a round in flight finishes first); a later
            # write, e.g. an aclose retried after a cancellation, starts a new one.
            self.committer.close()
            # Reported even when cancelled half-way: a lost event is never silent.
            error = self._report_close_failures(failures, finished=finished)
        if error is not None:
            raise error from error.errors[0]

    async def _drain_chains(self) -> None:
        """Wait until no operation holds or waits for any id (reference §2.10: dispose
        waits for every per-id chain, detached public appends included), so the backend
        is not closed under a public ``append``, ``create`` or ``load`` still running in
        another task. Each id is joined at the end of its FIFO queue; its entry goes
        once nobody holds or waits for it. Cancellation: only this wait (the operations
        finish on their own)."""
        while self._chains:
            for session_id in list(self._chains):
                async with self._chain(session_id):
                    pass

    async def _retire_at_close(self, writer: SessionWriter, failures: builtins.list[tuple[str, Exception]]) -> bool:
        """Retire ``writer``, trying its final write once more if it fails: after a
        transient fault (a full disk freed meanwhile, one failed I/O) a close should not
        lose the unflushed tail of a live session. A writer that failed closed
        (``wedged``) is not retried: its state on disk is unknown. A failure is in
        ``failures`` before the retry starts, so a close cancelled during the retry
        still reports it. Returns whether the writer retired cleanly."""
        try:
            await writer.retire()
            return True
        except Exception as exc:
            failures.append((writer.id, exc))
            if writer.wedged is not None or not writer.pending:
                return False
        at = len(failures) - 1
        log.warning('%s: closing: session "%s": the final write failed; trying once more', self.backend.name, writer.id)
        try:
            await writer.retire()
        except Exception as again:
            failures[at] = (writer.id, again)
            return False
        del failures[at]
        return True

    def _report_close_failures(
        self, failures: Sequence[tuple[str, Exception]], *, finished: bool
    ) -> PersistenceCloseError | None:
        """One warning per failed session; the error :meth:`aclose` raises (``None``
        if nothing failed)."""
        if not failures:
            return None
        by_id: dict[str, list[Exception]] = {}
        for sid, exc in failures:
            by_id.setdefault(sid, []).append(exc)
        name = self.backend.name
        for sid, errs in by_id.items():
            what = "; ".join(dict.fromkeys(str(e) for e in errs))
            self.store.warnings.report(
                log,
                "write-failed",
                "close",
                f'{name}: closing: session "{sid}": '
                f"{'its last events could not be made durable and are lost' if finished else 'its last events are not durable (close cancelled)'}: "
                f"{what}",
                session_id=sid or None,
                error=errs[0],
            )
        shown = "; ".join(f'"{sid}": {errs[0]}' for sid, errs in by_id.items())
        return PersistenceCloseError(
            f"{name}: closing failed for {len(by_id)} session(s): {shown}",
            failures={sid: errs[0] for sid, errs in by_id.items()},
            errors=tuple(exc for _, exc in failures),
        )


def _ends_in_open_turn(lines: list[bytes], window: int = 1000) -> bool:
    """A cheap look for a crash's open turn in the last ``window`` lines, so that such a
    log goes straight to the general reader (which writes its closers) instead of
    being restored twice. Only lines that mention a turn marker are decoded; a log
    this misses is still declined by the restore, after its pass."""
    loads = orjson.loads
    for line in reversed(lines[-window:]):
        if b'"turn/' not in line:
            continue
        try:
            t = loads(line).get("type")
        except (orjson.JSONDecodeError, AttributeError):
            return False  # not a plain record: the restore declines it anyway
        if t == "turn/end":
            return False
        if t == "turn/start":
            return True
    return False


_LEGACY_TYPES = frozenset({"request/header-delta", "mode/set", "steering/message"})


def refuse_unreadable_type(session_id: str, type_: str, seq: int, ignorable: bool) -> None:
    """:class:`EventError` for an event that a load of its session would refuse."""
    if type_ in KNOWN_EVENT_TYPES or ignorable:
        return
    shown = repr(type_) if len(type_) <= 80 else f"{type_[:60]!r}... ({len(type_)} characters)"
    raise EventError(
        f'session "{session_id}": event type {shown} (seq {seq}) is not one this harness can read back '
        "from storage; a persisted session takes only known event types (see docs/limits.md)",
        session_id=session_id,
    )


def _last_index_of(items: list[Any], value: str) -> int:
    """The index of the last ``value`` in ``items`` (-1 if absent), at C speed."""
    try:
        return len(items) - 1 - items[::-1].index(value)
    except ValueError:
        return -1


@asynccontextmanager
async def open_persistence(
    store: Store, backend: Backend, *, write_delay: float = 0.2, prepared_session_cache_size: int = 5
) -> AsyncIterator[Persistence]:
    """Make ``store``'s sessions durable in ``backend`` for the duration of the block.

    ``prepared_session_cache_size`` (a positive integer, default 5, as the reference's
    ``preparedSessionCacheSize``) bounds the LRU of cold inspections kept for reuse.
    ``write_delay`` (seconds, finite, >= 0) is the write-behind window. Either one out of
    range raises :class:`PersistenceArgumentError` before anything opens.

    Open it inside the store's block. Leaving flushes and retires every writer (the
    store's own exit then detaches sessions with nothing left to write); if final
    writes fail, :class:`PersistenceCloseError` (a :class:`PersistenceError`) naming
    every failed session is raised after everything was tried, and each failed session
    is reported to ``store.warnings``. If the block exits with its own exception, that
    one wins: the close error is added to it as a note (and the warnings were sent);
    a cancellation of the block does not win: the close error replaces it.

    Cancellation of the block still flushes and retires writers (shielded).
    """
    if type(prepared_session_cache_size) is not int or prepared_session_cache_size <= 0:
        raise PersistenceArgumentError(
            f"prepared_session_cache_size must be a positive integer, got {prepared_session_cache_size!r}"
        )
    # Checked here, not at the first window: a negative or NaN delay would reach the
    # write-behind task and fail it in the background, away from the caller.
    if type(write_delay) not in (int, float) or not 0 <= write_delay < math.inf:
        raise PersistenceArgumentError(f"write_delay must be a finite number of seconds >= 0, got {write_delay!r}")
    failure: BaseException | None = None
    async with trio.open_nursery() as nursery:
        persistence = Persistence(store, backend, nursery, write_delay=write_delay)
        persistence._configure_cache(prepared_session_cache_size)
        try:
            yield persistence
        finally:
            in_flight = sys.exc_info()[1]  # the block's own exception, if it raised
            with trio.CancelScope(shield=True):
                try:
                    await persistence.aclose()
                except PersistenceError as exc:
                    failure = exc
            nursery.cancel_scope.cancel()
            if failure is not None and in_flight is not None and not isinstance(in_flight, trio.Cancelled):
                # The block's exception wins; the close failure rides along on it (and
                # was reported to the warnings channel, one report per session). A
                # cancellation does not win: the close failure replaces it (below).
                in_flight.add_note(f"while closing the persistence: {failure}")
                failure = None
    if failure is not None:
        raise failure
