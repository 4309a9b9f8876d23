"""The Session: log + surface + derive cache, constructed in snapshot or restore mode.

A Session is plain synchronous Python with a single owner (in the runtime, its
session actor). Every mutation is plan-then-commit: :meth:`Session.plan` validates
a whole batch against a tentative state without touching the session, and
:meth:`Session.commit` applies a plan atomically. A rejected batch changes nothing:
not the log, not the surface, not the generation, not the validator state.

This module is the class and its reading API; the jobs behind it each have a module
(issue 27): the fields (``_state``), planning (``_planning``), committing
(``_commit``), seeding and restoring (``_seeding``) and forking (``_fork``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from harness.errors import SessionError
from harness.session._append_types import (
    AppendValidator,
    Clock,
    EventDraft,
    check_all,
    data_read_by,
    wall_clock_ms,
)
from harness.session._commit import append_one, commit
from harness.session._derive import EventLog, MessageList
from harness.session._events import Event, SurfaceOp
from harness.session._fork import fork_into
from harness.session._gc import gc_paused
from harness.session._header import (
    SessionHeader,
    check_session_id,
    snapshot_header,
    validate_header_record,
)
from harness.session._json import FrozenDict, JsonValue, RawJson, view
from harness.session._planning import AppendPlan, plan_batch
from harness.session._request_header import canonical_header
from harness.session._seeding import (
    begin_seed,
    decode_records,
    finish_construction,
    restore_items,
    restore_records,
    restored_header,
    seed_items,
)
from harness.session._state import NO_TURN, PRIVATE, SessionState
from harness.session._surface import SurfaceNodes

_NO_TURN: Final[Any] = NO_TURN
"""Returned by :meth:`Session.open_turn_at` when no turn is open (kept here too: the
runtime, persistence and compaction import it from this module)."""


class Session(SessionState):
    """One agent session: its immutable event log, its surface and derived messages.

    Build one with :meth:`create` (snapshot mode: borrowed input is validated and
    copied) or :meth:`restore` (restore mode: freshly decoded records are adopted
    without a copy). Not thread-safe and not async: one owner drives it.
    """

    __slots__ = ()

    # -- construction ---------------------------------------------------------------

    @classmethod
    def create(
        cls,
        session_id: str,
        seed: Sequence[Event | dict[str, Any]] | None = None,
        header: SessionHeader | dict[str, Any] | None = None,
        *,
        clock: Clock = wall_clock_ms,
        validator: AppendValidator | None = None,
    ) -> Session:
        """Snapshot mode. Seed records are validated and copied; the data of seed
        :class:`Event` objects is shared, not copied (it is immutable).

        Without a ``header`` one is synthesised as ``{version: 0, id, createdAt: now}``.
        A supplied seed (even ``[]``) gets a ``session/end-seed`` appended unless it
        already ends with one.

        A new id passes :func:`~harness.session.check_session_id` (restore does not:
        an id stored by an older build still reads).
        """
        self = cls._blank(check_session_id(session_id), clock, validator)
        if seed:
            begin_seed(
                self,
                (
                    it.type if isinstance(it, Event) else it.get("type") if isinstance(it, Mapping) else None
                    for it in seed
                ),
            )
        with gc_paused(promote=seed is not None):  # seed copies are long-lived (decision 0003)
            if seed:
                seed_items(self, session_id, seed)
            # The reference's order: the seed first, then the header (snapshot mode).
            if header is None:
                self._header = SessionHeader(id=session_id, created_at=clock())
            else:
                self._header = snapshot_header(header, session_id)
            finish_construction(self, seed is not None)
        return self

    @classmethod
    def restore(
        cls,
        session_id: str,
        records: list[dict[str, Any]],
        header: dict[str, Any] | SessionHeader,
        *,
        clock: Clock = wall_clock_ms,
        validator: AppendValidator | None = None,
    ) -> Session:
        """Restore mode: take ownership of freshly decoded records and adopt them.

        Ownership transfers to the session: the caller must not keep or mutate the
        records. They are validated (header, envelope, message shape, contiguity,
        surface rules) but not JSON-walked or copied. ``session/end-seed`` is appended
        unless the log already ends with one. The collector is paused meanwhile, and a
        large restored log is moved straight to its oldest generation
        (:func:`~harness.session.promote_young`, decision 0003).
        """
        self = cls._blank(session_id, clock, validator)
        self._header = restored_header(header, session_id)
        with gc_paused(promote=True):
            restore_records(self, records)
            finish_construction(self, True)
        return self

    @classmethod
    def restore_lines(
        cls,
        session_id: str,
        lines: Iterable[bytes | str],
        header: dict[str, Any] | SessionHeader,
        *,
        clock: Clock = wall_clock_ms,
        validator: AppendValidator | None = None,
    ) -> Session:
        """Restore mode over JSON event lines: each is decoded, checked and adopted.

        Compact (decision 0010): an event of the common shapes keeps its ``bytes``
        line instead of the decoded tree, which is dropped at once; its data is decoded
        again when it is read (``Session.events``, derive, compaction). A restored
        session then holds about its file's size instead of ~3x, and decoding one line
        at a time reuses the same memory instead of building every tree first. Lines
        given as ``str``, and every line when a ``validator`` replays the seed, are
        adopted as trees. The collector is paused throughout.
        """
        self = cls._blank(session_id, clock, validator)
        self._header = restored_header(header, session_id)
        with gc_paused(promote=True):
            if validator is not None:
                restore_records(self, decode_records(lines))
            else:
                restore_items(self, lines if isinstance(lines, Sequence) else list(lines), True, None)
            finish_construction(self, True)
        return self

    @classmethod
    def restore_stored_lines(
        cls,
        session_id: str,
        lines: Sequence[bytes],
        header: dict[str, Any],
        types: frozenset[str],
        *,
        clock: Clock = wall_clock_ms,
    ) -> Session | None:
        """:meth:`restore_lines` for a persistence reader's fast path: ``None`` as soon
        as a line is not one plain stored event (not a JSON object, a ``seq`` other
        than its index, a ``type`` outside ``types``), so that the reader applies its
        exact rules (torn lines, chunk rows, unknown types) to the whole log instead.
        ``types`` must include the three message types. ``None`` also when the lines
        end inside an open turn: the reader's crash repair closes it first. Other
        validation failures raise as :meth:`restore` does."""
        self = cls._blank(session_id, clock, None)
        self._header = validate_header_record(header, session_id)
        with gc_paused(promote=True):
            if not restore_items(self, lines, True, types):
                return None
            marks = self._turn_marks
            if marks and self._events.type_at(marks[-1]) == "turn/start":
                return None
            finish_construction(self, True)
        return self

    @classmethod
    def fork_of(
        cls,
        parent: Session,
        boundary: int,
        session_id: str,
        header: dict[str, Any] | SessionHeader,
        *,
        clock: Clock = wall_clock_ms,
        validator: AppendValidator | None = None,
    ) -> Session:
        """A child seeded with ``parent``'s events ``0..boundary`` (shared, not copied).

        A prefix of a valid log is valid, so nothing is re-validated: the child shares
        the parent's columns up to the boundary (O(1), or a copy of the parent's live
        part when the parent is itself a fork), and takes the surface state at the
        boundary (a copy of the parent's when the boundary is its last seq, else a
        fold of the prefix's ops). Fork's own checks (boundary, open turn) belong to
        the caller. A ``validator`` is replayed over the prefix.
        """
        if not 0 <= boundary < parent.seq:
            raise SessionError(f"fork boundary {boundary} is outside session {parent.id!r}")
        self = cls._blank(check_session_id(session_id), clock, validator)
        self._header = snapshot_header(header, session_id)
        fork_into(self, parent, boundary)
        finish_construction(self, True)
        return self

    @classmethod
    def _blank(cls, session_id: str, clock: Clock, validator: AppendValidator | None) -> Session:
        if type(session_id) is not str or not session_id:
            raise SessionError(f"session id must be a non-empty string, got {session_id!r}")
        self = cls(_token=PRIVATE)
        self._sid = session_id
        self._clock = clock
        self._validator = validator
        self._reads = data_read_by(validator)
        self._vstate = validator.initial() if validator is not None else None
        return self

    # -- reading ----------------------------------------------------------------------

    @property
    def header(self) -> SessionHeader:
        return self._header

    @property
    def seq(self) -> int:
        """The next seq (the log length)."""
        return len(self._events)

    @property
    def first_live_seq(self) -> int:
        """How many events the session was constructed with (its seed length)."""
        return self._first_live_seq

    @property
    def events(self) -> EventLog:
        """An immutable snapshot of the log, O(1); it never grows. The same object on
        every read until the next append (reference §1.3)."""
        v = self._events_view
        n = len(self._events)
        if v is None or len(v) != n:
            v = self._events_view = EventLog(self._events, n)
        return v

    def event(self, seq: int) -> Event:
        return self._events[seq]

    def type_at(self, seq: int) -> str:
        """The type of event ``seq``, without building the event. O(1)."""
        return self._events.type_at(seq)

    def raw_data_at(self, seq: int) -> RawJson:
        """The stored data tree of event ``seq``, without building the event or a
        frozen view: for hot readers inside the package. Read it; never mutate it."""
        return self._events.data_at(seq)

    @property
    def surface(self) -> SurfaceNodes:
        """The surface nodes as an immutable O(1) view (see ``.generation``): the same
        object on every read until the surface changes, and a held view never changes
        (neither an append nor a replace reaches it)."""
        return self._surface.view()

    @property
    def generation(self) -> int:
        """The count of committed replaces."""
        return self._surface.generation

    def surface_snapshot(self) -> tuple[int, ...]:
        """The current surface nodes, detached (O(n))."""
        return tuple(self._surface.nodes)

    def derive_message(self, seq: int) -> FrozenDict | None:
        """The model-visible message event ``seq`` derives to (``None`` for a log-only
        event or an empty assistant message), memoised with :meth:`derive_messages`."""
        if not 0 <= seq < len(self._events):
            raise IndexError(f"session {self.id!r} has no event {seq}")
        return self._derive.project(seq, self._events)

    def derive_messages(self) -> MessageList:
        """The model-visible messages: an immutable sequence, O(1) plus new nodes."""
        return self._derive.derive(self._surface.nodes, self._surface.generation, self._events)

    def request_header(self) -> FrozenDict | None:
        """The latest ``request/header`` snapshot, canonicalised (or ``None``)."""
        if self._last_header < 0:
            return None
        data = self._events[self._last_header].data
        return canonical_header(data.get("header") if type(data) is FrozenDict else None)

    def request_context(self) -> JsonValue:
        """The latest ``request/context`` data (or ``None``)."""
        if self._last_context < 0:
            return None
        return self._events[self._last_context].data

    def compaction_marks(self) -> tuple[int, int]:
        """``(last_bracket, last_end_seed)``: the seq of the latest ``compaction/start``
        or ``compaction/end`` and of the newest ``session/end-seed`` (-1: none). O(1)."""
        return self._last_bracket, self._last_end_seed

    def last_turn(self) -> int:
        """The highest integer ``turn`` of any ``turn/start`` (0 if none). O(turns)."""
        best = 0
        for seq in self._turn_marks:
            if self._events.type_at(seq) == "turn/start":
                turn = self._turn_of(seq)
                if type(turn) is int and turn > best:
                    best = turn
        return best

    def _turn_of(self, seq: int, absent: Any = None) -> Any:
        """The frozen ``turn`` value in the data of event ``seq`` (``absent`` if none)."""
        data = self._events.data_at(seq)
        return view(data.get("turn", absent)) if type(data) is dict else absent

    def open_turn_at(self, seq: int, absent: Any = None) -> Any:
        """If the last ``turn/start``/``turn/end`` at or before ``seq`` is a
        ``turn/start``, its ``turn`` value (``absent`` when its data has none); else
        ``_NO_TURN``. O(log n)."""
        marks = self._turn_marks
        k = bisect.bisect_right(marks, seq) - 1
        if k < 0:
            return NO_TURN
        mark = marks[k]
        if self._events.type_at(mark) != "turn/start":
            return NO_TURN
        return self._turn_of(mark, absent)

    def replay(self, validator: AppendValidator) -> Any:
        """The state ``validator`` reaches over the whole log, as if it had checked every
        event since construction (its ``begin_seed`` sees the seed's types); raises its
        veto. Reads only: the session is not changed. O(n).

        The store uses it to put a validator on a live session (``Store.install_validator``).
        """
        state = validator.initial()
        hook = getattr(validator, "begin_seed", None)
        if hook is not None:
            type_at = self._events.type_at
            state = hook(state, (type_at(i) for i in range(self._first_live_seq)))
        return check_all(validator, state, self._events)

    # -- appending --------------------------------------------------------------------

    def append(
        self,
        type: str,
        data: object,
        *,
        surface_op: SurfaceOp | dict[str, Any] | None = None,
        source_event_seqs: Sequence[int] | None = None,
    ) -> Event:
        """Validate, copy and append one event; return the logged (frozen) event."""
        return append_one(self, type, data, surface_op, source_event_seqs)

    def append_batch(self, drafts: Sequence[EventDraft]) -> tuple[Event, ...]:
        """Append a batch: it lands whole, or raises and changes nothing."""
        return commit(self, plan_batch(self, drafts, None))

    def plan(self, drafts: Sequence[EventDraft], *, time_ms: int | None = None) -> AppendPlan:
        """Validate a batch against the current state without changing anything.

        Raises the first rule a draft breaks. The plan can be committed only while
        the session has not changed since (see :meth:`commit`).
        """
        return plan_batch(self, drafts, time_ms)

    def commit(self, plan: AppendPlan) -> tuple[Event, ...]:
        """Apply a plan made by :meth:`plan` on this session's current state.

        Raises :class:`SessionError` (nothing changes) if the plan belongs to another
        session or the log changed after it was planned.
        """
        return commit(self, plan)

    def __repr__(self) -> str:
        return f"<Session {self.id!r} seq={self.seq} surface={len(self._surface.nodes)}>"
