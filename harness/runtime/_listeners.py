"""Lifecycle listeners of a store, with per-listener failure containment (reference §7)."""

from __future__ import annotations

import heapq
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, final

import trio

from actors import Owner
from harness.runtime._scopes import Scoped

# Re-exported (``as``): the agent layer subscribes and refuses its listeners this way too.
from harness.runtime._subscribe import is_async_callable as is_async_callable
from harness.runtime._subscribe import refuse_awaitable as refuse_awaitable
from harness.runtime._subscribe import subscribe as subscribe
from harness.runtime._subscribe import subscribe_sync as subscribe_sync
from harness.runtime._warnings import Warnings

if TYPE_CHECKING:
    from harness.runtime._handles import Entry, SessionHandle
    from harness.session import Event

log = logging.getLogger("harness.store")

CreatedListener = Callable[["SessionHandle"], None]
EventListener = Callable[["SessionHandle", "Event"], None]
EventBatchListener = Callable[["SessionHandle", "tuple[Event, ...]"], None]
DisposedListener = Callable[["SessionHandle"], None]
PreCommitHook = Callable[["SessionHandle", "tuple[Event, ...]"], None]
FlushListener = Callable[["SessionHandle"], "Awaitable[None] | None"]


def describe(exc: BaseException) -> str:
    """``Type: message`` (the reference logs JS ``String(error)``, e.g. ``Error: boom``);
    the bare ``Type`` for an empty message, as ``String(new Error())`` is ``Error``."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class Listeners:
    """The listener sets of one store. Listeners are synchronous callables.

    Contract, mapped from the reference to the actor model:

    * ``created`` runs inside the store actor's announce, in registration order; a
      raise vetoes the announcement (later listeners are skipped).
    * ``pre_commit`` hooks run in the session actor between plan and commit; a raise
      vetoes the append (nothing is logged).
    * ``event`` runs in the session actor right after a commit; a raise is logged
      and never fails or rolls back the append; later listeners still run. The set
      is resolved once per commit: a listener registered during the dispatch is not
      called for it; one unsubscribed during it still hears the event being
      dispatched, but none of the batch's later events.
    * An ``event`` listener registered in its batch form (:class:`BatchListener`,
      ``Store.on_event_batch``) is called once per commit with the committed events
      (a tuple, in seq order) instead of once per event, at its place in the same
      registration order. A raise is contained and reported once for the batch. If it
      was unsubscribed (by an earlier listener) before its turn, it is called with the
      first event only: what the per-event form would have heard.
    * ``disposed`` runs when an announced session is detached; same containment.
    * ``flush`` listeners may be async (or plain functions); ``store.flush`` runs
      them concurrently and raises the first failure in listener order.

    ``created``, ``event`` and ``disposed`` listeners and pre-commit hooks must be
    synchronous: registering an ``async def`` (or an object whose ``__call__`` is one)
    raises :class:`~harness.errors.AsyncListenerError`. A plain callable that returns
    an awaitable anyway fails as if it had raised that error (its awaitable is closed,
    never run): contained and logged for ``event``/``disposed``, a veto for
    ``created``.

    A listener cannot re-enter an actor synchronously: work it starts (for example an
    append to the same session) is queued behind the current message. That replaces
    the reference's "append cannot reenter while another append is being published"
    rejection with ordering.

    A contained failure (``event``, ``disposed``) is logged on ``harness.store`` and
    reported to ``warnings`` (the store's channel) as ``listener-failed``.
    """

    def __init__(self, warnings: Warnings | None = None) -> None:
        self.warnings = Warnings() if warnings is None else warnings
        # Routed by scope (see Registry): a session reaches only the listeners that can
        # hear it, whatever the number of listeners scoped to other owners.
        self.created = Registry()
        self.event = Registry()
        self.disposed = Registry()
        self.pre_commit: list[PreCommitHook] = []
        self.flush = Registry()

    def emit_event(self, handle: SessionHandle, events: tuple[Event, ...]) -> None:
        # The set is resolved once per commit (reference §7: before the commit), but a
        # listener unsubscribed while a batch is dispatched hears none of its later
        # events (the reference dispatches one append at a time and resolves each).
        listeners = self.event
        if not listeners:  # the common case of a store without event listeners
            return
        removals = listeners.removals
        # (A key leaves ``batched`` when it is unsubscribed, maybe during this very
        # dispatch: after a removal the listener's own type says which form it is.)
        batched = listeners.batched
        for key, listener in listeners.heard_by(handle):
            if key in batched or (listeners.removals != removals and _is_batch(listener)):
                # One call for the whole commit (the persistence writer's form): the
                # per-event loop, its Registry checks and a call per event were ~10%
                # of the Trio thread's work in a batch of 50 (issue 26, W10).
                heard = events
                if len(events) > 1 and listeners.removals != removals and not listeners.registered(key):
                    heard = events[:1]  # as the per-event form: the first event only
                self._call_event(handle, listener, heard)
                continue
            later = False
            for ev in events:
                if later and listeners.removals != removals and not listeners.registered(key):
                    break
                later = True
                try:
                    result: Any = listener(handle, ev)
                    if result is not None:
                        refuse_awaitable("session/event", listener, result)
                except Exception as exc:
                    self._event_failed(handle, exc)

    def _call_event(self, handle: SessionHandle, listener: Any, events: tuple[Event, ...]) -> None:
        """Call one batch listener, its failure contained and reported once."""
        try:
            result: Any = listener(handle, events)
            if result is not None:
                refuse_awaitable("session/event", listener, result)
        except Exception as exc:
            self._event_failed(handle, exc)

    def _event_failed(self, handle: SessionHandle, exc: Exception) -> None:
        self.warnings.report(
            log,
            "listener-failed",
            "session/event",
            f'session "{handle.id}": session/event listener threw: {describe(exc)}',
            session_id=handle.id,
            error=exc,
        )

    def emit_disposed(self, handle: SessionHandle) -> None:
        for _, listener in self.disposed.heard_by(handle):
            try:
                result: Any = listener(handle)
                if result is not None:
                    refuse_awaitable("session/disposed", listener, result)
            except Exception as exc:
                self.warnings.report(
                    log,
                    "listener-failed",
                    "session/disposed",
                    f'session "{handle.id}": session/disposed listener threw: {describe(exc)}',
                    session_id=handle.id,
                    error=exc,
                )

    async def run_flush(self, handle: SessionHandle) -> bool:
        """Run the flush listeners that hear ``handle`` (a scoped one only for a session
        of its scope) concurrently; raise the first failure in listener order; return
        whether any listener heard it.

        Cancellation: propagates to the listeners, and a bare ``Cancelled`` (never a
        group of them) is raised once they have all ended.
        """
        heard = self.flush.heard_by(handle)
        if not heard:
            return False
        if len(heard) == 1:
            # The common case (the persistence listener alone): called here, no
            # nursery, no closure or failure list per flush. Its failure is raised as
            # the general path raises the first one.
            result = heard[0][1](handle)
            if result is not None and inspect.isawaitable(result):
                await result
            return True
        listeners = [fn for _, fn in heard]
        failures: list[BaseException | None] = [None] * len(listeners)

        async def run(i: int, fn: FlushListener) -> None:
            try:
                result = fn(handle)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                failures[i] = exc

        try:
            async with trio.open_nursery() as nursery:
                for i, fn in enumerate(listeners):
                    nursery.start_soon(run, i, fn)
        except BaseExceptionGroup as group:
            # run() keeps every Exception, so only cancellation gets here: the
            # caller sees the bare Cancelled its `except trio.Cancelled` expects,
            # not a group of them.
            cancelled = _only_cancelled(group)
            if cancelled is None:
                raise
            raise cancelled from None
        for failure in failures:
            if failure is not None:
                raise failure
        return True


@final
class DirectFlush:
    """A ``flush`` listener with a cheaper form for the store's common case
    (issue 26): ``listener(handle)`` as any flush listener, and ``direct(handle,
    shielded)``, which the store calls *instead* when all of these hold: this is the
    store's only flush registration and it is unscoped, the session is live, announced
    and its actor idle, and the store has just passed a cancel point with no yield
    since. ``direct`` has the listener's effect and cancellation contract, minus a
    cancel point of its own on entry (the store's is that one); it returns an
    awaitable (awaited) or ``None``. With ``shielded`` true (the flush of an
    ``append(..., durable=True)`` that was applied already) the awaitable must not be
    cancellable at all: a shielded scope where it would otherwise be.

    It spares a durable flush the listener layer's coroutine frames (a flush is a
    chain of nine from ``Store.flush`` to the committer's wait otherwise), and the
    listener its own lookups. Registered through ``Store.on_flush`` like any
    listener; any other registration (a second flush listener, a scope) makes the store
    call ``listener`` through the general path again."""

    __slots__ = ("direct", "listener")

    def __init__(
        self, listener: FlushListener, direct: Callable[[SessionHandle, bool], Awaitable[None] | None]
    ) -> None:
        self.listener = listener
        self.direct = direct

    def __call__(self, handle: SessionHandle) -> Awaitable[None] | None:
        return self.listener(handle)

    def __repr__(self) -> str:
        name = getattr(self.listener, "__qualname__", None)
        return f"{name if isinstance(name, str) else self.listener!r} (direct)"


@final
class BatchListener:
    """Marks an ``event`` listener that takes a whole commit at once:
    ``fn(handle, events)``, ``events`` the tuple of events one commit made, in seq order
    (see :class:`Listeners`). Registered through ``Store.on_event_batch``."""

    __slots__ = ("fn",)

    def __init__(self, fn: EventBatchListener) -> None:
        self.fn = fn

    def __call__(self, handle: SessionHandle, events: tuple[Event, ...]) -> Any:
        return self.fn(handle, events)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", None)
        return f"{name if isinstance(name, str) else self.fn!r} (batch)"


class Registry:
    """The listeners of one kind, in registration order, indexed by scope.

    An unscoped listener hears every session; one scoped to ``K`` (a :class:`Scoped`)
    only the sessions whose scope is ``K`` or descends from it. So a session of scope
    ``C`` is heard by the unscoped listeners and by those scoped to ``C`` or one of its
    ancestors: :meth:`heard_by` looks up those few buckets and merges them back into
    registration order, instead of asking every scoped listener of the store (with one
    owner-scoped listener per agent, every append cost O(agents): issue 24 §3).

    Each registration has its own key (a counter: the registration order), so one
    callable registered twice is two entries, and an unsubscribe removes its own;
    ``removals`` counts the unsubscribes, so a dispatch can tell cheaply whether the
    set it resolved is still current. ``batched`` holds the keys of the
    :class:`BatchListener` registrations (scoped or not). Iterating gives the listeners
    in order.
    """

    __slots__ = ("_all", "_keys", "_scope_of", "_scoped", "_unscoped", "batched", "direct", "removals")

    def __init__(self) -> None:
        self._all: dict[int, Any] = {}  # key -> listener; dicts keep insertion order
        self._unscoped: dict[int, Any] = {}
        self._scoped: dict[Owner, dict[int, Scoped]] = {}
        self._keys = itertools.count()
        self._scope_of: Callable[[Entry], Owner | None] | None = None
        self.removals = 0
        self.batched: set[int] = set()
        #: The ``direct`` form of the only registration, if that one is an unscoped
        #: :class:`DirectFlush` (else ``None``): what ``Store.flush`` may call instead.
        self.direct: Callable[[SessionHandle, bool], Awaitable[None] | None] | None = None

    def add(self, listener: Any) -> int:
        """Register ``listener`` last; return the key that :meth:`discard` takes."""
        key = next(self._keys)
        self._all[key] = listener
        if _is_batch(listener):
            self.batched.add(key)
        if isinstance(listener, Scoped):
            self._scoped.setdefault(listener.scope, {})[key] = listener
            self._scope_of = listener.scope_of  # one store: one scope map
        else:
            self._unscoped[key] = listener
        self._resolve_direct()
        return key

    def _resolve_direct(self) -> None:
        only = next(iter(self._all.values())) if len(self._all) == 1 else None
        self.direct = only.direct if type(only) is DirectFlush else None

    def discard(self, key: int) -> None:
        """Remove the registration ``key`` (nothing if it is gone already)."""
        if key not in self._all:
            return
        listener = self._all.pop(key)
        self.removals += 1
        self.batched.discard(key)
        if isinstance(listener, Scoped):
            bucket = self._scoped[listener.scope]
            del bucket[key]
            if not bucket:
                del self._scoped[listener.scope]
        else:
            del self._unscoped[key]
        self._resolve_direct()

    def registered(self, key: int) -> bool:
        return key in self._all

    def heard_by(self, handle: SessionHandle) -> list[tuple[int, Any]]:
        """``(key, listener)`` of every listener that hears ``handle``'s session, in
        registration order: O(scope depth + listeners heard)."""
        if not self._scoped:
            return list(self._unscoped.items())
        assert self._scope_of is not None
        sources = [self._unscoped] if self._unscoped else []
        owner = self._scope_of(handle._entry)
        while owner is not None:
            bucket = self._scoped.get(owner)
            if bucket is not None:
                sources.append(bucket)
            owner = owner.parent
        if len(sources) <= 1:
            return list(sources[0].items()) if sources else []
        # Keys are unique: the merge never compares two listeners.
        return list(heapq.merge(*(bucket.items() for bucket in sources)))

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._all.values()))

    def __len__(self) -> int:
        return len(self._all)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Registry):
            return list(self._all.values()) == list(other._all.values())
        if isinstance(other, list):
            return list(self._all.values()) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Registry({list(self._all.values())!r})"


def _is_batch(listener: Any) -> bool:
    inner = listener.listener if type(listener) is Scoped else listener
    return type(inner) is BatchListener


def _only_cancelled(group: BaseExceptionGroup[BaseException]) -> trio.Cancelled | None:
    """The first ``Cancelled`` of a group holding nothing else, else ``None``."""
    first: trio.Cancelled | None = None
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            inner = _only_cancelled(exc)
            if inner is None:
                return None
            first = first or inner
        elif isinstance(exc, trio.Cancelled):
            first = first or exc
        else:
            return None
    return first
