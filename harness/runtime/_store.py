"""The store actor: the one place that decides whether a session is live (reference §7-§8)."""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, final

import trio

from actors import (
    Actor,
    ActorCrashedError,
    ActorRef,
    ActorRuntime,
    ActorStoppedError,
    Owner,
    Rejected,
    Supervisor,
)
from harness.errors import (
    ForkChildExistsError,
    ForkSourceNotFoundError,
    ForkSourceNotLiveError,
    HarnessError,
    PreparationDisposedError,
    SessionAlreadyAnnouncedError,
    SessionAlreadyExistsError,
    SessionArgumentError,
    SessionAttachedError,
    SessionNotLiveError,
    StoreError,
)
from harness.runtime._handles import Entry, SessionHandle
from harness.runtime._listeners import (
    BatchListener,
    CreatedListener,
    DisposedListener,
    EventBatchListener,
    EventListener,
    FlushListener,
    Listeners,
    PreCommitHook,
    Registry,
    refuse_awaitable,
    subscribe,
    subscribe_sync,
)
from harness.runtime._messages import (
    Adopt,
    Announce,
    Close,
    Create,
    Detach,
    Enter,
    Fork,
    ForkPrefix,
    Get,
    List,
    Prepare,
)
from harness.runtime._scopes import Binding, Retirements, Scoped, check_listener_owner, check_owner
from harness.runtime._session_actor import SessionActor
from harness.runtime._warnings import Warnings
from harness.session import AppendValidator, Clock, Event, Session, check_session_id, wall_clock_ms
from harness.session._append_types import check_all, data_read_by

log = logging.getLogger("harness.store")

_META_KEYS = {
    "cwd": "cwd",
    "parent_session": "parentSession",
    "seed_length": "seedLength",
    "origin": "origin",
    "delegation_depth": "delegationDepth",
    "agent_preset": "agentPreset",
    "created_at": "createdAt",
}


@final
class PreparedSession:
    """An unpublished session owned by the caller until it is entered.

    (Persistence's :class:`~harness.persistence.SessionPreparation` is the one that
    holds resources; this one holds only the session.)
    """

    __slots__ = ("disposed", "entered", "session")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.entered = False
        self.disposed = False

    @property
    def id(self) -> str:
        return self.session.id

    def dispose(self) -> None:
        """Idempotent: a disposed preparation can no longer be entered."""
        self.disposed = True


_ATTACHED: Final[weakref.WeakKeyDictionary[Session, Entry]] = weakref.WeakKeyDictionary()
"""Process-wide: the store entry each attached :class:`Session` object is in. One
store at a time per object (reference §7); released when its detach has drained."""


def _schedule_points(task: trio.lowlevel.Task) -> int | None:
    """How many times ``task`` yielded to the scheduler (the counter
    ``trio.testing.assert_checkpoints`` reads); ``None`` if this Trio has no such
    counter (the caller then assumes no yield happened and adds one)."""
    return getattr(task, "_schedule_points", None)


def _not_live(value: object) -> SessionNotLiveError:
    """The refusal for a value that is not a live handle of the store. Nothing is
    coerced: a value without a session id is named as it is."""
    if type(value) is SessionHandle:
        sid = value.id
        return SessionNotLiveError(f'session "{sid}" is not live in this store', session_id=sid)
    if isinstance(value, (Session, PreparedSession)):
        sid = value.id
        return SessionNotLiveError(
            f'session "{sid}" is not live in this store: a {type(value).__name__} is not '
            "its SessionHandle",
            session_id=sid,
        )
    return SessionNotLiveError(f"expected a SessionHandle of this store, got {value!r}")


def _check_id(value: object) -> str:
    # Before any lookup: an unhashable id must be an answer, not a store-actor crash;
    # and a new id that storage cannot name must be refused here, not by the first
    # write-behind flush (issue 16, docs/limits.md).
    return check_session_id(value)


class _Checked:
    """One session's state under one installed validator.

    States are keyed by seq (reference §4.2): the hook computes the state after a
    batch before the commit, and adopts it only once the next batch shows that the
    log did grow by it (a later pre-commit hook may veto the batch).
    """

    __slots__ = ("pending", "reads", "seq", "state", "validator")

    def __init__(self, validator: AppendValidator, state: Any, seq: int) -> None:
        self.validator = validator
        self.state = state
        self.seq = seq
        self.pending: tuple[int, Any] | None = None
        #: The event types whose data the validator reads (``AppendValidator.reads_data``).
        self.reads = data_read_by(validator)


