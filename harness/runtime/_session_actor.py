"""The session actor: the single writer of one live session's log."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from actors import Actor, ActorError, Rejected
from harness.compaction import measure, prune_session, select_compactable_range
from harness.compaction._transaction import (
    Transaction,
    begin,
    check_stable,
    commit_drafts,
    end_draft,
    lock_state,
    prepare,
    result_of,
)
from harness.errors import (
    HarnessError,
    InvalidBoundaryError,
    OpenTurnError,
    SessionNotLiveError,
    SummaryCancelledError,
    SurfaceChangedError,
)
from harness.runtime._compaction import CompactionTicket, Summarizer, run_summarizer
from harness.runtime._listeners import Listeners
from harness.runtime._messages import (
    Append,
    Barrier,
    CommitReplace,
    CompactBegin,
    CompactFinish,
    Derive,
    ForkPrefix,
    Measure,
    MeasureReply,
    Prune,
)
from harness.session import Event, Session
from harness.session._append_types import NO_TYPE, data_read_by_all
from harness.session._commit import commit_single, plan_single
from harness.session._events import SAFE_INT_MAX
from harness.session._json import ABSENT, js_string, shown_safe_int
from harness.session._session import _NO_TURN

if TYPE_CHECKING:
    from harness.runtime._handles import SessionHandle


class SessionActor(Actor[Any]):
    """Owns one :class:`Session`; every mutation is a message handled in order.

    A check and the append it guards run in one message, so they are atomic without
    locks. Rejected requests (:class:`HarnessError`) are replies; anything else is a
    bug and crashes the actor.

    The synchronous messages of the hot path (appends, the checked replace, the
    reads) are inline (decision 0013): called while the actor is idle, they run on the
    caller's task, and so do the pre-commit hooks and event listeners of such an
    append.
    """

    rejections = (HarnessError,)
    mailbox_size = 256
    inline_messages = frozenset({Append, CommitReplace, Derive, Measure})

    def __init__(self, session: Session, listeners: Listeners, handle: SessionHandle) -> None:
        self.session = session
        self.listeners = listeners
        self.session_handle = handle
        self.name = f"session:{session.id}"
        # Open compaction brackets: compaction id -> (transaction, ticket).
        self._compactions: dict[str, tuple[Transaction, CompactionTicket]] = {}

    def handle_inline(self, message: Any) -> Any:
        """Append, CommitReplace, Derive, Measure: synchronous, on whichever task runs
        them (the actor's, or an idle actor's caller's)."""
        if type(message) is Append:
            return self._append(message.drafts)
        if type(message) is CommitReplace:
            current = self.session.surface_snapshot()
            if current != message.expected:
                raise SurfaceChangedError(
                    f'session "{self.session.id}" surface changed since the replace was planned',
                    session_id=self.session.id,
                )
            return self._append((message.draft,))[0]
        if type(message) is Derive:
            return self.session.derive_messages()
        if type(message) is Measure:
            measurement = measure(self.session)
            selection = (
                None
                if message.retain_tokens is None
                else select_compactable_range(self.session, measurement, message.retain_tokens)
            )
            return MeasureReply(measurement, lock_state(self.session), selection)
        raise TypeError(f"session actor got an unknown inline message {message!r}")

    async def handle(self, message: Any) -> Any:
        if type(message) is ForkPrefix:
            return self._fork(message)
        if type(message) is Barrier:
            return None
        if type(message) is Prune:
            return prune_session(self.session, message.config, append=self._append)
        if type(message) is CompactBegin:
            return self._compact_begin(message)
        if type(message) is CompactFinish:
            self._compact_finish(message)
            return None
        raise TypeError(f"session actor got an unknown message {message!r}")

    async def on_stop(self) -> None:
        """The actor stops (detach): its summarizer children are already cancelled;
        close every bracket they left open with an error end, so no live lock outlives
        the session (the writer still records it: ``disposed`` comes after)."""
        for txn, ticket in list(self._compactions.values()):
            self._close(txn, ticket, SessionNotLiveError(
                f'session "{self.session.id}" stopped during compaction {txn.compaction_id}',
                session_id=self.session.id,
            ), "summary")

    def on_exit(self) -> None:
        """However the actor ended (a crash, a cancelled runtime), no caller is left
        waiting on a compaction: an open one fails (its bracket stays open in the log,
        like after a crash, and becomes stale on the next load)."""
        for txn, ticket in self._compactions.values():
            ticket.resolve(
                None,
                SessionNotLiveError(
                    f'session "{self.session.id}" ended during compaction {txn.compaction_id}',
                    session_id=self.session.id,
                ),
                "commit",
                closed=False,
            )
        self._compactions.clear()

    # -- compaction (reference §1: the actor owns the transaction) ----------------------

    def _compact_begin(self, message: CompactBegin) -> CompactionTicket:
        txn, start = begin(
            self.session,
            message.start,
            message.end,
            manual=message.manual,
            stability=message.stability,  # type: ignore[arg-type]
            source_command_id=message.source_command_id,
        )
        txn.start_seq = self._append((start,))[0].seq
        ticket = CompactionTicket(txn.compaction_id)
        ticket.abort_check = message.abort_check if message.manual else None
        self._compactions[txn.compaction_id] = (txn, ticket)
        try:
            prepare(self.session, txn)
        except HarnessError as exc:
            self._close(txn, ticket, exc, "summary")
            return ticket
        self.start_child(self._summarize, txn, ticket, message.summarizer, name=f"compaction {txn.compaction_id}")
        return ticket

    async def _summarize(self, txn: Transaction, ticket: CompactionTicket, summarizer: Summarizer) -> None:
        output, framed, failure = await run_summarizer(txn, ticket, summarizer)
        assert self.ref is not None
        with contextlib.suppress(ActorError):  # the actor is stopping: on_stop closes it
            await self.ref.call(CompactFinish(txn.compaction_id, output, framed, failure))

    def _compact_finish(self, message: CompactFinish) -> None:
        entry = self._compactions.get(message.compaction_id)
        if entry is None:
            return  # already closed
        txn, ticket = entry
        failure = message.failure
        if ticket.cancel_reason is None and ticket.abort_check is not None and ticket.abort_check():
            ticket.cancel_reason = "cancelled before the commit"
        if failure is None and txn.turn is None and ticket.cancel_reason is not None:
            # §1.2 step 7.3: a manual run (standalone, owner null) re-checks its
            # cancellation after the summary, so a cancelled /compact never rewrites
            # the conversation.
            failure = SummaryCancelledError(
                f"compaction {txn.compaction_id} cancelled: {ticket.cancel_reason}", session_id=self.session.id
            )
        if failure is None:
            try:
                check_stable(self.session, txn)
            except HarnessError as exc:
                failure = exc
        if failure is not None:
            self._close(txn, ticket, failure, "summary")
            return
        try:
            events = self._append(tuple(commit_drafts(self.session, txn, message.output, message.framed)))
        except (HarnessError, Rejected) as exc:
            self._close(txn, ticket, exc.error if isinstance(exc, Rejected) else exc, "commit")
            return
        del self._compactions[txn.compaction_id]
        ticket.resolve(result_of(txn, events, message.output), None, "commit", closed=True)

    def _close(self, txn: Transaction, ticket: CompactionTicket, failure: BaseException, stage: str) -> None:
        """One attempt at the error end (§1.2 step 8); a failing end is a ``commit``
        failure and leaves the start as a live lock for this lifecycle (§1.3)."""
        self._compactions.pop(txn.compaction_id, None)
        try:
            self._append((end_draft(txn, failure),))
        except (HarnessError, Rejected) as exc:
            close_error = exc.error if isinstance(exc, Rejected) else exc
            close_error.__cause__ = failure
            ticket.resolve(None, close_error, "commit", closed=False)
            return
        ticket.resolve(None, failure, stage, closed=True)

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
        session = self.session
        hooks = self.listeners.pre_commit
        # The store's installed validators read the data of the planned events of
        # the types they name: the planner keeps those trees rather than JSON to decode
        # at once (decision 0023).
        companions = self.session_handle._entry.companions
        if not companions:
            session._hooked = NO_TYPE
        elif len(companions) == 1:
            session._hooked = next(iter(companions.values())).reads
        else:
            session._hooked = data_read_by_all(c.reads for c in companions.values())
        single = None
        if len(drafts) == 1 and drafts[0].ignorable is False:
            # One draft: the core's single append (what ``Session.append`` runs)
            # planned, vetoed and committed, without the batch's plan object (W1-actor,
            # W9, W17). Same checks, same errors, same event.
            d = drafts[0]
            single = plan_single(session, d.type, d.data, d.surface_op, d.source_event_seqs)
            events: tuple[Event, ...] = (single[0],)
        else:
            plan = session.plan(drafts)
            events = plan.events
        if hooks:  # (no copy of an empty list on every append)
            for hook in list(hooks):
                try:
                    hook(self.session_handle, events)
                except Exception as exc:
                    # A veto is an answer (nothing is committed), not a session-actor bug.
                    raise Rejected(exc) from None
        if single is not None:
            commit_single(session, single)
        else:
            events = session.commit(plan)
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
            f'fork boundary for session "{sid}" must be a non-negative safe integer, '
            f"got {shown_safe_int(boundary)}",
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
    turn = session.open_turn_at(boundary, ABSENT)
    if turn is not _NO_TURN:
        # The reference interpolates ``data.turn`` as is: ``undefined`` when absent.
        raise OpenTurnError(
            f'fork boundary {boundary} in session "{sid}" ends inside open turn {js_string(turn)}',
            session_id=sid,
        )
    return boundary
