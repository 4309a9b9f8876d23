"""Owners of sessions and the scope routing of store listeners (reference §7).

A session entered with a scope (an :class:`actors.Owner`) carries it until it is
detached: a listener registered with ``scope=K`` hears only sessions whose scope is
``K`` or descends from ``K`` (:meth:`Owner.descends_from`); an unscoped listener
hears every session; a session entered without a scope reaches only unscoped
listeners. Disposal and flush route by the scope captured at enter.
"""

from __future__ import annotations

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
