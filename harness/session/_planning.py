"""Planning an append: validate and copy drafts against a session without changing it.

Every rule an appended event must meet is checked here (type, JSON data and its
depth, legacy forms, surface metadata, the validator's veto); the result is an
:class:`AppendPlan` that :mod:`harness.session._commit` applies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs

from harness.errors import EventError, NotJsonError, SurfaceError
from harness.session._append_types import EventDraft
from harness.session._events import (
    APPEND,
    SAFE_INT_MAX,
    SURFACE_TYPES,
    Event,
    ReplaceOp,
    plain_event,
    set_ignorable,
)
from harness.session._json import (
    MAX_STORABLE_DEPTH,
    RawJson,
    SnapshotRefused,
    encode_storable_fast,
    snapshot_storable_fast,
    try_snapshot_raw,
    try_snapshot_storable,
)
from harness.session._state import SessionState
from harness.session._surface import _MISSING, SurfacePlan, SurfaceState, plan_surface

LEGACY_DELTA: Final = "request/header-delta"

KEEP_TREES: Final = frozenset({"assistant/chunk", "request/header", LEGACY_DELTA})
"""Types whose appended data stays a tree (decision 0023): chunk deltas, which the
writers pack into rows by reading their fields; request headers and the legacy delta,
whose data the planner reads (a ``fallback`` header and the delta are refused)."""

PLAIN_APPEND: Final = SurfacePlan(-1, APPEND, None)
NO_SURFACE: Final = SurfacePlan(-1, None, None)
"""Shared plans of the two common shapes (identified by identity; see apply_plan)."""


@attrs.frozen(slots=True, eq=False)
class AppendPlan:
    """A validated batch, ready to commit. Valid only against the state it was planned on."""

    session: SessionState
    base_seq: int
    events: tuple[Event, ...]
    plans: tuple[SurfacePlan, ...]
    surface: SurfaceState | None
    validator_state: Any


def shown(value: object) -> str:
    """``repr(value)`` for an error message about a caller's argument, which never
    raises: an argument's own ``__repr__`` may (it would escape typed refusals and
    crash the session actor)."""
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} object>"


def check_type(session_id: str, type_: object) -> None:
    """:func:`type_error` unless an event's ``type_`` is a string (for a caller whose
    parameter named ``type`` hides the builtin, as ``append_nowait``'s)."""
    if type(type_) is not str:
        raise type_error(session_id, type_)


def type_error(session_id: str, type_: object) -> EventError:
    """The refusal of an event ``type_`` that is not a string (the caller tests
    ``type(type_) is not str`` inline: the append hot path pays no call for it)."""
    return EventError(f"session event type must be a string, got {shown(type_)}", session_id=session_id)


def label(type_: str) -> str:
    return f'session event "{type_}"'


def is_fallback_header(type_: str, data: RawJson) -> bool:
    return type_ == "request/header" and type(data) is dict and data.get("reason") == "fallback"


def apply_plan(state: SurfaceState, seq: int, sp: SurfacePlan) -> None:
    """Apply the plan of event ``seq`` to ``state`` (the shared plans carry no seq)."""
    if sp is PLAIN_APPEND:
        state.append_node(seq)
    elif sp is not NO_SURFACE:
        state.apply(sp)


def clock_now(s: SessionState) -> int:
    """The session clock's time, checked."""
    return checked_time(s, s._clock())


def checked_time(s: SessionState, now: Any) -> int:
    if type(now) is not int or not -SAFE_INT_MAX <= now <= SAFE_INT_MAX:
        # Checked while planning, not at commit: an out-of-range time would
        # otherwise fail half-way through the commit (or later, in the
        # write-behind encoder).
        raise EventError(
            f'session "{s.id}" clock returned {shown(now)}; an event time must be a '
            "safe integer of milliseconds"
        )
    return now


