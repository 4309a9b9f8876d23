"""The session actor: the single writer of one live session's log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors import Actor, Rejected
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
from harness.session._session import _NO_TURN

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
            return self._fork(message)
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

    def _fork(self, message: ForkPrefix) -> Session:
        boundary = check_fork_boundary(self.session, message.boundary)
        header = dict(message.header)
        child_id = header["id"]
        parent = self.session
        if parent.header.cwd is not None:
            header["cwd"] = parent.header.cwd
        clock = parent._clock
        if boundary is None:  # an empty source: an empty seed
            header["seedLength"] = 0
            return Session.create(child_id, [], header, clock=clock, validator=message.validator)
        header["seedLength"] = boundary + 1
        return Session.fork_of(parent, boundary, child_id, header, clock=clock, validator=message.validator)

    def _append(self, drafts: tuple[Any, ...]) -> tuple[Event, ...]:
        plan = self.session.plan(drafts)
        for hook in list(self.listeners.pre_commit):
            try:
                hook(self.session_handle, plan.events)
            except Exception as exc:
                # A veto is an answer (nothing is committed), not a session-actor bug.
                raise Rejected(exc) from None
        events = self.session.commit(plan)
        # Published once entered (the reference publishes for every attached session).
        self.listeners.emit_event(self.session_handle, events)
        return events


def check_fork_boundary(session: Session, boundary: object) -> int | None:
    """Boundary checks of reference §8 (steps 3-4): the validated boundary, or
    ``None`` when it was omitted on an empty session (an empty prefix)."""
    sid = session.id
    events = session.events
    n = len(events)
    if boundary is None:
        if n == 0:
            return None
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
    turn = session.open_turn_at(boundary)
    if turn is not _NO_TURN:
        raise OpenTurnError(
            f'fork boundary {boundary} in session "{sid}" ends inside open turn {turn}',
            session_id=sid,
        )
    return boundary
