"""Owners of sessions and the scope routing of store listeners (reference §7).

A session entered with a scope (an :class:`actors.Owner`) carries it until it is
detached: a listener registered with ``scope=K`` hears only sessions whose scope is
``K`` or descends from ``K`` (:meth:`Owner.descends_from`); an unscoped listener
hears every session; a session entered without a scope reaches only unscoped
listeners. Disposal and flush route by the scope captured at enter.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

from actors import Owner
from harness.errors import SessionArgumentError, SessionOwnerClosedError

if TYPE_CHECKING:
    from harness.runtime._handles import Entry, SessionHandle


@final
class Binding:
    """One live session's scope and, when it is owner-bound, the remover of the
    owner's cleanup that detaches it."""

    __slots__ = ("release", "scope")

    def __init__(self, scope: Owner, release: Callable[[], None] | None) -> None:
        self.scope = scope
        self.release = release


def check_owner(owner: object, what: str, session_id: str | None) -> Owner | None:
    """``owner`` as an :class:`Owner` (or ``None``); refuse anything else, and an owner
    that can own nothing new (:class:`SessionOwnerClosedError`)."""
    if owner is None:
        return None
    if not isinstance(owner, Owner):
        raise SessionArgumentError(f"{what}: owner must be an actors.Owner, got {owner!r}", session_id=session_id)
    if not owner.is_open:
        state = f"is closed ({owner.reason})" if owner.closed else "is not open (enter it with async with)"
        name = f'session "{session_id}"' if session_id is not None else "a session"
        raise SessionOwnerClosedError(
            f'{what}: cannot create {name}: owner "{owner.name}" {state}',
            session_id=session_id,
            owner=owner.name,
            reason=owner.reason,
        )
    return owner


def check_listener_owner(scope: Owner, kind: str) -> None:
    """Refuse a listener scope that can own nothing new (closed, or never entered): its
    registration could never be released with it (:class:`SessionOwnerClosedError`)."""
    if not scope.is_open:
        state = f"is closed ({scope.reason})" if scope.closed else "is not open (enter it with async with)"
        raise SessionOwnerClosedError(
            f'{kind} listener: owner "{scope.name}" {state}: a listener scoped to it could never be released',
            owner=scope.name,
            reason=scope.reason,
        )


@final
class Retirements:
    """The scoped listener registrations of one store, released with their owner.

    Registering a listener with ``scope=K`` defers its retirement on ``K``. When ``K``
    closes, the listener is unsubscribed at once if no live session of its scope is
    left; otherwise (sessions of ``K`` and of its descendants are being detached by
    the same close, or were entered in ``K``'s scope only and outlive it) once the last
    of them has been detached, so it still hears every disposal of its scope. A closed
    owner's scope can gain no session, so it is never called again after that. An
    explicit unsubscribe drops the deferred retirement from the owner, and the store
    closing drops them all: neither the owner nor the store keeps the listener alive.
    """

    __slots__ = ("_in_scope", "_keys", "_pending", "_releases")

    def __init__(self, in_scope: Callable[[Owner], bool]) -> None:
        # ``in_scope(K)``: whether a live session's scope is K or descends from K.
        self._in_scope = in_scope
        self._keys = itertools.count()
        self._releases: dict[int, Callable[[], None]] = {}  # removers of owner cleanups
        self._pending: dict[int, tuple[Owner, Callable[[], None]]] = {}  # owner closed

    def register(self, scope: Owner, unsubscribe: Callable[[], None], kind: str) -> Callable[[], None]:
        """Tie ``unsubscribe`` (of a listener already subscribed) to ``scope``'s close;
        return the listener's idempotent unsubscribe. ``scope`` must be open (checked
        by :func:`check_listener_owner` before subscribing)."""
        key = next(self._keys)

        async def retire() -> None:
            self._releases.pop(key, None)
            if self._in_scope(scope):
                self._pending[key] = (scope, unsubscribe)
            else:
                unsubscribe()

        try:
            self._releases[key] = scope.defer(retire, name=f"unsubscribe a {kind} listener")
        except BaseException:
            unsubscribe()  # not tied to the owner: not registered at all
            raise

        def remove() -> None:
            unsubscribe()
            release = self._releases.pop(key, None)
            if release is not None:
                release()
            self._pending.pop(key, None)

        return remove

    def session_gone(self) -> None:
        """A scoped session was detached: retire the listeners of closed owners whose
        scope has no live session left."""
        if not self._pending:
            return
        for key, (scope, unsubscribe) in list(self._pending.items()):
            if not self._in_scope(scope):
                del self._pending[key]
                unsubscribe()

    def release_all(self) -> None:
        """The store closed: its listeners will never be called again; forget them and
        drop every deferred retirement from its owner."""
        releases = list(self._releases.values())
        self._releases.clear()
        for release in releases:
            release()
        pending = list(self._pending.values())
        self._pending.clear()
        for _, unsubscribe in pending:
            unsubscribe()


@final
class Scoped:
    """A listener that hears only the sessions of its scope (and of descendant owners).

    Called like the listener it wraps; for a session out of scope it does nothing and
    returns ``None``. ``scope_of`` maps a handle to its captured scope."""

    __slots__ = ("listener", "scope", "scope_of")

    def __init__(self, listener: Callable[..., Any], scope: Owner, scope_of: Callable[[Entry], Owner | None]) -> None:
        self.listener = listener
        self.scope = scope
        self.scope_of = scope_of

    def hears(self, handle: SessionHandle) -> bool:
        carrier = self.scope_of(handle._entry)
        return carrier is not None and carrier.descends_from(self.scope)

    def __call__(self, handle: SessionHandle, *args: Any) -> Any:
        if self.hears(handle):
            return self.listener(handle, *args)
        return None

    def __repr__(self) -> str:
        name = getattr(self.listener, "__qualname__", None)
        return f"{name if isinstance(name, str) else self.listener!r} (scope {self.scope.name!r})"
