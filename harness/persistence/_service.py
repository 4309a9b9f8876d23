"""The persistence service surface without a live session (reference §2.1, §2.3, §2.8).

``create``/``append`` write envelope events for a session id that no live session owns;
``inspect``/``read_from``/``list_snapshots`` read without changing storage; ``locate``
and ``read_raw`` expose where and what a backend stores. Mixed into
:class:`~harness.persistence.Persistence`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
    SessionTrackedError,
)
from harness.persistence._backend import StoredLog, header_record
from harness.session import FrozenDict, event_to_record, freeze, thaw
from harness.session._events import is_nonneg_safe_int, valid_envelope
from harness.session._header import snapshot_header
from harness.session._json import try_snapshot_raw

if TYPE_CHECKING:
    from harness.persistence._backend import Backend
    from harness.runtime import Store

log = logging.getLogger("harness.persistence")


@attrs.frozen
class SessionInspection:
    """A read-only view of a session: its header record (``meta``) and its events as
    records (frozen). Cold: the stored events plus the crash-repair closers a load would
    append (not written); no ``session/end-seed``. Live: the live log as it is."""

    meta: FrozenDict
    events: tuple[FrozenDict, ...]


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
    # The stored events as compact JSON, so a live session that claims this id can be
    # checked synchronously, at its creation (reference §2.4 case 1).
    lines: list[bytes] = attrs.Factory(list)


class ServiceMixin:
    """The envelope-level service. Expects ``backend``, ``store``, ``_reserved``,
    ``_writers``, ``_wait_retired``, ``_check_and_repair`` and ``_refuse_unknown`` from
    :class:`Persistence`."""

    backend: Backend
    store: Store
    _reserved: dict[str, Any]
    _writers: dict[str, Any]

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
                f"(persisted: {stored_cwd}, live: {live_cwd}) (id collision)",
                session_id=session_id,
            )
        n = state.cursor
        if not reproduces(session.events, state.lines):
            raise SessionLogExistsError(
                f'session "{session_id}" is already persisted with {n} event(s) that do not match this live '
                "session (id collision)",
                session_id=session_id,
            )
        del self._states[session_id]
        return state

    def _chain(self, session_id: str) -> trio.Lock:
        """Per-id FIFO serialisation of envelope operations (Trio's lock is fair)."""
        lock = self._chains.get(session_id)
        if lock is None:
            lock = self._chains[session_id] = trio.Lock()
        return lock

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
        ok, raw = try_snapshot_raw(meta)
        if not ok or type(raw) is not dict:
            raise PersistenceArgumentError("session metadata must be losslessly JSON-serializable")
        if not is_nonneg_safe_int(raw.get("createdAt")):
            raise PersistenceArgumentError("session metadata createdAt must be a non-negative safe integer")
        sid = raw.get("id")
        try:
            header = snapshot_header(raw, sid if type(sid) is str else "")
        except HarnessError as exc:
            raise PersistenceArgumentError(f"session metadata is not a valid session header: {exc}") from exc
        sid = header.id
        async with self._chain(sid):
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
        ok, raw = try_snapshot_raw(list(events))
        if not ok or type(raw) is not tuple:
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
                    raise PersistenceError(
                        f'append seq mismatch for "{session_id}": expected {state.cursor + i} at index {i}, '
                        f"got {rec['seq']}",
                        session_id=session_id,
                    )
            await trio.to_thread.run_sync(self._write, state, batch)
            state.cursor += len(batch)
            state.materialized = True
            state.lines.extend(map(_canonical, batch))

    def _adopt(self, session_id: str) -> _EnvelopeState:
        """Blocking: take a stored session for appending; its repair is made durable."""
        stored = self.backend.load(session_id)
        lease = self.backend.acquire_writer(stored.header)
        try:
            if self.backend.revision(session_id) != stored.revision:
                stored = self.backend.load(session_id)
            records, closers = self._check_and_repair(session_id, stored)
            if stored.truncate_to is not None or closers:
                self.backend.commit_repair(session_id, stored.truncate_to, closers, lease=lease)
            lines = [_canonical(r) for r in records + closers]
            return _EnvelopeState(header_record(stored.header), len(lines), True, lines)
        finally:
            lease.release()

    def _write(self, state: _EnvelopeState, batch: list[dict[str, Any]]) -> None:
        """Blocking: one whole batch under the session's writer lock."""
        lease = self.backend.acquire_writer(state.meta)
        try:
            if state.materialized:
                self.backend.append(state.meta["id"], batch, lease=lease)
            else:
                self.backend.materialize(state.meta, batch, lease=lease)
        finally:
            lease.release()

    # -- reading without changing anything (§2.8) --------------------------------------

    async def inspect(self, session_id: str) -> SessionInspection:
        """The session as a load would see it, without changing storage (no repair
        written, no lock taken, no revision change). Live here: the live log.

        Cancellation: the read runs on a worker thread; its result is dropped.
        """
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

    async def read_from(self, session_id: str, from_seq: object) -> tuple[FrozenDict, ...]:
        """The stored events with ``seq >= from_seq`` (detached, frozen; empty at or past
        the end; a torn tail excluded; no repair closers; nothing cached or written).

        Raises :class:`PersistenceArgumentError` for a ``from_seq`` that is not a
        non-negative safe integer, :class:`PersistedSessionNotFoundError`, and the
        format refusals (over the whole stored log, as the reference's JSONL backend).

        Cancellation: the read runs on a worker thread; its result is dropped.
        """
        if not is_nonneg_safe_int(from_seq):
            raise PersistenceArgumentError(
                f"readFrom fromSeq must be a non-negative safe integer, got {from_seq!r}", session_id=session_id
            )
        start = int(from_seq)  # type: ignore[call-overload]

        load_from = getattr(self.backend, "load_from", None)

        def work() -> tuple[FrozenDict, ...]:
            if load_from is not None:
                # A backend that can seek reads only the suffix (so, as the reference's
                # SQLite backend, it refuses unknown types in the suffix only).
                stored = load_from(session_id, start)
                self._refuse_unknown(session_id, stored.records, stored)
                return tuple(freeze_record(r) for r in stored.records)
            stored = self.backend.load(session_id)
            self._refuse_unknown(session_id, stored.records, stored)
            return tuple(freeze_record(r) for r in stored.records[start:])

        return await trio.to_thread.run_sync(work)

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


def refuse_legacy(session_id: str, rec: Any, raw_log: str = "") -> None:
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
        f'session "{session_id}" contains unsupported legacy {what} at seq {seq}{raw_log}', session_id=session_id
    )