def plan_batch(s: SessionState, drafts: Sequence[EventDraft], time_ms: int | None) -> AppendPlan:
    """Validate a batch against the current state of ``s`` without changing anything
    (see :meth:`Session.plan`)."""
    base = len(s._events)
    at = clock_now(s) if time_ms is None else checked_time(s, time_ms)
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
            # The type first: an argument's own ``!=`` is never called (it may raise).
            if seen_op and not (type(op) is str and op == APPEND):
                needs_clone = True
                break
            seen_op = True
    state = s._surface.clone() if needs_clone else s._surface
    events: list[Event] = []
    plans: list[SurfacePlan] = []
    vstate = s._vstate
    log = s._events

    def event_at(seq: int) -> Event:
        return log[seq] if seq < base else events[seq - base]

    validator = s._validator
    for k, d in enumerate(drafts):
        seq = base + k
        event, sp = plan_one(s, d.type, d.data, d.surface_op, d.source_event_seqs, seq, at, state, event_at)
        if d.ignorable is not False:
            if d.ignorable is not True:
                raise EventError(f"ignorable must be a bool, got {shown(d.ignorable)}", session_id=s._sid)
            # The event was made just now and nothing holds it yet: set, not evolved
            # (attrs.evolve walks every field per call).
            set_ignorable(event, True)
        if validator is not None:
            vstate = validator.check(vstate, event)
        if needs_clone:
            apply_plan(state, seq, sp)
        events.append(event)
        plans.append(sp)
    return AppendPlan(s, base, tuple(events), tuple(plans), state if needs_clone else None, vstate)


def plan_one(
    s: SessionState,
    type_: Any,
    raw_data: object,
    op: Any,
    src: Any,
    seq: int,
    now: int,
    state: SurfaceState,
    event_at: Callable[[int], Event],
) -> tuple[Event, SurfacePlan]:
    """The event ``seq`` a draft makes, and its surface plan against ``state``."""
    if type(type_) is not str:
        raise type_error(s._sid, type_)
    # The common shapes (a plain surface append, a log-only event) need no surface
    # planning: the checks plan_surface would make are these.
    common: SurfacePlan | None = None
    if src is None:
        if type(op) is str and op == APPEND and type_ in SURFACE_TYPES:
            common = PLAIN_APPEND
        elif op is None and type_ not in SURFACE_TYPES:
            common = NO_SURFACE
    if (
        common is not None
        and type_ not in KEEP_TREES
        and type_ not in s._reads
        and type_ not in s._hooked
        and (common is NO_SURFACE or not s._derive.read)
    ):
        # Their data is kept as its JSON where nothing is about to read its tree
        # (decision 0023): not a type whose data a validator reads (its own or the
        # store's, ``AppendValidator.reads_data``; one that declares none reads every
        # type), and a surface event only until the session's surface is first derived
        # (each would be decoded).
        try:
            return plain_event(type_, seq, now, encode_storable_fast(raw_data), common.surface_op), common
        except SnapshotRefused:
            pass  # the general path below gives the verdict (or the deep copy)
    try:
        data = snapshot_storable_fast(raw_data)
    except SnapshotRefused:
        data = storable_copy(s._sid, type_, raw_data)
    if type_ == LEGACY_DELTA:
        raise EventError(
            f"{label(type_)} uses unsupported legacy request/header-delta format",
            session_id=s._sid,
        )
    if type_ == "request/header" and is_fallback_header(type_, data):
        raise EventError(
            f'{label(type_)} uses unsupported legacy request/header reason "fallback"',
            session_id=s._sid,
        )
    if common is not None:
        return plain_event(type_, seq, now, data, common.surface_op), common
    raw_op: Any = _MISSING
    raw_src: Any = _MISSING
    if op is not None:
        if type(op) is str and op == APPEND:
            raw_op = APPEND  # the common case: a literal needs no snapshot (the type first: see plan)
        elif issubclass(type(op), ReplaceOp):  # not isinstance: it reads an argument's __class__
            raw_op = op.to_raw()
        else:
            ok, raw_op = try_snapshot_raw(op)
            if not ok:
                raise NotJsonError(
                    f"{label(type_)} carries non-JSON-serializable surface metadata",
                    session_id=s._sid,
                )
    if src is not None:
        ok, raw_src = try_snapshot_raw(list(src) if type(src) is tuple else src)
        if not ok:
            raise NotJsonError(
                f"{label(type_)} carries non-JSON-serializable surface metadata",
                session_id=s._sid,
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
        exc.session_id = s._sid
        raise
    return Event(type_, seq, now, data, sp.surface_op, sp.source_event_seqs), sp


def storable_copy(session_id: str, type_: str, raw_data: object) -> RawJson:
    """The validating copy of the data of an event of ``type_`` (the general path, also
    for data the fast walk refused), or :class:`NotJsonError`: not JSON, or nested
    deeper than an event can be stored."""
    why, data = try_snapshot_storable(raw_data)
    if why == "too deep":
        # Refused here: accepted, it would fail every write-behind flush.
        raise NotJsonError(
            f"{label(type_)} carries data nested more than {MAX_STORABLE_DEPTH} levels deep, "
            "which cannot be stored",
            session_id=session_id,
        )
    if why is not None:
        raise NotJsonError(f"{label(type_)} carries non-JSON-serializable data", session_id=session_id)
    return data
