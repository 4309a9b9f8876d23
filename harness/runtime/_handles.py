"""Handles: cheap references to live sessions, refused once their session is not live."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast, final

import trio

from actors import ActorCrashedError, ActorRef, ActorStoppedError, run_bounded
from harness.compaction import PruneResult, ToolResultPruneConfig
from harness.compaction._transaction import CompactionResult, Stability
from harness.errors import (
    EventError,
    FlushTimeoutError,
    ManualCompactionError,
    SessionNotLiveError,
)
from harness.runtime._compaction import CLOSE_GRACE, CompactionTicket, Summarizer, outcome
from harness.runtime._messages import (
    Append,
    Barrier,
    CommitReplace,
    CompactBegin,
    Derive,
    Measure,
    MeasureReply,
    Prune,
)
from harness.runtime._snapshot import SessionSnapshot, take_snapshot
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
    SurfaceNodes,
    SurfaceOp,
)
from harness.session._derive import DeriveCache
from harness.session._json import view
from harness.session._log import Log
from harness.session._planning import check_type, shown, storable_copy
from harness.session._request_header import canonical_header

if TYPE_CHECKING:
    from harness.runtime._ports import StorePort


class Entry:
    """The store's record of one live session (owned by the store actor).

    ``companions`` holds, per validator installed on the store, this session's
    validator and its state (see ``Store.install_validator``).
    """

    __slots__ = ("announced", "companions", "detached", "frozen", "handle", "ref", "session", "snapshot")

    def __init__(self, session: Session) -> None:
        self.session = session
        # The last snapshot read, reused while the log has not grown (see _snapshot.py).
        self.snapshot: SessionSnapshot | None = None
        # Once released (detached): the session's state at that moment (see freeze).
        self.frozen: Frozen | None = None
        self.ref: ActorRef[Any] | None = None
        self.announced = False
        self.detached = False
        self.handle: SessionHandle | None = None
        self.companions: dict[Any, Any] = {}

    def freeze(self) -> None:
        """Keep the session's current state for this entry's stale handles (idempotent).

        Called when the store lets go of the Session object (detached, drained): from
        then on it may be entered again (``store.adopt``), in this store or another, and
        its new incarnation's appends must not show through a handle of this one. O(1):
        the parts are immutable views; the messages are derived on first read.
        """
        if self.frozen is None:
            s = self.session
            self.frozen = Frozen(s.header, s.events, s.surface, s.generation, s.first_live_seq)


@final
class Frozen:
    """A released session's last state, as its stale handles answer it."""

    __slots__ = ("events", "first_live_seq", "generation", "header", "surface")

    def __init__(
        self, header: SessionHeader, events: EventLog, surface: SurfaceNodes, generation: int, first_live_seq: int
    ) -> None:
        self.header = header
        self.events = events
        self.surface = surface
        self.generation = generation
        self.first_live_seq = first_live_seq

    def snapshot(self, cached: SessionSnapshot | None) -> SessionSnapshot:
        """``cached`` when it is this state's (the last snapshot read before the
        release), else a new one, its messages derived afresh from this state alone."""
        events = self.events
        if cached is not None and cached.seq == len(events) and cached.generation == self.generation:
            return cached
        nodes = list(self.surface)
        messages = DeriveCache().derive(nodes, self.generation, cast(Log, events._items))
        return SessionSnapshot(
            session_id=self.header.id,
            header=self.header,
            events=events,
            surface=self.surface,
            generation=self.generation,
            messages=messages,
            first_live_seq=self.first_live_seq,
        )

    def last_of(self, type_: str) -> Event | None:
        seqs = self.events.seqs_of_type(type_)
        return self.events[seqs[-1]] if seqs else None

    def request_header(self) -> FrozenDict | None:
        event = self.last_of("request/header")
        if event is None:
            return None
        data = event.data
        return canonical_header(data.get("header") if type(data) is FrozenDict else None)

    def request_context(self) -> JsonValue:
        event = self.last_of("request/context")
        return None if event is None else event.data

    def last_turn(self) -> int:
        best = 0
        for seq in self.events.seqs_of_type("turn/start"):
            data = self.events[seq].data
            turn = data.get("turn") if type(data) is FrozenDict else None
            if type(turn) is int and turn > best:
                best = turn
        return best


