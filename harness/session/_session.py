"""The Session: log + surface + derive cache, constructed in snapshot or restore mode.

A Session is plain synchronous Python with a single owner (in the runtime, its
session actor). Every mutation is plan-then-commit: :meth:`Session.plan` validates
a whole batch against a tentative state without touching the session, and
:meth:`Session.commit` applies a plan atomically. A rejected batch changes nothing:
not the log, not the surface, not the generation, not the validator state.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

import attrs
import orjson

from harness.errors import EventError, NotJsonError, SessionError, SurfaceError
from harness.session._derive import DeriveCache, EventLog, MessageList
from harness.session._events import (
    APPEND,
    ASSISTANT_MESSAGE,
    END_SEED,
    SAFE_INT_MAX,
    SURFACE_TYPES,
    USER_MESSAGE,
    Event,
    ReplaceOp,
    SurfaceOp,
    valid_envelope,
)
from harness.session._gc import gc_paused
from harness.session._header import (
    SessionHeader,
    check_session_id,
    snapshot_header,
    validate_header_record,
)
from harness.session._json import (
    MAX_STORABLE_DEPTH,
    FrozenDict,
    JsonValue,
    RawJson,
    SnapshotRefused,
    snapshot_storable_fast,
    try_snapshot_raw,
    try_snapshot_storable,
    view,
)
from harness.session._log import APPEND_OP, INTERNED, NO_OP, Log
from harness.session._request_header import canonical_header
from harness.session._shape import MESSAGE_TYPES, check_message_shape, check_request_header
from harness.session._surface import (
    _MISSING,
    SurfaceNodes,
    SurfacePlan,
    SurfaceState,
    plan_surface,
    raw_surface_metadata,
)

Clock = Callable[[], int]
"""Returns wall-clock time in integer milliseconds."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def decode_records(lines: Iterable[bytes | str]) -> list[Any]:
    """Decode JSON lines with orjson, the collector paused (see :func:`gc_paused`).

    The result is freshly owned by the caller: pass it to :meth:`Session.restore`.
    """
    loads = orjson.loads
    with gc_paused():
        return [loads(line) for line in lines]


@attrs.frozen(slots=True)
class EventDraft:
    """An event to append: the session assigns ``seq`` and ``time``.

    ``surface_op`` is ``"append"``, a :class:`ReplaceOp`, a raw
    ``{"op": "replace", "start", "end"}`` dict, or ``None`` (absent).
    ``ignorable=True`` logs the envelope's ``ignorable: true``: a reader that does not
    know the type skips the event instead of refusing the log (how an extension, e.g.
    :mod:`harness.bridge`'s SDK items, stores a type of its own).
    """

    type: str
    data: object
    surface_op: object = None
    source_event_seqs: object = None
    ignorable: bool = False


class AppendValidator(Protocol):
    """A pre-commit veto over appended events (e.g. the relational invariants, §11).

    ``check`` is pure: it returns the validator's next state and raises
    :class:`~harness.errors.SessionError` to veto. The session threads the state
    through a batch and keeps it only if the whole batch commits.

    Optional: ``begin_seed(state, types) -> state``, called before a seed replay
    with the seed's event types in seq order (a seeded session always ends with a
    ``session/end-seed``).
    """

    def initial(self) -> Any: ...

    def check(self, state: Any, event: Event) -> Any: ...


@attrs.frozen(slots=True, eq=False)
class AppendPlan:
    """A validated batch, ready to commit. Valid only against the state it was planned on."""

    session: Session
    base_seq: int
    events: tuple[Event, ...]
    plans: tuple[SurfacePlan, ...]
    surface: SurfaceState | None
    validator_state: Any


