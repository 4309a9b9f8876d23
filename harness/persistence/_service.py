"""The persistence service surface without a live session (reference §2.1, §2.3, §2.8).

``create``/``append`` write envelope events for a session id that no live session owns;
``load`` makes a stored session's repair durable and holds the id for a live session
that reproduces it; ``inspect``/``read_from``/``list_snapshots``/``read_session`` read
without changing storage; ``locate`` and ``read_raw`` expose where and what a backend
stores. Mixed into
:class:`~harness.persistence.Persistence`.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, overload

import attrs
import orjson
import trio

from harness.errors import (
    HarnessError,
    PersistedSessionNotFoundError,
    PersistenceArgumentError,
    PersistenceError,
    RawArtifactsUnsupportedError,
    SessionFormatUnsupportedError,
    SessionLiveError,
    SessionLogExistsError,
    SessionNotLiveError,
    SessionTrackedError,
)
from harness.persistence._backend import StoredLog, WriterLease, header_record
from harness.persistence._restore import build_session, check_restores
from harness.session import FrozenDict, Session, event_to_record, freeze, gc_paused, thaw
from harness.session._events import is_nonneg_safe_int, valid_envelope
from harness.session._header import check_lookup_id, check_session_id, snapshot_header
from harness.session._json import (
    MAX_STORABLE_DEPTH,
    js_string,
    shown_safe_int,
    try_snapshot_raw,
    try_snapshot_storable,
)
from harness.session._session import _NO_TURN

if TYPE_CHECKING:
    from harness.persistence._backend import Backend
    from harness.runtime import SessionHandle, Store

log = logging.getLogger("harness.persistence")


@attrs.frozen
class SessionInspection:
    """A read-only view of a session: its header record (``meta``) and its events as
    records (frozen). Cold: the stored events plus the crash-repair closers a load would
    append (not written); no ``session/end-seed``. Live: the live log as it is.

    ``revision``: the backend's revision of exactly the stored bytes (rows) this view
    was read from (reference §2.7); ``None`` for a live session's view (its log may hold
    events not written yet, which no stored revision describes)."""

    meta: FrozenDict
    events: tuple[FrozenDict, ...]
    revision: str | None = None


class _Loading:
    """One in-flight cold read, shared by every inspection of the id meanwhile."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: Exception | None = None
        self.result: SessionInspection | None = None


@attrs.define
class _EnvelopeState:
    """A session id written through :meth:`ServiceMixin.append` (no live session)."""

    meta: dict[str, Any]  # the header record
    cursor: int  # stored length
    materialized: bool
    stored: Fingerprint = attrs.Factory(lambda: Fingerprint())
    # The backend revision of the stored log when this state last read or wrote it
    # (``None``: unknown, the next write compares the content instead). Another
    # process may append to an ownerless log: a write checks it under the writer lock
    # first (:meth:`ServiceMixin._verify_unchanged`).
    revision: str | None = None


class Fingerprint:
    """The stored events of a tracked id as one digest of their canonical JSON, in
    order: a live session that claims the id is checked against it synchronously, at
    its creation (reference §2.4 case 1), without keeping the log in memory (a loaded
    100k-event log would otherwise pin ~20 MB of JSON per id until it is claimed).
    BLAKE2b-256 over length-prefixed lines: a false match is out of reach."""

    __slots__ = ("_hash", "count")

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=32)
        self.count = 0

    def extend(self, records: Iterable[object]) -> None:
        for record in records:
            _feed(self._hash, _canonical(record))
            self.count += 1

    def begins(self, events: Sequence[Any]) -> bool:
        """Whether ``events`` begin with the stored events (content equality, keys in
        any order, JSON types strict)."""
        n = self.count
        if len(events) < n:
            return False
        h = hashlib.blake2b(digest_size=32)
        for i in range(n):
            _feed(h, _canonical(event_to_record(events[i])))
        return h.digest() == self._hash.digest()

    def equals(self, records: Sequence[object]) -> bool:
        """Whether ``records`` are exactly the stored events (same count, same content)."""
        if len(records) != self.count:
            return False
        h = hashlib.blake2b(digest_size=32)
        for record in records:
            _feed(h, _canonical(record))
        return h.digest() == self._hash.digest()


def _feed(h: Any, line: bytes) -> None:
    h.update(len(line).to_bytes(8, "little"))
    h.update(line)