class _Companion:
    """An installed validator (``Store.install_validator``): a pre-commit hook that
    checks every published append of a live session with that session's own validator
    (made by ``factory``, replayed over its log when it was entered or installed)."""

    __slots__ = ("factory",)

    def __init__(self, factory: Callable[[], AppendValidator]) -> None:
        self.factory = factory

    def replay(self, session: Session) -> _Checked:
        validator = self.factory()
        try:
            state = session.replay(validator)
        except HarnessError as exc:
            exc.session_id = exc.session_id or session.id
            raise
        return _Checked(validator, state, session.seq)

    def __call__(self, handle: SessionHandle, events: tuple[Event, ...]) -> None:
        entry = handle._entry
        checked = entry.companions.get(self)
        if checked is None or not events:
            return
        base = events[0].seq
        pending = checked.pending
        checked.pending = None
        if pending is not None and pending[0] == base:
            checked.seq, checked.state = pending  # the batch it checked was committed
        elif checked.seq != base:
            # The log grew past this hook (never in the runtime): start over.
            fresh = self.replay(entry.session)
            checked.seq, checked.state = fresh.seq, fresh.state
        try:
            state = check_all(checked.validator, checked.state, events)
        except HarnessError as exc:
            exc.session_id = exc.session_id or handle.id
            raise
        checked.pending = (events[-1].seq + 1, state)


