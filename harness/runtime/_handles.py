"""Handles: cheap references to live sessions, refused once their session is not live."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, final

from actors import ActorCrashedError, ActorRef, ActorStoppedError
from harness.errors import SessionNotLiveError
from harness.runtime._messages import Append, Barrier, CommitReplace, Derive
from harness.session import (
    Event,
    EventDraft,
    EventLog,
    FrozenDict,
    JsonValue,
    MessageList,
    ReplaceOp,
    Session,
    SessionHeader,
    SurfaceOp,
)

if TYPE_CHECKING:
    from harness.runtime._store import Store


class Entry:
    """The store's record of one live session (owned by the store actor)."""

    __slots__ = ("announced", "detached", "handle", "ref", "session")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.ref: ActorRef[Any] | None = None
        self.announced = False
        self.detached = False
        self.handle: SessionHandle | None = None


@final
class SessionHandle:
    """A reference to one live session in one store.

    Cheap to copy and pass around. Every operation first checks that the session it
    names is still the store's live instance: after detach, or once another session
    with the same id was created, it raises :class:`SessionNotLiveError`
    (``SESSION_NOT_LIVE``).
    """

    __slots__ = ("_entry", "_store", "id")

    def __init__(self, store: Store, entry: Entry) -> None:
        self._store = store
        self._entry = entry
        self.id = entry.session.id

    # -- liveness --------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._store._live_entry(self.id) is self._entry

    @property
    def announced(self) -> bool:
        return self._entry.announced

    def _ref(self) -> ActorRef[Any]:
        if not self.alive or self._entry.ref is None:
            raise SessionNotLiveError(f'session "{self.id}" is not live in this store', session_id=self.id)
        return self._entry.ref

    async def _call(self, message: Any) -> Any:
        ref = self._ref()
        try:
            return await ref.call(message)
        except ActorStoppedError:
            raise SessionNotLiveError(
                f'session "{self.id}" is not live in this store', session_id=self.id
            ) from None
        except ActorCrashedError as exc:
            raise SessionNotLiveError(
                f'session "{self.id}" crashed and is no longer live: {exc.__cause__!r}',
                session_id=self.id,
            ) from exc

    # -- immutable reads (no round trip) ----------------------------------------------

    @property
    def header(self) -> SessionHeader:
        return self._entry.session.header

    @property
    def events(self) -> EventLog:
        """The committed events, as an immutable snapshot (no actor round trip)."""
        return self._entry.session.events

    @property
    def seq(self) -> int:
        return self._entry.session.seq

    @property
    def first_live_seq(self) -> int:
        return self._entry.session.first_live_seq

    def request_header(self) -> FrozenDict | None:
        """The latest canonical ``request/header`` (no actor round trip)."""
        return self._entry.session.request_header()

    def last_turn(self) -> int:
        """The highest ``turn`` any ``turn/start`` carries (0 if none; no actor round trip)."""
        return self._entry.session.last_turn()

    def request_context(self) -> JsonValue:
        """The latest ``request/context`` data (no actor round trip)."""
        return self._entry.session.request_context()

    def surface(self) -> tuple[int, ...]:
        """The current surface nodes, detached."""
        return self._entry.session.surface_snapshot()

    # -- messages ------------------------------------------------------------------------

    async def append(
        self,
        type: str,
        data: object,
        *,
        surface_op: SurfaceOp | dict[str, Any] | None = None,
        source_event_seqs: Sequence[int] | None = None,
    ) -> Event:
        """Append one event through the session actor; returns the logged event.

        Cancellation: ``Cancelled`` means it was not applied (withdrawn before the
        actor took it); once taken, the call returns the logged event and the
        cancellation lands at the caller's next checkpoint. ``ReplyOverdueError``
        means the outcome is unknown (read :attr:`events` to know).
        """
        events = await self._call(Append((EventDraft(type, data, surface_op, source_event_seqs),)))
        return events[0]  # type: ignore[no-any-return]

    async def append_batch(self, drafts: Sequence[EventDraft]) -> tuple[Event, ...]:
        """Append a batch in one message: it lands whole or not at all.

        Same cancellation contract as :meth:`append`.
        """
        return await self._call(Append(tuple(drafts)))  # type: ignore[no-any-return]

    async def derive_messages(self) -> MessageList:
        """The model-visible messages (a read through the actor, ordered with writes).

        Cancellation: the actor kernel's contract (withdrawn before it is taken).
        """
        return await self._call(Derive())  # type: ignore[no-any-return]

    async def commit_replace(
        self,
        expected_surface: Sequence[int],
        type: str,
        data: object,
        *,
        surface_op: ReplaceOp,
        source_event_seqs: Sequence[int],
    ) -> Event:
        """Append a replace only if the surface still equals ``expected_surface``.

        Raises :class:`SurfaceChangedError` (``SURFACE_CHANGED``) otherwise. The check
        and the append are one message, hence atomic. Same cancellation contract as
        :meth:`append`.
        """
        draft = EventDraft(type, data, surface_op, source_event_seqs)
        return await self._call(CommitReplace(tuple(expected_surface), draft))  # type: ignore[no-any-return]

    async def barrier(self) -> None:
        """Return once every message sent to this session before the call is handled.

        Cancellation: only the wait is cancelled.
        """
        await self._call(Barrier())

    async def flush(self) -> bool:
        """``store.flush(self)``: a durability barrier through the flush listeners.

        Cancellation: see :meth:`Store.flush`.
        """
        return await self._store.flush(self)

    async def fork(self, boundary: int | None = None, child_id: str | None = None) -> SessionHandle:
        """``store.fork(self, boundary, child_id)``.

        Cancellation: see :meth:`Store.fork`.
        """
        return await self._store.fork(self, boundary, child_id)

    def __repr__(self) -> str:
        state = "live" if self.alive else "stale"
        return f"<SessionHandle {self.id!r} {state}>"