_LEGACY_DELTA: Final = "request/header-delta"
def _message_ok(t: str, data: dict[str, Any]) -> bool:
    """Allocation-free yes for a well-formed message (False: let the slow path decide).

    A non-empty ``str`` is truthy, so ``type(x) is str and x`` checks both at once.
    """
    m: Any
    if t == USER_MESSAGE:
        m = data
        role = "user"
    else:
        m = data.get("message")
        if type(m) is not dict:
            return False
        role = "assistant" if t == ASSISTANT_MESSAGE else "user"
    src = m.get("source")
    mid = m.get("id")
    if m.get("role") != role or type(mid) is not str or not mid or type(src) is not dict or type(m.get("content")) is not list:
        return False
    kind = src.get("kind")
    if type(kind) is not str or not kind:
        return False
    if t == ASSISTANT_MESSAGE:
        provider, model = src.get("provider"), src.get("model")
        return kind == "model" and type(provider) is str and bool(provider) and type(model) is str and bool(model)
    # tool/result is rare on this path: the full check handles it.
    return t == USER_MESSAGE


def _label(type_: str) -> str:
    return f'session event "{type_}"'


def _is_fallback_header(type_: str, data: RawJson) -> bool:
    return type_ == "request/header" and type(data) is dict and data.get("reason") == "fallback"