class ServiceMixin:
    """The envelope-level service. Expects ``backend``, ``store``, ``_reserved``, ``_retirements``,
    ``_writers``, ``_wait_retired``, ``_check_and_repair`` and ``_refuse_unknown`` from
    :class:`Persistence`."""

    backend: Backend
    store: Store
    _reserved: dict[str, Any]
    _writers: dict[str, Any]
    _retirements: dict[str, Any]

    _nursery: trio.Nursery

    def _init_service(self) -> None:
        self._states: dict[str, _EnvelopeState] = {}
        self._chains: dict[str, trio.Lock] = {}
        # Cold inspections (reference §2.6, for reads): one backend read shared by
        # concurrent inspections of an id, and an LRU of finished ones reused while the
        # stored revision is unchanged.
        self._cache_size = 5
        self._inspections: OrderedDict[str, tuple[str, SessionInspection]] = OrderedDict()
        self._loading: dict[str, _Loading] = {}
        # Ids a cold load is reading and repairing right now (reference §2.6: the
        # preparation entry in its loading/committing phase): a live creation of one
        # is vetoed, as the reference's "persisted state already owns this identity".
        self._cold_loads: set[str] = set()

    def _configure_cache(self, size: object) -> None:
        if type(size) is not int or size <= 0:
            raise PersistenceArgumentError(f"prepared_session_cache_size must be a positive integer, got {size!r}")
        self._cache_size = size

    # Supplied by Persistence (which overrides these).
    async def _wait_retired(self, session_id: str, me: Any = None) -> None:  # pragma: no cover
        raise NotImplementedError

    def _check_and_repair(self, session_id: str, stored: StoredLog) -> tuple[list[Any], list[Any]]:  # pragma: no cover
        raise NotImplementedError

    def _refuse_unknown(
        self, session_id: str, records: list[Any], stored: StoredLog | None = None
    ) -> None:  # pragma: no cover
        raise NotImplementedError

    def _claim_state(self, session_id: str, session: Any) -> _EnvelopeState | None:
        """A live session is being created with an id this service tracks (created,
        appended or adopted here): its seed must reproduce the stored events (reference
        §2.4 case 1), else the creation is vetoed. Returns the state it claims."""
        state = self._states.get(session_id)
        if state is None:
            return None
        live_cwd, stored_cwd = session.header.cwd, state.meta.get("cwd")
        if live_cwd != stored_cwd:
            raise SessionLogExistsError(
                f'session "{session_id}" is already persisted at a different cwd '
                f"(persisted: {_shown_cwd(stored_cwd)}, live: {_shown_cwd(live_cwd)}) (id collision)",
                session_id=session_id,
            )
        n = state.cursor
        if not state.stored.begins(session.events):
            raise SessionLogExistsError(
                f'session "{session_id}" is already persisted with {n} event(s) that do not match this live '
                "session (id collision)",
                session_id=session_id,
            )
        del self._states[session_id]
        return state

    @asynccontextmanager
    async def _chain(self, session_id: str) -> AsyncIterator[None]:
        """Per-id FIFO serialisation of the id's operations (Trio's lock is fair). The
        id's entry goes once nobody holds or waits for it (reference §2.2: a settled
        tail deletes its entry), so the map does not grow with every id ever used."""
        lock = self._chains.get(session_id)
        if lock is None:
            lock = self._chains[session_id] = trio.Lock()
        try:
            async with lock:
                yield
        finally:
            # A release hands the lock to the next waiter (it stays locked): the entry
            # goes only when it is free and nobody waits.
            if self._chains.get(session_id) is lock and not lock.locked() and not lock.statistics().tasks_waiting:
                del self._chains[session_id]

    async def _is_live(self, session_id: str) -> bool:
        return session_id in self._writers or await self.store.get(session_id) is not None

    # -- create / append (§2.3) --------------------------------------------------------

    async def create(self, meta: object) -> None:
        """Start tracking a new session id for :meth:`append`. Nothing is written until
        the first non-empty append (the id is absent from :meth:`list` until then).

        Raises :class:`PersistenceArgumentError` for metadata that is not losslessly
        JSON or whose ``createdAt`` is not a non-negative safe integer (and the header
        rules for the rest), :class:`SessionTrackedError` when the id is already
        tracked, prepared or live here, :class:`SessionLogExistsError` when it is
        stored.

        Cancellation: cancelled while waiting for the id's earlier operations, nothing
        happened; the storage probe runs on a worker thread and is not abandoned.
        """
        why, raw = try_snapshot_storable(meta)
        if why == "too deep":
            # Refused here: its header line could never be written (issue 16).
            raise PersistenceArgumentError(
                f"session metadata nests more than {MAX_STORABLE_DEPTH} levels, which cannot be stored"
            )
        if why is not None or type(raw) is not dict:
            raise PersistenceArgumentError("session metadata must be losslessly JSON-serializable")
        if not is_nonneg_safe_int(raw.get("createdAt")):
            raise PersistenceArgumentError("session metadata createdAt must be a non-negative safe integer")
        sid = raw.get("id")
        try:
            # A new id: refused here if storage cannot name it (issue 16), not by the
            # first write.
            check_session_id(sid, "session metadata id")
            header = snapshot_header(raw, sid if type(sid) is str else "")
        except HarnessError as exc:
            raise PersistenceArgumentError(f"session metadata is not a valid session header: {exc}") from exc
        sid = header.id
        async with self._chain(sid):
            if sid in self._states or sid in self._reserved or await self._is_live(sid):
                raise SessionTrackedError(f'session "{sid}" already exists in this backend', session_id=sid)
            # A detached incarnation may still be writing its last batch (the first, if
            # it never wrote): the storage probe below must see it.
            await self._wait_retired(sid)
            if sid in self._states or sid in self._reserved or await self._is_live(sid):
                raise SessionTrackedError(f'session "{sid}" already exists in this backend', session_id=sid)
            if await trio.to_thread.run_sync(self.backend.revision, sid) is not None:
                raise SessionLogExistsError(
                    f'session "{sid}" already has a persisted log on disk; load/resume it instead of creating',
                    session_id=sid,
                )
            self._states[sid] = _EnvelopeState(header_record(header.to_record()), 0, False)

    async def append(self, session_id: str, events: Sequence[object]) -> None:
        """Append envelope events (``{type, seq, time, data, surfaceOp?,
        sourceEventSeqs?, ignorable?}``) to a session no live session owns.

        The batch is snapshotted at call time. An empty batch changes nothing (a
        created session stays lazy). An id this service does not track is *adopted*
        from storage first: read, crash repair made durable, then appended to. Event
        types are not checked here (unknown types are a read-side refusal).

        Raises :class:`PersistenceArgumentError` (not JSON, a bad envelope),
        :class:`SessionFormatUnsupportedError` (legacy shapes), :class:`SessionLiveError`
        (prepared or live here), :class:`PersistedSessionNotFoundError`,
        :class:`PersistenceError` for a seq that does not continue the log, and the
        backend's errors.

        Cancellation: cancelled while waiting for the id's earlier operations, nothing
        happened; once the write started on its worker thread it completes, and the
        caller gets ``Cancelled`` after it (the log and this service agree).
        """
        check_lookup_id(session_id)
        # Storable, not only JSON: data deeper than a record can be written is refused
        # here. The root is a tuple from the fast copy and a list from the deep walk
        # (a batch nesting more than 48 levels was refused as "not JSON", issue 16).
        # The batch list and a record are two levels above each event's data.
        why, raw = try_snapshot_storable(list(events), MAX_STORABLE_DEPTH + 2)
        if why == "too deep":
            raise PersistenceArgumentError(
                f"session event batch holds data nested more than {MAX_STORABLE_DEPTH} levels deep, "
                "which cannot be stored",
                session_id=session_id,
            )
        if why is not None or type(raw) not in (tuple, list):
            raise PersistenceArgumentError(
                "session event batch is not losslessly JSON-serializable because it contains "
                "non-JSON-serializable data",
                session_id=session_id,
            )
        batch: list[Any] = list(raw)  # fresh raw records, owned by this call
        async with self._chain(session_id):
            for rec in batch:
                if not valid_envelope(rec):
                    raise PersistenceArgumentError(
                        f'session "{session_id}": an appended event has an invalid event envelope',
                        session_id=session_id,
                    )
                refuse_legacy(session_id, rec)
            if not batch:
                return
            if session_id in self._reserved:
                raise SessionLiveError(
                    f'cannot append session "{session_id}" while its persisted preparation is reserved',
                    session_id=session_id,
                )
            if await self._is_live(session_id):
                raise SessionLiveError(
                    f'cannot append session "{session_id}" while it is live; append through the live session',
                    session_id=session_id,
                )
            await self._wait_retired(session_id)
            state = self._states.get(session_id)
            if state is None:
                state = await trio.to_thread.run_sync(self._adopt, session_id)
                self._states[session_id] = state
            for i, rec in enumerate(batch):
                if rec["seq"] != state.cursor + i:
                    # Our cursor may be stale (another process appended since): then
                    # the storage's stale-writer refusal, not a seq mismatch of ours.
                    await trio.to_thread.run_sync(self._refuse_if_moved, session_id, state)
                    raise PersistenceError(
                        f'append seq mismatch for "{session_id}": expected {state.cursor + i} at index {i}, '
                        f"got {rec['seq']}",
                        session_id=session_id,
                    )
            await trio.to_thread.run_sync(self._write, state, batch)
            state.cursor += len(batch)
            state.materialized = True
            state.stored.extend(batch)

    def _adopt(self, session_id: str) -> _EnvelopeState:
        """Blocking: take a stored session for appending; its repair is made durable."""
        stored = self.backend.load(session_id)
        lease = self.backend.acquire_writer(stored.header)
        try:
            if self.backend.revision(session_id) != stored.revision:
                stored = self.backend.load(session_id)
            records, closers = self._check_and_repair(session_id, stored)
            fingerprint = Fingerprint()
            fingerprint.extend(records)
            fingerprint.extend(closers)
            # Reference §2.3: the adoption is a prepare (the session built, so
            # validated) and then its repair commit: a log that does not restore is
            # refused unchanged, nothing appended to it. (The session adopts the
            # records: the fingerprint is taken first.)
            check_restores(session_id, stored, records, closers)
            if stored.truncate_to is not None or closers:
                self.backend.commit_repair(session_id, stored.truncate_to, closers, lease=lease)
            # Read under the lock: exactly the log this state describes. After a repair
            # commit it is unknown (reference §2.7: never pair a post-repair revision
            # with the pre-repair read; a writer ignoring the lease may have appended
            # since): the next write compares contents first.
            repaired = stored.truncate_to is not None or bool(closers)
            revision = None if repaired else self._revision_or_unknown(session_id)
            return _EnvelopeState(header_record(stored.header), fingerprint.count, True, fingerprint, revision)
        finally:
            lease.release()

    def _revision_or_unknown(self, session_id: str) -> str | None:
        """Blocking: the stored revision, or ``None`` (unknown: the next write compares
        content instead) if it cannot be read; called where failing would misreport a
        write that already landed."""
        try:
            return self.backend.revision(session_id)
        except Exception as exc:
            log.debug('session "%s": reading the revision failed: %s', session_id, exc)
            return None

    def _verify_unchanged(self, session_id: str, state: _EnvelopeState, *, live: bool = False) -> None:
        """Blocking, under the session's writer lock, before writing for ``state``: the
        stored log must still be the one ``state`` read or wrote last. An ownerless log
        (after :meth:`load`, :meth:`append`, or the adoption of a stored log) holds no
        lock between calls, so another process may have appended to it meanwhile;
        appending after that would write seqs that are already taken (on JSONL, a
        corrupt log). Same revision: fine. Another revision (or an unknown one): the
        log is read again and must hold exactly the events ``state`` knows, with no
        torn tail (a revision can move without new events, e.g. a ``touch``); then the
        new revision is recorded. Otherwise raises :class:`SessionLogExistsError`
        (nothing written; ``live``: a live session's claim, with the reference's
        id-collision wording). A state not materialized yet needs no check: its first
        write refuses an existing log itself."""
        if not state.materialized:
            return
        current = self.backend.revision(session_id)
        if current is not None and current == state.revision:
            return
        if current is not None:
            stored = self.backend.load(session_id)
            if stored.truncate_to is None and state.stored.equals(stored.records):
                state.revision = stored.revision  # stable: the lock is held
                return
            detail = f"it now holds {len(stored.records)} event(s), this persistence wrote or read {state.cursor}"
        else:
            detail = "it was deleted"
        changed = f"the stored log changed since it was loaded ({detail}; another process wrote it)"
        if live:
            message = (
                f'session "{session_id}" already has a persisted log on disk that does not match this live '
                f"session (id collision): {changed}; nothing was written"
            )
        else:
            message = f'cannot append session "{session_id}": {changed}; nothing was written, load it again'
        raise SessionLogExistsError(message, session_id=session_id)

    def _refuse_if_moved(self, session_id: str, state: _EnvelopeState) -> None:
        """Blocking: :meth:`_verify_unchanged` under the writer lock, for an append
        whose seqs do not follow ``state``: another writer holding the session is
        :class:`SessionLockedError`, a log another process moved on is
        :class:`SessionLogExistsError`; an unchanged log returns (the caller's
        mismatch stands)."""
        lease = self.backend.acquire_writer(state.meta)
        try:
            self._verify_unchanged(session_id, state)
        finally:
            lease.release()

    def _write(self, state: _EnvelopeState, batch: list[dict[str, Any]]) -> None:
        """Blocking: one whole batch under the session's writer lock."""
        sid = state.meta["id"]
        lease = self.backend.acquire_writer(state.meta)
        try:
            self._verify_unchanged(sid, state)
            if state.materialized:
                self.backend.append(sid, batch, lease=lease)
            else:
                self.backend.materialize(state.meta, batch, lease=lease)
            state.revision = self._revision_or_unknown(sid)
        finally:
            lease.release()

    # -- load (§2.8) -----------------------------------------------------------------

    async def load(self, session_id: str) -> Session:
        """Load a session for use, as the reference's ``load``.

        Cold (stored, not live here): the crash repair is **made durable** (a torn tail
        cut, the closers of an interrupted turn appended, the revision moved), then the
        id is held *ownerless*: :meth:`append` continues it, a live session whose seed
        reproduces the loaded log claims it (e.g. the returned session, published with
        ``store.adopt``/``enter``/``announce``), and any other live session with that id
        (a fresh empty one included) is vetoed at its creation. Live here: its log is
        flushed and the snapshot taken before the flush is returned, with the stored
        header; refused while its turn is open. Returns a detached session restored
        from that log (plus a ``session/end-seed`` unless it ends with one).

        Raises :class:`PersistedSessionNotFoundError` (nothing stored; a live session
        with no event), :class:`SessionLiveError` (``cannot load session "<id>" while
        its live turn is open; …``), :class:`SessionLockedError` when a repair is due
        and another process writes the session, :class:`SessionCorruptionError`,
        :class:`SessionFormatUnsupportedError`, the live flush's :class:`FlushError`,
        and the backend's errors (a failed repair commit leaves the stored log as it
        was before the load, or with the repair: never half of it).

        Cancellation: waiting for a retirement, a preparation or the id's earlier
        operations can be cancelled (nothing happened). The cold read-and-repair runs on
        a worker thread that is not abandoned: once started it completes, the ownerless
        state is recorded, and the caller gets ``Cancelled`` afterwards. The live flush
        is cancellable like any flush (the snapshot is then not returned). Ownership:
        the returned session belongs to the caller; the ownerless state to this
        persistence.
        """
        check_lookup_id(session_id)
        while True:
            await self._wait_retired(session_id)
            handle = await self.store.get(session_id)
            # An entered but unannounced session is not live for a load: it has no
            # writer and wrote nothing (reference §2.8: a live id is *flushed*, then
            # returned; its flush could make nothing durable). The load goes cold: the
            # stored log, or not found.
            if handle is not None and handle.announced:
                loaded = await self._load_live(session_id, handle)
                if loaded is not None:
                    return loaded
                continue  # detached while flushing: it is (becoming) cold
            held = self._reserved.get(session_id)
            if held is not None:
                # A preparation holds the id: wait until it is published (then live) or
                # disposed, as a second prepare does.
                await held._released.wait()
                continue
            async with self._chain(session_id):
                if self._taken(session_id):
                    # Became live, prepared or retiring (detached after the wait above)
                    # while this waited: look again.
                    continue
                self._cold_loads.add(session_id)
                try:
                    session, state = await trio.to_thread.run_sync(self._load_cold, session_id)
                finally:
                    self._cold_loads.discard(session_id)
                # No checkpoint from the thread's return to the end of this block: the
                # state recorded is the one the repair left, and no live creation can
                # slip in between.
                if self._taken(session_id):
                    # Became live (or live and detached: retiring) meanwhile: look
                    # again (the repair stays).
                    continue
                self._states[session_id] = state
                return session

    def _taken(self, session_id: str) -> bool:
        """Whether a live session, a preparation or a retiring incarnation holds the id
        here: a cold load must not read under, or record state over, any of them (a
        retiring writer may still append its last batch)."""
        if session_id in self._reserved or self._retirements.get(session_id):
            return True
        writer = self._writers.get(session_id)
        if writer is None:
            return False
        # A writer whose session the store no longer holds (entered, then detached
        # without being announced: no session/disposed retired it) does not make the
        # id live: counting it would make load spin for ever.
        entry = self.store._entries.get(session_id)
        return entry is not None and entry.session is writer.session

    def _load_cold(self, session_id: str) -> tuple[Session, _EnvelopeState]:
        """Blocking: read, validate, build the session, then commit the repair (under
        the writer lock, taken only when there is a repair to write: a balanced log
        another process appends to still loads)."""
        with gc_paused():  # one pause for read, decode and restore (decision 0003)
            # The revision is read *before* the log: one a backend reports with its
            # read may be newer than the bytes it read (another process appending
            # meanwhile), and recorded with this state it would hide that append from
            # the claim check. Read before, a mismatch only costs a content comparison.
            before = self.backend.revision(session_id)
            stored = self.backend.load(session_id)
            revision = before if before == stored.revision else None
            records, closers = self._check_and_repair(session_id, stored)
            lease: WriterLease | None = None
            try:
                if stored.truncate_to is not None or closers:
                    lease = self.backend.acquire_writer(stored.header)
                    if self.backend.revision(session_id) != stored.revision or revision is None:
                        stored = self.backend.load(session_id)  # written meanwhile: read it again
                        records, closers = self._check_and_repair(session_id, stored)
                fingerprint = Fingerprint()
                fingerprint.extend(records)
                fingerprint.extend(closers)
                # Validated before anything is written: a log that does not restore is
                # refused unchanged. The session adopts fresh copies of the closers, so
                # the ones committed below are not shared with it.
                session = build_session(session_id, stored.header, records + [thaw(c) for c in closers])
                if lease is not None:
                    if stored.truncate_to is not None or closers:
                        self.backend.commit_repair(session_id, stored.truncate_to, closers, lease=lease)
                        # Unknown after a repair commit (reference §2.7: a post-repair
                        # revision is never paired with the pre-repair read; a writer
                        # ignoring the lease may have appended since): a claim or the
                        # next append compares contents first.
                        revision = None
                    else:
                        revision = self._revision_or_unknown(session_id)
            finally:
                if lease is not None:
                    lease.release()
        return session, _EnvelopeState(header_record(stored.header), fingerprint.count, True, fingerprint, revision)

    async def _load_live(self, session_id: str, handle: SessionHandle) -> Session | None:
        """The live path of :meth:`load`; ``None`` if the session was detached before
        its flush (the caller then loads it cold). Cancellation: the flush is
        cancellable; nothing is held."""
        session = handle._entry.session
        snapshot = session.events  # immutable: what the caller asked for, pre-flush
        writer = self._writers.get(session_id)
        try:
            await handle.flush()
        except SessionNotLiveError:
            return None
        # The stored header wins over the live one once a live session claimed a log,
        # or adopted an untracked stored one (reference §2.4 case 3): read after the
        # flush, since an adoption happens at the writer's first write, in that flush.
        meta = writer._header if writer is not None and writer.session is session else session.header.to_record()
        n = len(snapshot)
        if n == 0:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        if session.open_turn_at(n - 1) is not _NO_TURN:
            raise SessionLiveError(
                f'cannot load session "{session_id}" while its live turn is open; use the live Session or '
                "wait for the turn to close",
                session_id=session_id,
            )
        header = {k: v for k, v in meta.items() if k != "type"}
        records = [_record(e) for e in snapshot]
        return await trio.to_thread.run_sync(build_session, session_id, header, records)

    async def read_session(self, session_id: str) -> Session:
        """A detached session restored from the stored log, **without** taking its lock
        or changing storage or this persistence's state (also while another process
        writes it): the crash-repair closers are in memory only. For forking from or
        showing a stored session; :meth:`load` is the reference's load. Waits first for
        a detached session's final write (its retirement) to finish.

        Cancellation: the read runs on a worker thread and is not abandoned; the
        caller gets ``Cancelled`` after it returns (nothing is held).
        """
        check_lookup_id(session_id)
        await self._wait_retired(session_id)

        def work() -> Session:
            stored = self.backend.load(session_id)
            records, closers = self._check_and_repair(session_id, stored)
            return build_session(session_id, stored.header, records + closers)

        return await trio.to_thread.run_sync(work)

    # -- reading without changing anything (§2.8) --------------------------------------

    async def inspect(self, session_id: str) -> SessionInspection:
        """The session as a load would see it, without changing storage (no repair
        written, no lock taken, no revision change). Live here: the live log.

        Cancellation: the read runs on a worker thread; its result is dropped.
        """
        check_lookup_id(session_id)
        live = await self.store.get(session_id)
        if live is not None:
            return SessionInspection(
                freeze_record(header_record(live.header.to_record())),
                tuple(freeze_record(_record(e)) for e in live.events),
            )
        await self._wait_retired(session_id)
        revision = await trio.to_thread.run_sync(self.backend.revision, session_id)
        cached = self._inspections.get(session_id)
        if cached is not None and revision is not None and cached[0] == revision:
            self._inspections.move_to_end(session_id)
            return cached[1]
        loading = self._loading.get(session_id)
        if loading is None:
            loading = self._loading[session_id] = _Loading()
            # The read belongs to the persistence, not to the first observer: an
            # observer that is cancelled stops waiting; the read still fills the cache.
            self._nursery.start_soon(self._load_inspection, session_id, loading)
        await loading.done.wait()
        if loading.error is not None:
            raise loading.error
        assert loading.result is not None
        return loading.result

    async def _load_inspection(self, session_id: str, loading: _Loading) -> None:
        def work() -> tuple[str, SessionInspection]:
            stored = self.backend.load(session_id)
            records, closers = self._check_and_repair(session_id, stored)
            # Closers are records built from events (their arrays are tuples): thaw them.
            return stored.revision, SessionInspection(
                freeze_record(header_record(stored.header)),
                tuple(freeze_record(r) for r in records) + tuple(freeze_record(thaw(c)) for c in closers),
                stored.revision,
            )

        try:
            revision, inspection = await trio.to_thread.run_sync(work)
        except Exception as exc:
            loading.error = exc
            self._inspections.pop(session_id, None)
        else:
            loading.result = inspection
            self._inspections[session_id] = (revision, inspection)
            self._inspections.move_to_end(session_id)
            while len(self._inspections) > self._cache_size:
                self._inspections.popitem(last=False)
        finally:
            if self._loading.get(session_id) is loading:
                del self._loading[session_id]
            loading.done.set()

    @overload
    async def read_from(
        self, session_id: str, from_seq: object, *, with_meta: Literal[False] = False
    ) -> tuple[FrozenDict, ...]: ...

    @overload
    async def read_from(self, session_id: str, from_seq: object, *, with_meta: Literal[True]) -> SessionInspection: ...

    async def read_from(
        self, session_id: str, from_seq: object, *, with_meta: bool = False
    ) -> tuple[FrozenDict, ...] | SessionInspection:
        """The stored events with ``seq >= from_seq`` (detached, frozen; empty at or past
        the end; a torn tail excluded; no repair closers; nothing cached or written).
        ``with_meta=True`` returns them as a :class:`SessionInspection` with the stored
        header record (``meta``) and the ``revision`` of the read, from the same read.

        Raises :class:`PersistenceArgumentError` for a ``from_seq`` that is not a
        non-negative safe integer, :class:`PersistedSessionNotFoundError`, and the
        format refusals (over the whole stored log, as the reference's JSONL backend).

        Cancellation: the read runs on a worker thread; its result is dropped.
        """
        check_lookup_id(session_id)
        if not is_nonneg_safe_int(from_seq):
            raise PersistenceArgumentError(
                f"readFrom fromSeq must be a non-negative safe integer, got {shown_safe_int(from_seq)}",
                session_id=session_id,
            )
        start = int(from_seq)  # type: ignore[call-overload]

        load_from = getattr(self.backend, "load_from", None)

        def work() -> tuple[StoredLog, tuple[FrozenDict, ...]]:
            if load_from is not None:
                # A backend that can seek reads only the suffix (so, as the reference's
                # SQLite backend, it refuses unknown types in the suffix only).
                stored = load_from(session_id, start)
                self._refuse_unknown(session_id, stored.records, stored)
                return stored, tuple(freeze_record(r) for r in stored.records)
            stored = self.backend.load(session_id)
            self._refuse_unknown(session_id, stored.records, stored)
            return stored, tuple(freeze_record(r) for r in stored.records[start:])

        stored, events = await trio.to_thread.run_sync(work)
        if not with_meta:
            return events
        return SessionInspection(freeze_record(header_record(stored.header)), events, stored.revision)

    async def list_snapshots(self) -> list[SessionInspection]:
        """:meth:`inspect` of every stored session, in :meth:`list` order. A session
        that cannot be read is skipped with a warning (the listing is best effort).

        Cancellation: between sessions; each read runs on a worker thread."""
        out: list[SessionInspection] = []
        for header in await trio.to_thread.run_sync(self.backend.list_headers):
            sid = header.get("id")
            if type(sid) is not str:
                continue
            try:
                out.append(await self.inspect(sid))
            except (PersistenceError, SessionFormatUnsupportedError) as exc:
                log.warning('list_snapshots: session "%s": %s', sid, exc)
        return out

    # -- artifacts (§2.1) --------------------------------------------------------------

    def locate(self, meta: object) -> str | None:
        """Where this backend stores (or would store) the session ``meta`` describes:
        the JSONL transcript path, the SQLite database file; ``None`` if it does
        not say."""
        ok, raw = try_snapshot_raw(meta)
        if not ok or type(raw) is not dict or type(raw.get("id")) is not str:
            raise PersistenceArgumentError("session metadata must be losslessly JSON-serializable")
        log_path = getattr(self.backend, "log_path", None)
        if log_path is not None:
            return str(log_path(dict(raw)))  # the transcript path, as the reference
        path = getattr(self.backend, "path", None)
        return str(path) if path is not None else None

    @property
    def supports_raw_artifacts(self) -> bool:
        """Whether :meth:`read_raw` can answer (a backend with per-session files)."""
        return callable(getattr(self.backend, "read_raw", None))

    async def read_raw(self, session_id: str) -> bytes:
        """The stored JSONL text of a session, verbatim (decompressed for zstd).

        Raises :class:`RawArtifactsUnsupportedError` (``this session persistence
        backend does not expose raw artifacts``) for a backend without one, and
        :class:`PersistedSessionNotFoundError` for an unknown id.

        Cancellation: the read runs on a worker thread; its result is dropped.
        """
        check_lookup_id(session_id)
        read_raw = getattr(self.backend, "read_raw", None)
        if not callable(read_raw):
            raise RawArtifactsUnsupportedError(
                "this session persistence backend does not expose raw artifacts", session_id=session_id
            )

        def work() -> bytes:
            data = read_raw(session_id)  # decoded JSONL text (zstd frames decompressed)
            if data is None:
                raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
            return bytes(data)

        return await trio.to_thread.run_sync(work)