class StoreActor(Actor[Any]):
    """Holds ``id -> live session`` and serialises every liveness decision."""

    rejections = (HarnessError,)
    mailbox_size = 128

    def __init__(self, store: Store) -> None:
        self.store = store
        self.name = "store"

    async def handle(self, message: Any) -> Any:
        t = type(message)
        if t is Create:
            check_owner(message.owner, "create", message.session_id)
            prepared = self._prepare(message.session_id, message.seed, message.meta)
            handle = self._enter(prepared, message.owner, bound=True, what="create")
            try:
                self._announce(handle)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self._detach(handle)
                raise
            return handle
        if t is Prepare:
            return self._prepare(message.session_id, message.seed, message.meta)
        if t is Adopt:
            session = message.session
            if type(session) is not Session:
                raise SessionArgumentError(f"adopt takes a Session, got {session!r}")
            if session.id in self.store._entries:
                raise SessionAlreadyExistsError(f'session "{session.id}" already exists', session_id=session.id)
            return PreparedSession(session)
        if t is Enter:
            return self._enter(message.prepared, message.scope)
        if t is Announce:
            self._announce(message.handle)
            return None
        if t is Detach:
            await self._detach(message.handle)
            return None
        if t is Fork:
            check_owner(message.owner, "fork", message.child_id)
            return await self._fork(message.source, message.boundary, message.child_id, message.owner)
        if t is Get:
            sid = message.session_id
            entry = self.store._entries.get(sid) if type(sid) is str else None
            return None if entry is None else entry.handle
        if t is List:
            return [e.handle for e in self.store._entries.values()]
        if t is Close:
            for entry in reversed(list(self.store._entries.values())):
                assert entry.handle is not None
                await self._detach(entry.handle)
            return None
        raise TypeError(f"store actor got an unknown message {message!r}")

    # -- steps ---------------------------------------------------------------------------

    def _mint(self) -> str:
        # Random, not a per-store counter (the reference's ``session-<n>``): a
        # counter restarts in every process, and its ids collide with the durable
        # sessions an earlier run left on disk.
        while True:
            sid = f"session-{uuid.uuid4()}"
            if sid not in self.store._entries:
                return sid

    def _prepare(self, session_id: str | None, seed: Sequence[Any] | None, meta: dict[str, Any]) -> PreparedSession:
        sid = self._mint() if session_id is None else _check_id(session_id)
        if sid in self.store._entries:
            raise SessionAlreadyExistsError(f'session "{sid}" already exists', session_id=sid)
        store = self.store
        header: dict[str, Any] = {"version": 0, "id": sid, "createdAt": meta.get("created_at", store.clock())}
        for key, wire in _META_KEYS.items():
            if key != "created_at" and meta.get(key) is not None:
                header[wire] = meta[key]
        # No validator here: installed validators check a session from its enter on
        # (replaying its log, so a bad seed fails the enter, hence ``create``).
        session = Session.create(sid, seed, header, clock=store.clock)
        return PreparedSession(session)

    def _enter(
        self, prepared: PreparedSession, scope: Owner | None = None, *, bound: bool = False, what: str = "enter"
    ) -> SessionHandle:
        """Make ``prepared`` live, with ``scope`` as its routing scope; ``bound``: the
        scope owns it (closing the owner detaches it). Synchronous: the owner's check
        and its cleanup's registration are atomic with the enter."""
        store = self.store
        if scope is not None:
            check_owner(scope, what, getattr(prepared, "id", None))
        if type(prepared) is not PreparedSession:
            if type(prepared) is Session:
                raise SessionArgumentError(
                    f'session "{prepared.id}" cannot be entered as a Session: enter takes its '
                    "PreparedSession (from store.prepare or store.adopt)",
                    session_id=prepared.id,
                )
            raise SessionArgumentError(f"enter takes a PreparedSession, got {prepared!r}")
        session = prepared.session
        sid = prepared.id
        if sid in store._entries:
            raise SessionAlreadyExistsError(f'session "{sid}" already exists', session_id=sid)
        if session in _ATTACHED:
            raise SessionAttachedError(f'session "{sid}" is already attached to a store', session_id=sid)
        if prepared.disposed:
            raise PreparationDisposedError(
                f'cannot enter session "{sid}": its preparation was disposed', session_id=sid
            )
        entry = Entry(session)
        # Every installed validator replays the log first: a violation refuses the enter.
        for companion in store._companions:
            entry.companions[companion] = companion.replay(session)
        prepared.entered = True
        handle = SessionHandle(store, entry)
        entry.handle = handle
        entry.ref = store._runtime.spawn(SessionActor(session, store.listeners, handle))
        store._entries[sid] = entry
        _ATTACHED[session] = entry
        if scope is not None:
            release = scope.defer(lambda: store._detach_owned(handle), name=f'detach session "{sid}"') if bound else None
            store._bindings[entry] = Binding(scope, release)
        return handle

    def _announce(self, handle: SessionHandle) -> None:
        if type(handle) is not SessionHandle:
            raise _not_live(handle)
        entry = self.store._live_entry(handle.id)
        if entry is None or entry is not handle._entry:
            raise SessionNotLiveError(f'session "{handle.id}" is not live in this store', session_id=handle.id)
        if entry.announced:
            raise SessionAlreadyAnnouncedError(f'session "{handle.id}" was already announced', session_id=handle.id)
        entry.announced = True  # set before dispatch: a reentrant announce is refused
        for _, listener in self.store.listeners.created.heard_by(handle):
            try:
                result: Any = listener(handle)
                if result is not None:
                    refuse_awaitable("session/created", listener, result)
            except Exception as exc:
                # A veto is an answer, not a store bug: later listeners are skipped
                # and the caller gets the listener's own exception.
                raise Rejected(exc) from None

    async def _detach(self, handle: SessionHandle) -> None:
        store = self.store
        if type(handle) is not SessionHandle or handle._store is not store:
            raise _not_live(handle)
        entry = handle._entry
        if entry.detached:
            return  # idempotent: a stale handle of this store
        entry.detached = True
        if entry.ref is not None:
            # Drain: messages queued before the detach are applied (and published).
            with trio.CancelScope(shield=True):
                await store._runtime.stop(entry.ref)
        if store._entries.get(handle.id) is entry:
            del store._entries[handle.id]
        entry.freeze()  # stale handles keep answering this state, whatever comes next
        _release(entry)  # drained: the Session object may be entered again
        if entry.announced:
            store.listeners.emit_disposed(handle)  # routed by the scope captured at enter
        binding = store._bindings.pop(entry, None)
        if binding is not None:
            if binding.release is not None:
                binding.release()  # detached: its owner has nothing left to detach
            store._retirements.session_gone()  # a closed owner's listeners may go now
        # Entry and handle refer to each other: unlink them, so a retired session is
        # freed by reference counting as soon as no stale handle names it (a cycle
        # would keep its whole log for the collector to find, late if it was promoted).
        entry.handle = None

    async def _fork(
        self, source: Any, boundary: object, child_id: str | None, owner: Owner | None = None
    ) -> SessionHandle:
        store = self.store
        if child_id is not None:
            _check_id(child_id)
            if child_id in store._entries:
                raise ForkChildExistsError(f'session "{child_id}" already exists', session_id=child_id)
        # Source resolution (reference §8.2). The live store instance of a session is
        # its handle: a Session or PreparedSession object is resolved by its id, and is
        # never that instance. Nothing else is coerced to an id.
        if type(source) is str:
            sid = source
        elif type(source) is SessionHandle or isinstance(source, (Session, PreparedSession)):
            sid = source.id
        else:
            raise ForkSourceNotFoundError(f"fork source must be a SessionHandle or a session id, got {source!r}")
        entry = store._entries.get(sid)
        if entry is None:
            raise ForkSourceNotFoundError(f'session "{sid}" not found', session_id=sid)
        if type(source) is not str and (type(source) is not SessionHandle or entry is not source._entry):
            raise ForkSourceNotLiveError(f'session "{sid}" is not the live store instance', session_id=sid)
        assert entry.ref is not None
        new_id = self._mint() if child_id is None else child_id
        header: dict[str, Any] = {"version": 0, "id": new_id, "createdAt": store.clock(), "parentSession": sid}
        try:
            child = await entry.ref.call(ForkPrefix(boundary, header))
        except (ActorStoppedError, ActorCrashedError) as exc:
            # A stopped or crashed source is not live; the store itself goes on.
            raise ForkSourceNotLiveError(
                f'session "{sid}" is not the live store instance', session_id=sid
            ) from exc
        prepared = PreparedSession(child)
        handle = self._enter(prepared, owner, bound=True, what="fork")
        try:
            self._announce(handle)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._detach(handle)
            raise
        return handle