class Session:
    """One agent session: its immutable event log, its surface and derived messages.

    Build one with :meth:`create` (snapshot mode: borrowed input is validated and
    copied) or :meth:`restore` (restore mode: freshly decoded records are adopted
    without a copy). Not thread-safe and not async: one owner drives it.
    """

    __slots__ = (
        # Layers above (compaction's meter and pairing caches) key per-session state
        # by a weak reference, so it dies with the session.
        "__weakref__",
        "_clock",
        "_derive",
        "_events",
        "_events_view",
        "_first_live_seq",
        "_header",
        "_last_bracket",
        "_last_context",
        "_last_end_seed",
        "_last_header",
        "_sid",
        "_surface",
        "_turn_marks",
        "_validator",
        "_vstate",
    )

    def __init__(self, *, _token: object = None) -> None:
        if _token is not _PRIVATE:
            raise TypeError("use Session.create() or Session.restore()")
        self._events = Log()
        self._events_view: EventLog | None = None
        self._surface = SurfaceState()
        self._derive = DeriveCache()
        self._first_live_seq = 0
        self._clock: Clock = wall_clock_ms
        self._validator: AppendValidator | None = None
        self._vstate: Any = None
        self._last_header = -1
        self._last_context = -1
        self._turn_marks: list[int] = []  # seqs of turn/start and turn/end, ascending
        # Seq of the latest compaction/start or compaction/end, and of the newest
        # session/end-seed (-1: none): the compaction lock is O(1) to check.
        self._last_bracket = -1
        self._last_end_seed = -1
        self._sid = ""
        self._header: SessionHeader

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
            self._begin_seed(
                it.type if isinstance(it, Event) else it.get("type") if isinstance(it, Mapping) else None
                for it in seed
            )
        with gc_paused(promote=seed is not None):  # seed copies are long-lived (decision 0003)
            for i, item in enumerate(seed or ()):
                if isinstance(item, Event):
                    self._seed_one(i, item.type, item._data, item, None)
                    continue
                # The record wraps its data one level deeper: the append rule (data at
                # most MAX_STORABLE_DEPTH deep) is MAX_STORABLE_DEPTH + 1 for a record.
                why, rec = try_snapshot_storable(item, MAX_STORABLE_DEPTH + 1)
                if why == "too deep":
                    # Refused here: accepted, it would fail every write-behind flush.
                    raise NotJsonError(
                        f"seed event at index {i} carries data nested more than {MAX_STORABLE_DEPTH} "
                        "levels deep, which cannot be stored",
                        session_id=session_id,
                    )
                if why is not None:
                    raise EventError(
                        f"seed event at index {i} is not losslessly JSON-serializable",
                        session_id=session_id,
                    )
                self._seed_record(i, rec)
            # The reference's order: the seed first, then the header (snapshot mode).
            if header is None:
                self._header = SessionHeader(id=session_id, created_at=clock())
            else:
                self._header = snapshot_header(header, session_id)
            self._finish_construction(seed is not None)
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
        self._header = _restored_header(header, session_id)
        with gc_paused(promote=True):
            self._restore_records(records)
            self._finish_construction(True)
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
        self._header = _restored_header(header, session_id)
        with gc_paused(promote=True):
            if validator is not None:
                self._restore_records(decode_records(lines))
            else:
                self._restore_items(lines if isinstance(lines, Sequence) else list(lines), True, None)
            self._finish_construction(True)
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
            if not self._restore_items(lines, True, types):
                return None
            marks = self._turn_marks
            if marks and self._events.type_at(marks[-1]) == "turn/start":
                return None
            self._finish_construction(True)
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
        self._events = parent._events.prefix(boundary + 1)
        if boundary == parent.seq - 1:
            self._surface = parent._surface.clone()
        else:
            self._surface = _fold_trusted(self._events)
        self._turn_marks = parent._turn_marks[: bisect.bisect_right(parent._turn_marks, boundary)]
        self._last_header = _last_index(self._events, "request/header", parent._last_header)
        self._last_context = _last_index(self._events, "request/context", parent._last_context)
        self._last_bracket = _last_index(self._events, _BRACKET, parent._last_bracket)
        self._last_end_seed = _last_index(self._events, END_SEED, parent._last_end_seed)
        if validator is not None:
            self._begin_seed(self._events.type_at(i) for i in range(len(self._events)))
            state = self._vstate
            for ev in self._events:
                state = validator.check(state, ev)
            self._vstate = state
        self._finish_construction(True)
        return self

    @classmethod
    def _blank(cls, session_id: str, clock: Clock, validator: AppendValidator | None) -> Session:
        if type(session_id) is not str or not session_id:
            raise SessionError(f"session id must be a non-empty string, got {session_id!r}")
        self = cls(_token=_PRIVATE)
        self._sid = session_id
        self._clock = clock
        self._validator = validator
        self._vstate = validator.initial() if validator is not None else None
        return self

    def _begin_seed(self, types: Iterable[object]) -> None:
        """Before a seed replay: show a validator that defines ``begin_seed`` the
        seed's event types in seq order (the compaction invariants look ahead to the
        end-seed that proves an orphan bracket stale, compaction reference §1.4)."""
        hook = getattr(self._validator, "begin_seed", None)
        if hook is not None:
            self._vstate = hook(self._vstate, types)

    def _restore_records(self, records: list[dict[str, Any]]) -> None:
        if self._validator is not None:
            self._begin_seed(rec.get("type") if type(rec) is dict else None for rec in records)
            for i, rec in enumerate(records):
                self._seed_record(i, rec)
            return
        self._restore_items(records, False, None)

    def _restore_items(self, items: Sequence[Any], encoded: bool, types: frozenset[str] | None) -> bool:
        # The hot loop of W4 and W7. Records of the common shapes (log-only events
        # without metadata, plain surface appends of well-formed messages) are checked
        # and adopted straight into the log's columns (no Event objects, decision
        # 0006); anything else, valid or not, takes the general path, which also
        # produces the exact error. Exact key sets are checked by length: the four
        # required keys are read, so 4 keys (or 5 with surfaceOp) means no others.
        # ``encoded``: items are JSON lines, decoded here one at a time; a bytes line
        # on the fast path is what the column keeps (decision 0010). ``types``: the
        # strict mode of restore_stored_lines (False when a line is not plain).
        surface = self._surface
        # The position index is rebuilt on first use (a replace), not kept per append.
        surface._pos = None
        nodes = surface.nodes
        push_node = nodes.append
        cols = self._events.own
        push_type, push_time, push_data, push_kind = (
            cols.types.append,
            cols.times.append,
            cols.datas.append,
            cols.kinds.append,
        )
        interned = INTERNED.get
        strict = types is not None
        loads = orjson.loads
        decode_error = orjson.JSONDecodeError

        def seed_record(i: int, rec: Any) -> bool:
            # The fast path appends nodes without indexing them: the slow path's
            # replace must find every node, so the index is rebuilt on its demand.
            if strict and (
                type(rec) is not dict
                or type(rec.get("seq")) is not int
                or rec["seq"] != i
                or type(rec.get("type")) is not str
                or rec["type"] not in types  # type: ignore[operator]
            ):
                return False
            surface._pos = None
            self._seed_record(i, rec)
            return True

        message_types = MESSAGE_TYPES
        safe = SAFE_INT_MAX
        message_ok = _message_ok
        for i, item in enumerate(items):
            if encoded:
                try:
                    rec = loads(item)
                except decode_error:
                    if strict:
                        return False
                    raise
            else:
                rec = item
            if type(rec) is not dict:
                if not seed_record(i, rec):
                    return False
                continue
            t = rec.get("type")
            seq = rec.get("seq")
            tm = rec.get("time")
            data = rec.get("data")
            if (
                type(data) is not dict
                or type(seq) is not int
                or seq != i
                or type(tm) is not int
                or not -safe <= tm <= safe
                or type(t) is not str
            ):
                if not seed_record(i, rec):
                    return False
                continue
            n = len(rec)
            if t in message_types:
                if n != 5 or rec.get("surfaceOp") != APPEND or not message_ok(t, data):
                    if not seed_record(i, rec):
                        return False
                    continue
                push_node(i)
                kind = APPEND_OP
            elif n == 4 and t != "request/header" and t != _LEGACY_DELTA and (not strict or t in types):  # type: ignore[operator]
                if t in _NOTED:
                    self._note_type(t, i)
                kind = NO_OP
            else:
                if not seed_record(i, rec):
                    return False
                continue
            push_type(interned(t, t))
            push_time(tm)
            push_data(item if encoded and type(item) is bytes else data)
            push_kind(kind)
        return True

    def _seed_record(self, i: int, rec: dict[str, Any]) -> None:
        if not valid_envelope(rec):
            raise EventError(
                f"seed event at index {i} has an invalid event envelope", session_id=self._sid
            )
        if type(rec["data"]) is bytes:
            # Not JSON, and a column entry of bytes means an encoded line (0010).
            raise EventError(f"seed event at index {i} has bytes data, not a JSON value", session_id=self._sid)
        self._seed_one(i, rec["type"], rec["data"], None, rec)

    def _seed_one(
        self, i: int, type_: str, data: RawJson, event: Event | None, rec: dict[str, Any] | None
    ) -> None:
        sid = self._sid
        if type_ == _LEGACY_DELTA:
            raise EventError(
                f"seed event at index {i} uses unsupported legacy request/header-delta format",
                session_id=sid,
            )
        if type_ == "request/header":
            check_request_header(i, data)
        elif type_ in MESSAGE_TYPES:
            check_message_shape(type_, data, index=i)
        if _is_fallback_header(type_, data):
            raise EventError(
                f'seed event at index {i} uses unsupported legacy request/header reason "fallback"',
                session_id=sid,
            )
        seq = event.seq if event is not None else rec["seq"]  # type: ignore[index]
        if seq != i:
            raise EventError(
                f"seed event at index {i} has seq {seq} (expected {i}); seed must be contiguous from 0",
                session_id=sid,
            )
        if event is not None:
            raw_op, raw_src = raw_surface_metadata(event)
        else:
            raw_op = rec.get("surfaceOp", _MISSING)  # type: ignore[union-attr]
            raw_src = rec.get("sourceEventSeqs", _MISSING)  # type: ignore[union-attr]
        try:
            plan = plan_surface(
                self._surface,
                type_=type_,
                seq=seq,
                expected_seq=len(self._events),
                data=data,
                surface_op=raw_op,
                source_event_seqs=raw_src,
                event_at=self._events.__getitem__,
            )
        except SurfaceError as exc:
            raise EventError(f"invalid seed event at index {i}: {exc}", session_id=sid) from exc
        if event is None:
            event = Event(
                type_,
                seq,
                rec["time"],  # type: ignore[index]
                data,
                plan.surface_op,
                plan.source_event_seqs,
                "ignorable" in rec,  # type: ignore[operator]
            )
        elif event.surface_op != plan.surface_op or type(event.source_event_seqs) is not type(
            plan.source_event_seqs
        ):
            # A directly built Event may carry its metadata in record form (a dict op,
            # a list of seqs): the log keeps the canonical form.
            event = attrs.evolve(event, surface_op=plan.surface_op, source_event_seqs=plan.source_event_seqs)
        if self._validator is not None:
            self._vstate = self._validator.check(self._vstate, event)
        self._surface.apply(plan)
        self._note(event)
        self._events.append(event)

    def _finish_construction(self, seeded: bool) -> None:
        self._first_live_seq = len(self._events)
        if seeded and (not self._events or self._events[-1].type != END_SEED):
            self.append(END_SEED, {})

    # -- reading ----------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._header.id

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

    def _note(self, event: Event) -> None:
        if event.type in _NOTED:
            self._note_type(event.type, event.seq)

    def _note_type(self, t: str, seq: int) -> None:
        if t == "request/header":
            self._last_header = seq
        elif t == "request/context":
            self._last_context = seq
        elif t == END_SEED:
            self._last_end_seed = seq
        elif t in _BRACKET:
            self._last_bracket = seq
        else:
            self._turn_marks.append(seq)

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

    def _turn_of(self, seq: int) -> Any:
        """The frozen ``turn`` value in the data of event ``seq`` (``None`` if none)."""
        data = self._events.data_at(seq)
        return view(data.get("turn")) if type(data) is dict else None

    def open_turn_at(self, seq: int) -> Any:
        """If the last ``turn/start``/``turn/end`` at or before ``seq`` is a
        ``turn/start``, its ``turn`` value (``None`` when its data has none); else
        ``_NO_TURN``. O(log n)."""
        marks = self._turn_marks
        k = bisect.bisect_right(marks, seq) - 1
        if k < 0:
            return _NO_TURN
        mark = marks[k]
        if self._events.type_at(mark) != "turn/start":
            return _NO_TURN
        return self._turn_of(mark)

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
        check = validator.check
        for ev in self._events:
            state = check(state, ev)
        return state

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
        # plan + commit of a one-draft batch, without the draft and plan objects (the
        # hot path of W1): validate everything, then change the session.
        base = len(self._events)
        event, sp = self._plan_one(
            type, data, surface_op, source_event_seqs, base, self._now(), self._surface, self._events.__getitem__
        )
        vstate = self._vstate
        if self._validator is not None:
            vstate = self._validator.check(vstate, event)
        _apply_plan(self._surface, base, sp)
        self._note(event)
        self._events.append(event)
        self._vstate = vstate
        return event

    def append_batch(self, drafts: Sequence[EventDraft]) -> tuple[Event, ...]:
        """Append a batch: it lands whole, or raises and changes nothing."""
        return self.commit(self.plan(drafts))

    def plan(self, drafts: Sequence[EventDraft], *, time_ms: int | None = None) -> AppendPlan:
        """Validate a batch against the current state without changing anything.

        Raises the first rule a draft breaks. The plan can be committed only while
        the session has not changed since (see :meth:`commit`).
        """
        base = len(self._events)
        now = self._now() if time_ms is None else self._checked_time(time_ms)
        # Replaces need positions that reflect earlier drafts of the batch: they are
        # planned against a private clone. Appends never read surface state.
        # A replace reads positions: only a replace after another surface op of the
        # same batch needs that op applied first (a log-only price then a replace,
        # the compaction and prune batches, plans against the live state).
        needs_clone = False
        if len(drafts) > 1:
            seen_op = False
            for d in drafts:
                op = d.surface_op
                if op is None:
                    continue
                if seen_op and op != APPEND:
                    needs_clone = True
                    break
                seen_op = True
        state = self._surface.clone() if needs_clone else self._surface
        events: list[Event] = []
        plans: list[SurfacePlan] = []
        vstate = self._vstate
        log = self._events

        def event_at(seq: int) -> Event:
            return log[seq] if seq < base else events[seq - base]

        plan_one = self._plan_one
        validator = self._validator
        for k, d in enumerate(drafts):
            seq = base + k
            event, sp = plan_one(d.type, d.data, d.surface_op, d.source_event_seqs, seq, now, state, event_at)
            if d.ignorable is not False:
                if d.ignorable is not True:
                    raise EventError(f"ignorable must be a bool, got {d.ignorable!r}", session_id=self._sid)
                event = attrs.evolve(event, ignorable=True)
            if validator is not None:
                vstate = validator.check(vstate, event)
            if needs_clone:
                _apply_plan(state, seq, sp)
            events.append(event)
            plans.append(sp)
        return AppendPlan(
            self, base, tuple(events), tuple(plans), state if needs_clone else None, vstate
        )

    def _now(self) -> int:
        return self._checked_time(self._clock())

    def _checked_time(self, now: Any) -> int:
        if type(now) is not int or not -SAFE_INT_MAX <= now <= SAFE_INT_MAX:
            # Checked while planning, not at commit: an out-of-range time would
            # otherwise fail half-way through the commit (or later, in the
            # write-behind encoder).
            raise EventError(
                f'session "{self.id}" clock returned {now!r}; an event time must be a '
                "safe integer of milliseconds"
            )
        return now

    def _plan_one(
        self,
        type_: Any,
        raw_data: object,
        op: Any,
        src: Any,
        seq: int,
        now: int,
        state: SurfaceState,
        event_at: Callable[[int], Event],
    ) -> tuple[Event, SurfacePlan]:
        if type(type_) is not str:
            raise EventError(f"session event type must be a string, got {type_!r}", session_id=self._sid)
        try:
            data = snapshot_storable_fast(raw_data)
        except SnapshotRefused:
            data = self._snapshot_slow(type_, raw_data)
        if type_ == _LEGACY_DELTA:
            raise EventError(
                f"{_label(type_)} uses unsupported legacy request/header-delta format",
                session_id=self._sid,
            )
        if type_ == "request/header" and _is_fallback_header(type_, data):
            raise EventError(
                f'{_label(type_)} uses unsupported legacy request/header reason "fallback"',
                session_id=self._sid,
            )
        if src is None:
            # The common shapes (a plain surface append, a log-only event) need no
            # surface planning: the checks plan_surface would make are these.
            if type(op) is str and op == APPEND and type_ in SURFACE_TYPES:
                return Event(type_, seq, now, data, APPEND, None), _PLAIN_APPEND
            if op is None and type_ not in SURFACE_TYPES:
                return Event(type_, seq, now, data, None, None), _NO_SURFACE
        raw_op: Any = _MISSING
        raw_src: Any = _MISSING
        if op is not None:
            if op == APPEND and type(op) is str:
                raw_op = APPEND  # the common case: a literal needs no snapshot
            elif isinstance(op, ReplaceOp):
                raw_op = op.to_raw()
            else:
                ok, raw_op = try_snapshot_raw(op)
                if not ok:
                    raise NotJsonError(
                        f"{_label(type_)} carries non-JSON-serializable surface metadata",
                        session_id=self._sid,
                    )
        if src is not None:
            ok, raw_src = try_snapshot_raw(list(src) if type(src) is tuple else src)
            if not ok:
                raise NotJsonError(
                    f"{_label(type_)} carries non-JSON-serializable surface metadata",
                    session_id=self._sid,
                )
        try:
            sp = plan_surface(
                state,
                type_=type_,
                seq=seq,
                expected_seq=seq,
                data=data,
                surface_op=raw_op,
                source_event_seqs=raw_src,
                event_at=event_at,
            )
        except SurfaceError as exc:
            exc.session_id = self._sid
            raise
        return Event(type_, seq, now, data, sp.surface_op, sp.source_event_seqs), sp

    def _snapshot_slow(self, type_: str, raw_data: object) -> RawJson:
        """The validating copy of data the fast walk refused: deep, or not storable."""
        why, data = try_snapshot_storable(raw_data)
        if why == "too deep":
            # Refused here: accepted, it would fail every write-behind flush.
            raise NotJsonError(
                f"{_label(type_)} carries data nested more than {MAX_STORABLE_DEPTH} levels deep, "
                "which cannot be stored",
                session_id=self._sid,
            )
        if why is not None:
            raise NotJsonError(f"{_label(type_)} carries non-JSON-serializable data", session_id=self._sid)
        return data

    def commit(self, plan: AppendPlan) -> tuple[Event, ...]:
        """Apply a plan made by :meth:`plan` on this session's current state.

        Raises :class:`SessionError` (nothing changes) if the plan belongs to another
        session or the log changed after it was planned.
        """
        if plan.session is not self or plan.base_seq != len(self._events):
            raise SessionError(
                f'stale append plan for session "{self.id}": planned at seq {plan.base_seq}, '
                f"log is at seq {len(self._events)}",
                session_id=self._sid,
            )
        events = plan.events
        if plan.surface is not None:
            self._surface = plan.surface
        else:
            surface = self._surface
            append_node = surface.append_node
            # The event's own seq object, not a fresh int: the surface then shares it,
            # and its nodes stay packed in memory (a fresh int per node, allocated while
            # the plan's ints were alive, left every node on its own cache line and a
            # fork's copy of the nodes 25% slower). _apply_plan inlined: the W10 loop.
            for ev, sp in zip(events, plan.plans, strict=True):
                if sp is _PLAIN_APPEND:
                    append_node(ev.seq)
                elif sp is not _NO_SURFACE:
                    surface.apply(sp)
        noted = _NOTED
        for ev in events:
            if ev.type in noted:
                self._note_type(ev.type, ev.seq)
        self._events.extend(events)
        self._vstate = plan.validator_state
        return plan.events

    def __repr__(self) -> str:
        return f"<Session {self.id!r} seq={self.seq} surface={len(self._surface.nodes)}>"