@final
class SessionHandle:
    """A reference to one live session in one store.

    Cheap to copy and pass around. Every operation first checks that the session it
    names is still the store's live instance: after detach, or once another session
    with the same id was created, it raises :class:`SessionNotLiveError`
    (``SESSION_NOT_LIVE``).
    """

    __slots__ = ("_entry", "_store", "id")

    def __init__(self, store: StorePort[SessionHandle], entry: Entry) -> None:
        self._store = store
        self._entry = entry
        self.id = entry.session.id

    # -- liveness --------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether this handle names its store's live instance of the session."""
        return self._store._live_entry(self.id) is self._entry

    @property
    def announced(self) -> bool:
        """Whether ``session/created`` was emitted for this session."""
        return self._entry.announced

    @property
    def store(self) -> StorePort[SessionHandle]:
        """The store this handle belongs to."""
        return self._store

    def _ref(self) -> ActorRef[Any]:
        if not self.alive or self._entry.ref is None:
            raise SessionNotLiveError(f'session "{self.id}" is not live in this store', session_id=self.id)
        return self._entry.ref

    async def _call(self, message: Any) -> Any:
        ref = self._ref()
        try:
            return await ref.call(message)
        except (ActorStoppedError, ActorCrashedError) as exc:
            error = self._call_error(exc)
        raise error

    async def _call_durable(self, message: Append) -> tuple[Event, ...]:
        """``_call(message)`` then ``Store.flush``, as one operation (``durable=True``
        of :meth:`append` and :meth:`append_batch`).

        Cancellation: ``Cancelled`` means not applied (as ``_call``); once applied,
        the flush is not cancellable (its write is bounded by the writer's own
        limit), so the caller gets the events, or the flush's error, and a
        cancellation lands at its next checkpoint. One schedule point in the common
        case: the flush's wait for its write (an idle actor handles the append on this
        task, ``ActorRef.call_nowait``, with no checkpoint of its own)."""
        ref = self._ref()
        await trio.lowlevel.checkpoint_if_cancelled()  # cancelled already: nothing sent
        if not ref.idle and ref.alive:
            # The actor is busy: queued behind what was sent before (the call's own
            # checkpoint decides "applied or not"), then its flush, as the inline one's.
            # Decided here, not by call_nowait's WouldBlock: a pre-commit hook's own
            # WouldBlock (its veto) comes out of call_nowait too, and must not send the
            # append again; nor is this raised "during handling of" a WouldBlock.
            events = await self._call(message)
            await self._store._flush_applied(self)
            return events  # type: ignore[no-any-return]
        try:
            # Idle (handled now) or stopped/crashed (refused): no WouldBlock of its own.
            events = ref.call_nowait(message)
        except BaseException as exc:
            # Refused (or the actor crashed on it): still a schedule point, as
            # append's is either way; the error is raised outside this block.
            error = self._call_error(exc)
        else:
            await self._store._flush_applied(self)
            return events  # type: ignore[no-any-return]
        await trio.lowlevel.cancel_shielded_checkpoint()
        raise error

    def _call_error(self, exc: BaseException) -> BaseException:
        """What :meth:`_call` raises for ``exc`` raised by the actor call."""
        if isinstance(exc, ActorStoppedError):
            return SessionNotLiveError(f'session "{self.id}" is not live in this store', session_id=self.id)
        if isinstance(exc, ActorCrashedError):
            error = SessionNotLiveError(
                f'session "{self.id}" crashed and is no longer live: {exc.__cause__!r}',
                session_id=self.id,
            )
            error.__cause__ = exc
            return error
        return exc

    # -- immutable reads (no round trip) ----------------------------------------------
    #
    # Synchronous and never blocking: the session actor changes its Session only in
    # synchronous code, so a read here never sees half a mutation. They keep working on
    # a stale handle: the session as it was when it was detached (Entry.freeze), even
    # once the same Session object was entered again.

    def snapshot(self) -> SessionSnapshot:
        """The session's header, events, surface, generation and derived messages, read
        together (see :class:`~harness.runtime.SessionSnapshot`).

        No actor round trip and no checkpoint. The same object until the next commit;
        a held snapshot never changes. An append or replace whose call has returned is
        in every snapshot taken after the return.
        """
        entry = self._entry
        snap = entry.snapshot
        frozen = entry.frozen
        if frozen is not None:  # released: its own last state, never a later incarnation's
            snap = entry.snapshot = frozen.snapshot(snap)
            return snap
        # A replace is an append too: the log length alone says whether anything changed.
        if snap is None or snap.seq != entry.session.seq:
            snap = entry.snapshot = take_snapshot(entry.session)
        return snap

    @property
    def messages(self) -> MessageList:
        """The model-visible messages (``snapshot().messages``; no actor round trip)."""
        return self.snapshot().messages

    def events_until(self, end: int) -> EventLog:
        """The first ``end`` events, an O(1) immutable view (``snapshot().events_until``).

        Raises:
            SessionArgumentError: ``end`` is outside ``0 .. seq``.
        """
        return self.snapshot().events_until(end)

    @property
    def header(self) -> SessionHeader:
        """The session header (immutable; no actor round trip)."""
        return self._entry.session.header

    @property
    def events(self) -> EventLog:
        """The committed events, as an immutable snapshot (no actor round trip)."""
        frozen = self._entry.frozen
        return self._entry.session.events if frozen is None else frozen.events

    @property
    def seq(self) -> int:
        """The next seq, i.e. the log length (no actor round trip)."""
        frozen = self._entry.frozen
        return self._entry.session.seq if frozen is None else len(frozen.events)

    @property
    def first_live_seq(self) -> int:
        """How many events the live session was constructed with (its seed)."""
        frozen = self._entry.frozen
        return self._entry.session.first_live_seq if frozen is None else frozen.first_live_seq

    @property
    def generation(self) -> int:
        """The surface's replace generation: how many replaces have committed (no
        actor round trip)."""
        frozen = self._entry.frozen
        return self._entry.session.generation if frozen is None else frozen.generation

    def request_header(self) -> FrozenDict | None:
        """The latest canonical ``request/header`` (no actor round trip)."""
        frozen = self._entry.frozen
        return self._entry.session.request_header() if frozen is None else frozen.request_header()

    def last_turn(self) -> int:
        """The highest ``turn`` any ``turn/start`` carries (0 if none; no actor round trip)."""
        frozen = self._entry.frozen
        return self._entry.session.last_turn() if frozen is None else frozen.last_turn()

    def request_context(self) -> JsonValue:
        """The latest ``request/context`` data (no actor round trip)."""
        frozen = self._entry.frozen
        return self._entry.session.request_context() if frozen is None else frozen.request_context()

    def surface(self) -> SurfaceNodes:
        """The current surface nodes: ``session.surface``, an immutable O(1) view that
        is the same object until the surface changes and never changes under its
        holder (no actor round trip)."""
        frozen = self._entry.frozen
        return self._entry.session.surface if frozen is None else frozen.surface

    # -- messages ------------------------------------------------------------------------

    async def append(
        self,
        type: str,
        data: object,
        *,
        surface_op: SurfaceOp | dict[str, Any] | None = None,
        source_event_seqs: Sequence[int] | None = None,
        durable: bool = False,
    ) -> Event:
        """Append one event through the session actor; returns the logged event.

        ``durable=True``: return once the event is durable, as :meth:`flush` after the
        append would make it (through the store's flush listeners; with none, the
        append alone), in one call that yields once instead of twice. A flush failure
        (:class:`~harness.errors.FlushError`, :class:`~harness.errors.WriterWedgedError`)
        is raised with the event appended but not known to be durable, as a
        :meth:`flush` after it would raise.

        Cancellation: ``Cancelled`` means it was not applied (withdrawn before the
        actor took it); once taken, the call returns the logged event and the
        cancellation lands at the caller's next checkpoint. With ``durable=True`` that
        holds for the flush too: once the event is applied, its flush is not
        cancelled. Persistence's write is bounded by the writer's limit
        (``WRITE_WAIT_LIMIT``); a flush listener of your own runs shielded too, so one
        that never returns makes the call hang (bound it, e.g. ``trio.move_on_after``).
        ``ReplyOverdueError`` means the outcome is unknown (read :attr:`events` to
        know).
        """
        message = Append((EventDraft(type, data, surface_op, source_event_seqs),))
        events = await (self._call_durable(message) if durable else self._call(message))
        return events[0]

    def append_nowait(
        self,
        type: str,
        data: object,
        *,
        surface_op: SurfaceOp | dict[str, Any] | None = None,
        source_event_seqs: Sequence[int] | None = None,
    ) -> None:
        """Append one event without waiting for it (fire and forget; synchronous, no
        checkpoint): the append is queued to the session actor, behind every message
        already sent to it, and applied in that order.

        ``data`` is snapshotted now (later mutation of it never reaches the log);
        data that is not JSON, or nests deeper than an event can be stored, raises
        :class:`~harness.errors.NotJsonError` here. A refusal by the actor (a surface
        rule, a veto) cannot reach the caller: it is logged on ``actors`` (``cast …
        rejected``) and nothing is appended; read
        :attr:`events` (after :meth:`barrier`) to know what landed. Raises
        :class:`~harness.errors.SessionNotLiveError` on a stale handle and
        ``trio.WouldBlock`` when the actor's mailbox is full (nothing queued).
        """
        ref = self._ref()
        check_type(self.id, type)  # the planner's refusal, before the copy names the type
        # The planner's storable copy, not ``freeze``: the queued view is shared by the
        # planner without a depth walk, so its depth is checked here as an append's is
        # (the same refusals, the same messages).
        draft = EventDraft(type, view(storable_copy(self.id, type, data)), surface_op, source_event_seqs)
        try:
            ref.cast_nowait(Append((draft,)))
        except ActorStoppedError:
            raise SessionNotLiveError(f'session "{self.id}" is not live in this store', session_id=self.id) from None

    def current_session(self) -> Session:
        """The live :class:`~harness.session.Session`, for synchronous reads by the
        pure functions (``measure``, ``select_compactable_range``, the tool-pairing
        checks, ``derive_messages``) without an actor round trip.

        **Read only**: the session actor owns it; writing to it directly (``append``,
        ``commit``) bypasses the actor, its listeners and persistence — append
        through this handle instead. Reads are consistent: the actor changes the
        session only in synchronous code, so a synchronous read never sees half a
        mutation. Raises :class:`~harness.errors.SessionNotLiveError` once the
        session is not live (a stale handle's state is in :meth:`snapshot`).
        """
        self._ref()
        return self._entry.session

    async def append_batch(self, drafts: Sequence[EventDraft], *, durable: bool = False) -> tuple[Event, ...]:
        """Append a batch in one message: it lands whole or not at all.

        ``durable=True`` and the cancellation contract: as :meth:`append`'s.
        """
        batch = tuple(drafts)
        for d in batch:
            if type(d) is not EventDraft:
                # Refused here: the session actor reads a draft's fields, and anything
                # but a HarnessError there crashes it (the session stops being live).
                raise EventError(
                    f'session "{self.id}" batch item {shown(d)} is not an EventDraft', session_id=self.id
                )
        message = Append(batch)
        if durable:
            return await self._call_durable(message)
        return await self._call(message)  # type: ignore[no-any-return]

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

    async def compact_region(
        self,
        start: int,
        end: int,
        *,
        summarizer: Summarizer,
        manual: bool = False,
        stability: Stability | None = None,
        source_command_id: str | None = None,
        flush: bool = False,
        abort_check: Callable[[], bool] | None = None,
    ) -> CompactionResult:
        """Compact the surface span ``start..end`` (seqs, inclusive): one bracket owned
        by the session actor (compaction reference §1).

        The actor validates the range, checks the lock (``busy``: an unmatched
        ``compaction/start`` of this lifecycle) and the owner (an automatic run needs
        an open turn and is owned by it; a ``manual`` run needs none open), appends
        ``compaction/start``, and runs ``summarizer`` as its child task while it keeps
        serving appends and reads. It then checks stability (``whole-surface`` for
        automatic runs, ``selected-span`` for manual ones, unless given) and commits
        ``compaction/summary``, the checkpoint replace and ``compaction/end`` in one
        batch, or closes the bracket with an error end. ``flush`` (manual runs) makes
        the closed bracket durable before returning.

        Errors: automatic runs raise the raw error (a :class:`CompactionError` for a
        bad range, a ``SurfaceChangedError``, the summarizer's error, ...); manual runs
        raise a classified :class:`ManualCompactionError` (``busy``, ``changed``,
        ``summary``, ``commit``, ``persistence``); the lock check raises
        ``ManualCompactionError("busy")`` on every path.

        ``abort_check`` (manual runs) is asked once the summary is in, before the
        commit (§1.2 step 7.3): if it answers True the run is treated as cancelled and
        the bracket closes with an error end, the conversation unchanged (the manual
        compaction passes "the agent was cancelled", whose cancel reaches this call
        only at the caller's next checkpoint, after the actor may have committed).

        Cancellation: cancelled before the actor took the request, nothing happened.
        After, the summarizer is cancelled, the bracket is closed with an error end
        (the caller waits for that, shielded, bounded), and then ``Cancelled``
        propagates. If the session actor stops meanwhile, the bracket is closed by the
        actor and this raises ``SessionNotLiveError`` (classified ``commit`` when manual).
        """
        if stability is None:
            stability = "selected-span" if manual else "whole-surface"
        ticket: CompactionTicket = await self._call(
            CompactBegin(start, end, summarizer, manual, stability, source_command_id, abort_check)
        )
        try:
            await ticket.wait()
        except trio.Cancelled:
            ticket.cancel("caller cancelled")
            await run_bounded(ticket.wait, CLOSE_GRACE, shield=True)
            if flush and ticket.closed:
                # The reference throws the caller's reason only after close *and* flush.
                await self._flush_closed()
            raise
        flush_error = await self._flush_closed() if flush and ticket.closed else None
        # A cancellation that arrived during the (shielded) flush is delivered now:
        # the caller's own cancellation always wins, unwrapped (§1.2 step 10).
        await trio.lowlevel.checkpoint_if_cancelled()
        result = outcome(ticket, manual=manual, session_id=self.id)
        if flush_error is not None:
            raise ManualCompactionError.of(
                "persistence", "manual compaction durability checkpoint failed", cause=flush_error, session_id=self.id
            )
        return result

    async def _flush_closed(self) -> BaseException | None:
        """Flush a closed bracket, shielded (a cancellation must not cut the durability
        checkpoint short) and bounded by :data:`CLOSE_GRACE`; return what failed."""
        failure: BaseException | None = None

        async def flush() -> None:
            nonlocal failure
            try:
                await self.flush()
            except Exception as exc:  # any rejection is the `persistence` class (§5.4)
                failure = exc

        if not await run_bounded(flush, CLOSE_GRACE, shield=True):
            failure = FlushTimeoutError(
                f'session "{self.id}": the compaction flush did not finish within {CLOSE_GRACE:g} s',
                session_id=self.id,
            )
        return failure

    async def prune(self, config: ToolResultPruneConfig) -> PruneResult:
        """Phase one of compaction (reference §4) in the session actor: one priced
        ``compaction/prune`` + replacing ``tool/result`` batch per over-threshold tool
        result on the surface. No bracket and no lock check. A rejected pair raises;
        the pairs before it stay.

        Cancellation: the actor kernel's contract (withdrawn before it is taken, else
        every pair is written).
        """
        return await self._call(Prune(config))  # type: ignore[no-any-return]

    async def measure(self, retain_tokens: int | None = None) -> MeasureReply:
        """One atomic read for the compaction policies: ``measure`` of the session,
        the compaction lock state and, with ``retain_tokens``, the head-anchored
        selection (``None`` when nothing is compactable).

        Cancellation: the actor kernel's contract (a read; nothing to undo).
        """
        return await self._call(Measure(retain_tokens))  # type: ignore[no-any-return]

    async def barrier(self) -> None:
        """Return once every message sent to this session before the call is handled.

        Cancellation: only the wait is cancelled.
        """
        if self._ref().idle:
            # Nothing queued and the actor waits for work: everything sent before
            # the call is handled already; skip the round trip (one per durable
            # flush, issue 15), keep the checkpoint.
            await trio.lowlevel.checkpoint()
            return
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