@final
class Store:
    """The public face of a store: async methods that message the store actor.

    Get one with :func:`open_store`. Every method's cancellation contract is the
    actor kernel's (decision 0007): ``Cancelled`` means nothing happened (the request
    was withdrawn before the store actor took it); once taken, the request completes
    and its result is returned (e.g. the created session's handle), the cancellation
    landing at the caller's next checkpoint. ``ReplyOverdueError`` means the outcome
    is unknown: ask :meth:`get`.
    """

    def __init__(
        self,
        runtime: ActorRuntime,
        *,
        clock: Clock,
        validator_factory: Callable[[], AppendValidator] | None,
    ) -> None:
        self._runtime = runtime
        self._entries: dict[str, Entry] = {}
        self.clock = clock
        self.listeners = Listeners()
        self._companions: list[_Companion] = []
        self._ref: ActorRef[Any] = runtime.spawn(StoreActor(self))
        self._closed = False
        # Per live session entered with a scope (see _scopes): owned by the store actor.
        self._bindings: dict[Entry, Binding] = {}
        # Scoped listeners, released with their owner (see _scopes.Retirements).
        self._retirements = Retirements(self._in_scope)
        if validator_factory is not None:
            self.install_validator(validator_factory)

    def _live_entry(self, session_id: str) -> Entry | None:
        entry = self._entries.get(session_id)
        if entry is None or entry.detached:
            return None
        return entry

    def _scope_of(self, entry: Entry) -> Owner | None:
        binding = self._bindings.get(entry)
        return None if binding is None else binding.scope

    def _in_scope(self, scope: Owner) -> bool:
        """Whether a live session's scope is ``scope`` or descends from it."""
        return any(binding.scope.descends_from(scope) for binding in self._bindings.values())

    def scope_of(self, handle: SessionHandle) -> Owner | None:
        """The owner ``handle``'s session was entered with (its routing scope), or
        ``None``; kept until its ``session/disposed`` was dispatched.

        Raises:
            SessionNotLiveError: ``handle`` is not a :class:`SessionHandle`.
        """
        if type(handle) is not SessionHandle:
            raise _not_live(handle)
        return self._scope_of(handle._entry)

    async def _detach_owned(self, handle: SessionHandle) -> None:
        """An owner's cleanup: detach the session it owns. Runs in the owner's task,
        shielded by it; a store that is already closed has detached it (or is gone)."""
        try:
            await self.detach(handle)
        except StoreError as exc:
            log.debug('session "%s": its owner\'s detach found the store closed: %s', handle.id, exc)

    def _scoped(self, kind: str, listener: Any, scope: Owner | None) -> Any:
        """``listener``, or its scoped wrapper; refused first as an unscoped one would
        be (an async listener where a synchronous one is required)."""
        if scope is None:
            return listener
        if kind != "session/flush":
            subscribe_sync(kind, [], listener)
        if not isinstance(scope, Owner):
            raise SessionArgumentError(f"{kind} listener scope must be an actors.Owner, got {scope!r}")
        check_listener_owner(scope, kind)
        return Scoped(listener, scope, self._scope_of)

    def _listen(self, kind: str, items: Registry, listener: Any, scope: Owner | None) -> Callable[[], None]:
        """Subscribe ``listener`` (scoped to ``scope`` when given: released with it)."""
        wrapped = self._scoped(kind, listener, scope)
        if kind == "session/flush":
            unsubscribe = subscribe(items, wrapped)
        else:
            unsubscribe = subscribe_sync(kind, items, wrapped)
        if scope is None or self._closed:
            return unsubscribe  # a closed store calls no listener: nothing to tie to the owner
        return self._retirements.register(scope, unsubscribe, kind)

    @property
    def runtime(self) -> ActorRuntime:
        return self._runtime

    @property
    def warnings(self) -> Warnings:
        """This store's warnings channel: contained listener failures and background
        write failures of its persistence (see :class:`~harness.runtime.Warnings`)."""
        return self.listeners.warnings

    # -- synchronous reads (no round trip) -------------------------------------------------

    def live_ids(self) -> tuple[str, ...]:
        """The ids of the live sessions, in enter order: an immutable snapshot.

        No actor round trip: it reads the store actor's map, which only that actor
        changes, in synchronous code. Unlike :meth:`list` it is not ordered after the
        requests already queued to the store actor.
        """
        return tuple(sid for sid, entry in self._entries.items() if not entry.detached)

    def get_nowait(self, session_id: str) -> SessionHandle | None:
        """The live handle for ``session_id``, or ``None``, without a round trip (see
        :meth:`live_ids` for how it differs from :meth:`get`)."""
        entry = self._live_entry(session_id) if type(session_id) is str else None
        return None if entry is None else entry.handle

    def _abandon(self) -> None:
        """The runtime is gone (its actors ended without a detach): refuse new requests
        and release every Session object this store still holds for other stores."""
        self._closed = True
        for entry in self._entries.values():
            entry.freeze()  # a stale handle keeps this state if the Session is entered again
            _release(entry)
        self._retirements.release_all()  # no listener of this store is called any more

    # -- validators (the invariant companion, reference §11) -----------------------------

    @property
    def validator_factory(self) -> Callable[[], AppendValidator] | None:
        """The factory of the most recently installed validator still installed, or
        ``None``."""
        return self._companions[-1].factory if self._companions else None

    def install_validator(self, factory: Callable[[], AppendValidator]) -> Callable[[], None]:
        """Install a pre-commit validator (e.g. :class:`~harness.session.RelationalInvariants`)
        on this running store; return its idempotent remover.

        Every live session gets its own ``factory()`` validator, replayed over its whole
        log first (its seed replay included): if any session violates it, the install
        raises that session's error (``session_id`` names it) and nothing is installed.
        From then on every published append of a live session is checked before it
        commits (a violation vetoes the whole batch, nothing is logged), and every
        session entered later (created, forked, adopted) is replayed at its enter, so a
        bad log fails the enter. Detached sessions are not checked.

        Calling the remover removes this validator: nothing it installed is checked any
        more, on live sessions or later ones. Installs stack: each checks independently.
        ``open_store(validator_factory=...)`` installs one before any session exists.

        Synchronous and atomic: the replays run without a checkpoint, so no append
        interleaves (a long log blocks the event loop for its replay, O(events)).
        """
        companion = _Companion(factory)
        live = [e for e in self._entries.values() if not e.detached]
        checked = [companion.replay(e.session) for e in live]  # raises before any change
        for entry, state in zip(live, checked, strict=True):
            entry.companions[companion] = state
        self._companions.append(companion)
        unsubscribe = subscribe(self.listeners.pre_commit, companion)

        def remove() -> None:
            if companion in self._companions:
                self._companions.remove(companion)
            unsubscribe()
            for entry in self._entries.values():
                entry.companions.pop(companion, None)

        return remove

    async def _call(self, message: Any) -> Any:
        if self._closed:
            raise StoreError("the store is closed")
        try:
            return await self._ref.call(message)
        except ActorStoppedError:
            raise StoreError("the store is closed") from None

    # -- sessions ----------------------------------------------------------------------

    async def create(
        self,
        session_id: str | None = None,
        *,
        seed: Sequence[Any] | None = None,
        owner: Owner | None = None,
        **meta: Any,
    ) -> SessionHandle:
        """Prepare, enter and announce a new session; returns its handle.

        ``owner`` (an open :class:`actors.Owner`) owns the session: closing it
        detaches the session (``session/disposed``), and it is the session's routing
        scope (see :meth:`on_event`). A closed owner is refused with
        :class:`~harness.errors.SessionOwnerClosedError` (``OWNER_CLOSED``), nothing
        created; the check and the owner's registration are atomic with the enter.

        ``meta``: ``cwd``, ``parent_session``, ``seed_length``, ``origin``,
        ``delegation_depth``, ``agent_preset``, ``created_at``. Without an id one is
        minted (``session-<uuid4>``: unique across processes, unlike the reference's
        per-store counter). If a ``created`` listener vetoes, the session is
        detached (``disposed`` is emitted) and the error propagates.

        Cancellation: ``Cancelled`` means no session was created; once the store
        actor took the request, the handle is returned (see :class:`Store`).
        """
        _check_meta(meta)
        return await self._call(Create(session_id, seed, meta, owner))  # type: ignore[no-any-return]

    async def prepare(
        self, session_id: str | None = None, *, seed: Sequence[Any] | None = None, **meta: Any
    ) -> PreparedSession:
        """Build an unpublished session (not entered, nothing emitted).

        Cancellation: the actor kernel's contract; an unwanted preparation is garbage.
        """
        _check_meta(meta)
        return await self._call(Prepare(session_id, seed, meta))  # type: ignore[no-any-return]

    async def adopt(self, session: Session) -> PreparedSession:
        """Wrap an already-built session (e.g. restored from disk) as a preparation.

        Cancellation: the actor kernel's contract.
        """
        return await self._call(Adopt(session))  # type: ignore[no-any-return]

    async def enter(self, prepared: PreparedSession, *, scope: Owner | None = None) -> SessionHandle:
        """Make a prepared session live (not yet announced).

        ``scope`` (an open :class:`actors.Owner`) is its routing scope only: the
        caller keeps the duty to detach it (the agent loop enters an agent's session
        in its owner's scope and disposes it itself).

        Cancellation: withdrawn before it is taken; after, the session is live.
        """
        return await self._call(Enter(prepared, scope))  # type: ignore[no-any-return]

    async def announce(self, handle: SessionHandle) -> None:
        """Emit ``created`` for an entered session; a listener's raise propagates.

        Cancellation: withdrawn before it is taken; after, listeners have run.
        """
        await self._call(Announce(handle))

    async def detach(self, handle: SessionHandle) -> None:
        """Idempotent. Drains the session's queued messages, removes it, emits
        ``disposed`` if it was announced. Once the store actor has taken the request,
        the detach completes even if the caller is cancelled."""
        await self._call(Detach(handle))

    async def get(self, session_id: str) -> SessionHandle | None:
        """The live handle for ``session_id``, or ``None``. Cancellation: only the wait."""
        return await self._call(Get(session_id))  # type: ignore[no-any-return]

    async def list(self) -> list[SessionHandle]:
        """Live sessions in enter order (a fresh list).

        Cancellation: only the wait.
        """
        return await self._call(List())  # type: ignore[no-any-return]

    async def fork(
        self,
        source: SessionHandle | str,
        boundary: int | None = None,
        child_id: str | None = None,
        *,
        owner: Owner | None = None,
    ) -> SessionHandle:
        """Create a child session from the inclusive prefix ``events[0..boundary]``.

        Checks, in the reference's order: child id live (``SESSION_ALREADY_EXISTS``);
        source not live (``SESSION_NOT_FOUND``) or stale (``SESSION_NOT_LIVE``);
        boundary (``INVALID_BOUNDARY``); prefix ends in an open turn (``OPEN_TURN``).
        The child shares the prefix's event objects (no copy), gets its own
        ``session/end-seed``, and its header names the parent and the seed length.

        ``owner`` owns the child as :meth:`create`'s owner does (checked before the
        source, ``OWNER_CLOSED``); the source's owner is not inherited.

        Cancellation: ``Cancelled`` means no child was created; once the store actor
        took the request, the child's handle is returned (see :class:`Store`).
        """
        return await self._call(Fork(source, boundary, child_id, owner))  # type: ignore[no-any-return]

    async def flush(self, handle: SessionHandle) -> bool:
        """Run every flush listener that hears a live session (unscoped ones, and scoped
        ones of its scope); raise the first failure in listener order; return whether
        any listener heard it.

        The session's queued messages are handled first (a barrier), so everything
        appended before the call is covered.

        Cancellation: a checkpoint. A caller cancelled before it runs the listeners gets
        ``Cancelled`` and none runs; a cancellation meanwhile propagates to the
        listeners. It yields once whatever they do: for an idle session the listeners'
        own wait (a durable write) is the schedule point, and one is added only when
        they had none.

        A session entered but not announced has not been shown to any listener (no
        ``session/created``): its flush runs the barrier only and returns ``False``
        (persistence writes nothing for it until it is announced).
        """
        if type(handle) is not SessionHandle or handle._store is not self:
            raise _not_live(handle)
        entry = handle._entry
        ref = entry.ref
        if ref is None or self._live_entry(handle.id) is not entry:  # handle.alive, _ref(), inlined
            raise _not_live(handle)
        if not ref.idle:
            await handle.barrier()  # a round trip: a checkpoint of its own
            if not handle._entry.announced:
                return False
            return await self.listeners.run_flush(handle)
        # The actor is idle: everything sent before the call is handled already, and no
        # round trip is needed. The flush stays a checkpoint, but not two: a cancel
        # point now, and a schedule point only if the listeners had none (a flush that
        # writes yields while it waits for its write; a separate barrier checkpoint was
        # one whole scheduler pass per durable flush, issue 26).
        task = trio.lowlevel.current_task()
        points = _schedule_points(task)
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            if not entry.announced:
                heard = False
            elif (direct := self.listeners.flush.direct) is not None:
                # The only flush listener, in its direct form (see DirectFlush): no
                # listener-layer frames between this flush and the listener's wait.
                waiting = direct(handle, False)
                if waiting is not None:
                    await waiting
                heard = True
            else:
                heard = await self.listeners.run_flush(handle)
        except Exception:
            if points is None or _schedule_points(task) == points:
                await trio.lowlevel.cancel_shielded_checkpoint()
            raise
        if points is None or _schedule_points(task) == points:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return heard

    async def _flush_applied(self, handle: SessionHandle) -> None:
        """The flush of ``handle.append(..., durable=True)``, called right after the
        append was applied (on the caller's task, ``ActorRef.call_nowait``, or by a
        busy actor, the call's reply): what :meth:`flush` does, without its cancel
        point (the append's was that one) and not cancellable at all (``Cancelled``
        would tell the caller "not applied"). It yields once, whatever the listeners
        do, and raises what :meth:`flush` would -- but never "not live": a session
        detached since (a queued append is applied by the detach's drain) is flushed
        as :meth:`flush` flushes one detached during its barrier, by the listeners.

        The common case -- the only flush listener in its direct form, the session
        live, announced and its actor idle -- awaits the listener's wait directly (it
        refuses cancellation); anything else runs :meth:`flush` in a shielded scope."""
        entry = handle._entry
        ref = entry.ref
        task = trio.lowlevel.current_task()
        points = _schedule_points(task)
        try:
            if ref is None or self._live_entry(handle.id) is not entry:
                if entry.announced:
                    with trio.CancelScope(shield=True):
                        await self.listeners.run_flush(handle)
            elif (direct := self.listeners.flush.direct) is None or not ref.idle or not entry.announced:
                with trio.CancelScope(shield=True):
                    await self.flush(handle)
            else:
                waiting = direct(handle, True)
                if waiting is not None:
                    await waiting
        finally:
            if points is None or _schedule_points(task) == points:
                await trio.lowlevel.cancel_shielded_checkpoint()

    # -- listeners -----------------------------------------------------------------------

    # ``created``/``event``/``disposed`` listeners and pre-commit hooks are called
    # synchronously: an async one raises AsyncListenerError here (see Listeners).

    # ``scope=`` (an actors.Owner) on created/event/disposed/flush listeners: the
    # listener hears only sessions entered in that owner's scope or a descendant's
    # (reference §7 scope routing; see harness.runtime._scopes). Unscoped: every one.

    def on_created(self, listener: CreatedListener, *, scope: Owner | None = None) -> Callable[[], None]:
        """``session/created(handle)``: a raise vetoes the announcement. ``scope``: as
        :meth:`on_event`'s (released with its owner). Returns an idempotent unsubscribe."""
        return self._listen("session/created", self.listeners.created, listener, scope)

    def on_event(self, listener: EventListener, *, scope: Owner | None = None) -> Callable[[], None]:
        """``session/event(handle, event)``, after each commit; a raise is contained
        (logged and reported to :attr:`warnings`). Returns an idempotent unsubscribe.

        ``scope`` (an :class:`actors.Owner`): hear only the sessions entered in that
        owner's scope or a descendant's (:meth:`scope_of`; reference §7 scope routing);
        without it, every session. A scoped listener is released with its owner: once
        the owner has closed and the last live session of its scope has been detached
        (it hears every disposal its close causes), it is unsubscribed and neither the
        owner nor the store holds it any more. The owner must be open:
        :class:`~harness.errors.SessionOwnerClosedError` (``OWNER_CLOSED``) otherwise."""
        return self._listen("session/event", self.listeners.event, listener, scope)

    def on_event_batch(self, listener: EventBatchListener, *, scope: Owner | None = None) -> Callable[[], None]:
        """The batch form of :meth:`on_event`: ``listener(handle, events)`` once per
        commit, ``events`` the tuple of the events it made, in seq order (one call where
        :meth:`on_event` makes one per event). It takes its place among the ``on_event``
        listeners in registration order; ``scope`` and the unsubscribe are
        :meth:`on_event`'s. A raise is contained and reported once for the batch.
        Unsubscribed by an earlier listener during the commit's dispatch, it is called
        with the first event only (as a per-event listener hears only that one)."""
        subscribe_sync("session/event", [], listener)  # an async one is refused as such
        return self._listen("session/event", self.listeners.event, BatchListener(listener), scope)

    def on_disposed(self, listener: DisposedListener, *, scope: Owner | None = None) -> Callable[[], None]:
        """``session/disposed(handle)``, when an announced session is detached; a raise
        is contained like ``on_event``'s; ``scope`` routes by the scope captured at
        enter, as ``on_event``'s. Returns an idempotent unsubscribe."""
        return self._listen("session/disposed", self.listeners.disposed, listener, scope)

    def add_pre_commit_hook(self, hook: PreCommitHook) -> Callable[[], None]:
        """``hook(handle, events)`` before each commit; a raise vetoes the batch (nothing
        is logged). Returns an idempotent unsubscribe."""
        return subscribe_sync("pre-commit", self.listeners.pre_commit, hook)

    def on_flush(self, listener: FlushListener, *, scope: Owner | None = None) -> Callable[[], None]:
        """``session/flush(handle)`` on every :meth:`flush`; it may be async (awaited)
        or a plain function. ``scope``: as :meth:`on_event`'s (a flush of a session out
        of scope neither runs it nor counts it). Returns an idempotent unsubscribe."""
        return self._listen("session/flush", self.listeners.flush, listener, scope)

    async def aclose(self) -> None:
        """Detach every live session (``disposed`` for each announced one), then refuse
        new requests. Idempotent.

        Cancellation: the actor kernel's contract; once the store actor has taken the
        request every session is detached (each stop shielded and bounded by the
        runtime's ``stop_grace``) and the store refuses new requests either way.
        """
        if self._closed:
            return
        try:
            await self._ref.call(Close())
        finally:
            self._closed = True