_PRIVATE: Final = object()
_BRACKET: Final = frozenset({"compaction/start", "compaction/end"})
_NOTED: Final = frozenset(
    {"request/header", "request/context", "turn/start", "turn/end", END_SEED, *_BRACKET}
)
_NO_TURN: Final[Any] = object()
"""Returned by :meth:`Session.open_turn_at` when no turn is open."""


def _restored_header(header: dict[str, Any] | SessionHeader, session_id: str) -> SessionHeader:
    """The header of a restore, validated (a record, or a header as its record)."""
    return validate_header_record(header.to_record() if isinstance(header, SessionHeader) else header, session_id)


_PLAIN_APPEND: Final = SurfacePlan(-1, APPEND, None)
_NO_SURFACE: Final = SurfacePlan(-1, None, None)
"""Shared plans of the two common shapes (identified by identity; see _apply_plan)."""


def _apply_plan(state: SurfaceState, seq: int, sp: SurfacePlan) -> None:
    """Apply the plan of event ``seq`` to ``state`` (the shared plans carry no seq)."""
    if sp is _PLAIN_APPEND:
        state.append_node(seq)
    elif sp is not _NO_SURFACE:
        state.apply(sp)


def _fold_trusted(log: Log) -> SurfaceState:
    """The surface after already-validated events (no checks, appends inline)."""
    state = SurfaceState()
    nodes = state.nodes
    for seq, op in log.surface_ops():
        if op == APPEND:
            nodes.append(seq)
            continue
        assert isinstance(op, ReplaceOp)
        i, j = nodes.index(op.start), nodes.index(op.end)
        nodes[i : j + 1] = [seq]
        state.generation += 1
    state._pos = None  # rebuilt on first use
    return state


def _last_index(log: Log, type_: str | frozenset[str], hint: int) -> int:
    """Index of the last event of ``type_`` (a type or a set) in ``log``; ``hint`` is
    the parent's."""
    if hint < len(log):
        return hint
    types = frozenset((type_,)) if isinstance(type_, str) else type_
    type_at = log.type_at
    for i in range(len(log) - 1, -1, -1):
        if type_at(i) in types:
            return i
    return -1

