"""The session actor: the single writer of one live session's log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors import Actor
from harness.errors import (
    HarnessError,
    InvalidBoundaryError,
    OpenTurnError,
    SurfaceChangedError,
)
from harness.runtime._listeners import Listeners
from harness.runtime._messages import Append, Barrier, CommitReplace, Derive, ForkPrefix
from harness.session import Event, Session
from harness.session._events import SAFE_INT_MAX

if TYPE_CHECKING:
    from harness.runtime._handles import SessionHandle


class SessionActor(Actor[Any]):
    """Owns one :class:`Session`; every mutation is a message handled in order.

    A check and the append it guards run in one message, so they are atomic without
    locks. Rejected requests (:class:`HarnessError`) are replies; anything else is a
    bug and crashes the actor.
    """

    rejections = (HarnessError,)
    mailbox_size = 256

    def __init__(self, session: Session, listeners: Listeners, handle: SessionHandle) -> None:
        self.session = session
        self.listeners = listeners
        self.session_handle = handle
        self.name = f"session:{session.id}"

    async def handle(self, message: Any) -> Any:
        if type(message) is Append:
            return self._append(message.drafts)
        if type(message) is Derive:
            return self.session.derive_messages()
        if type(message) is ForkPrefix:
            return fork_prefix(self.session, message.boundary)
        if type(message) is CommitReplace:
            current = self.session.surface_snapshot()
            if current != message.expected:
                raise SurfaceChangedError(
                    f'session "{self.session.id}" surface changed since the replace was planned',
                    session_id=self.session.id,
                )
            return self._append((message.draft,))[0]
        if type(message) is Barrier:
            return None
        raise TypeError(f"session actor got an unknown message {message!r}")

    def _append(self, drafts: tuple[Any, ...]) -> tuple[Event, ...]:
        plan = self.session.plan(drafts)
        for hook in list(self.listeners.pre_commit):
            hook(self.session_handle, plan.events)  # a raise vetoes: nothing is committed
        events = self.session.commit(plan)
        # Published once entered (the reference publishes for every attached session).
        self.listeners.emit_event(self.session_handle, events)
        return events


def fork_prefix(session: Session, boundary: object) -> tuple[Event, ...]:
    """Boundary checks of reference §8 (steps 3-4); returns the inclusive prefix."""
    sid = session.id
    events = session.events
    n = len(events)
    if boundary is None:
        if n == 0:
            return ()
        boundary = n - 1
    if type(boundary) is not int or not 0 <= boundary <= SAFE_INT_MAX:
        raise InvalidBoundaryError(
            f'fork boundary for session "{sid}" must be a non-negative safe integer, got {boundary}',
            session_id=sid,
        )
    if boundary >= n:
        last = "none" if n == 0 else str(n - 1)
        raise InvalidBoundaryError(
            f'fork boundary {boundary} does not exist in session "{sid}" (last seq: {last})',
            session_id=sid,
        )
    if events[boundary].seq != boundary:
        raise InvalidBoundaryError(
            f'fork boundary {boundary} does not match a contiguous event seq in session "{sid}"',
            session_id=sid,
        )
    prefix = events[: boundary + 1]
    for ev in reversed(prefix):
        if ev.type == "turn/end":
            break
        if ev.type == "turn/start":
            data: Any = ev.data
            turn = data.get("turn") if hasattr(data, "get") else None
            raise OpenTurnError(
                f'fork boundary {boundary} in session "{sid}" ends inside open turn {turn}',
                session_id=sid,
            )
    return prefix
