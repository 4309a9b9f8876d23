"""Immutable readings of a live session, served without an actor round trip.

A :class:`SessionSnapshot` is what a reader holds instead of asking the session actor:
the header, the events, the surface, the replace generation and the derived messages,
all taken at one moment. Every part is already an immutable O(1) view of the session
core (:class:`~harness.session.EventLog`, :class:`~harness.session.SurfaceNodes`,
:class:`~harness.session.MessageList`), so a snapshot costs a handful of attribute
reads and one incremental derive.

Why it is consistent without a lock: the session actor mutates its :class:`Session`
only inside synchronous code (plan, commit, publish), and Trio switches tasks only at
checkpoints, so a synchronous read never sees half a mutation. The handle caches the
snapshot per log length (a replace is an append too), which makes a snapshot the same
object until the next commit, as if the actor had published it after that commit.
"""

from __future__ import annotations

from typing import final

import attrs

from harness.errors import SessionArgumentError
from harness.session import EventLog, MessageList, Session, SessionHeader, SurfaceNodes


@final
@attrs.frozen(slots=True, eq=False)
class SessionSnapshot:
    """One consistent, immutable reading of a session (no part changes under its holder).

    Get one with :meth:`SessionHandle.snapshot() <harness.runtime.SessionHandle.snapshot>`;
    do not construct it. Later appends and replaces never reach a held snapshot:
    ``events`` never grows, ``surface`` and ``messages`` never change.

    Attributes:
        session_id: The session's id.
        header: The session header (immutable for the session's life).
        events: The committed events, ``events[i].seq == i``.
        surface: The surface nodes (seqs of the model-visible events, in order).
        generation: How many replaces had committed.
        messages: The model-visible messages derived from ``surface``.
        first_live_seq: How many events the live session was constructed with.
    """

    session_id: str
    header: SessionHeader
    events: EventLog
    surface: SurfaceNodes
    generation: int
    messages: MessageList
    first_live_seq: int

    @property
    def seq(self) -> int:
        """The next seq (the log length) when the snapshot was taken."""
        return len(self.events)

    def events_until(self, end: int) -> EventLog:
        """The first ``end`` events (seqs ``0 .. end - 1``) as an O(1) immutable view.

        Raises:
            SessionArgumentError: ``end`` is not an int in ``0 .. seq``
                (``INVALID_SESSION_ARGUMENT``).
        """
        n = self.seq
        if type(end) is not int or not 0 <= end <= n:
            raise SessionArgumentError(
                f'session "{self.session_id}": events_until takes an end in 0..{n}, got {end!r}',
                session_id=self.session_id,
            )
        if end == n:
            return self.events
        # A prefix view over the same append-only backing list (O(1), like the log's own).
        return EventLog(self.events._items, end)


def take_snapshot(session: Session) -> SessionSnapshot:
    """Read ``session`` once, synchronously (no checkpoint: nothing interleaves).

    The derive runs outside the actor but only fills the session's memo of projections
    (idempotent, and the same result the actor's ``Derive`` would return).
    """
    return SessionSnapshot(
        session_id=session.id,
        header=session.header,
        events=session.events,
        surface=session.surface,
        generation=session.generation,
        messages=session.derive_messages(),
        first_live_seq=session.first_live_seq,
    )