def _canonical(record: object) -> bytes:
    """A record's JSON with sorted keys: the claim check compares content, not the
    key order a caller happened to use."""
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)


def reproduces(events: Sequence[Any], stored_lines: Sequence[bytes]) -> bool:
    """Whether ``events`` begin with the stored records ``stored_lines`` (canonical
    JSON, :func:`_canonical`): the live log continues the stored one."""
    n = len(stored_lines)
    return len(events) >= n and all(
        _canonical(event_to_record(events[i])) == stored_lines[i] for i in range(n)
    )


def freeze_record(value: object) -> Any:
    return freeze(value)


def _record(event: Any) -> Any:
    return thaw(event_to_record(event))  # the record shares frozen (tuple) trees


def _shown_cwd(cwd: str | None) -> str:
    """A header's cwd as the reference's template shows it: ``undefined`` when absent."""
    return "undefined" if cwd is None else cwd


def raw_log_suffix(location: str | None) -> str:
    """`` (raw log: <path>)``, the reference's pointer to a format refusal's file."""
    return "" if location is None else f" (raw log: {location})"


def refuse_legacy(session_id: str, rec: Any, location: str | None = None) -> None:
    """Refuse a record in a legacy shape this harness does not import (§2.9)."""
    t = rec.get("type")
    seq = rec.get("seq")
    data = rec.get("data")
    if t == "request/header-delta":
        what = "request/header-delta format"
    elif t == "mode/set":
        what = "mode/set event"
    elif t == "steering/message":
        what = "steering/message event"
    elif t == "request/header" and hasattr(data, "get") and data.get("reason") == "fallback":
        what = 'request/header reason "fallback"'
    else:
        return
    raise SessionFormatUnsupportedError(
        f'session "{session_id}" contains unsupported legacy {what} at seq {js_string(seq)}{raw_log_suffix(location)}',
        session_id=session_id,
        location=location,
    )