def _check_meta(meta: dict[str, Any]) -> None:
    unknown = set(meta) - set(_META_KEYS)
    if unknown:
        raise TypeError(f"unknown session metadata: {', '.join(sorted(unknown))}")


@asynccontextmanager
async def open_store(
    *,
    clock: Clock = wall_clock_ms,
    validator_factory: Callable[[], AppendValidator] | None = None,
    supervisor: Supervisor | None = None,
) -> AsyncIterator[Store]:
    """Run a store (and its session actors) for the duration of the block.

    Leaving normally detaches every session (emitting ``disposed``), then stops the
    session actors and the store actor in order. Leaving with an error or by
    cancellation cancels the actors; every pending call fails, none hangs.
    """
    kwargs: dict[str, Any] = {} if supervisor is None else {"supervisor": supervisor}
    store: Store | None = None
    try:
        async with ActorRuntime(name="store", **kwargs) as runtime:
            store = Store(runtime, clock=clock, validator_factory=validator_factory)
            yield store
            with trio.CancelScope(shield=True):
                await store.aclose()
    finally:
        if store is not None:
            store._abandon()  # after an error exit, nothing was detached


def _release(entry: Entry) -> None:
    """Forget ``entry``'s attachment of its Session object (if it is still its own)."""
    if _ATTACHED.get(entry.session) is entry:
        del _ATTACHED[entry.session]
