"""Committing: a planned batch, or one event planned and applied in place, lands whole.

Nothing here validates: :mod:`harness.session._planning` did, and a commit only
checks that the plan still matches the session (no other change since).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.errors import SessionError
from harness.session._events import Event
from harness.session._planning import (
    NO_SURFACE,
    PLAIN_APPEND,
    AppendPlan,
    apply_plan,
    clock_now,
    plan_one,
)
from harness.session._state import NOTED, SessionState
from harness.session._surface import SurfacePlan


def append_one(
    s: SessionState,
    type_: str,
    data: object,
    surface_op: Any,
    source_event_seqs: Sequence[int] | None,
) -> Event:
    """Validate, copy and append one event (see :meth:`Session.append`)."""
    # plan + commit of a one-draft batch, without the draft and plan objects (the
    # hot path of W1): validate everything, then change the session.
    single = plan_single(s, type_, data, surface_op, source_event_seqs)
    commit_single(s, single)
    return single[0]


SinglePlan = tuple[Event, SurfacePlan, Any]
"""One planned event: the event, its surface plan, the validator's state after it."""


def plan_single(
    s: SessionState, type_: str, data: object, surface_op: Any, source_event_seqs: Sequence[int] | None
) -> SinglePlan:
    """Validate one event against ``s`` without changing it (a one-draft
    :meth:`Session.plan`, without the plan object): commit it with
    :func:`commit_single` while ``s`` has not changed."""
    log = s._events
    base = len(log)
    event, sp = plan_one(s, type_, data, surface_op, source_event_seqs, base, clock_now(s), s._surface, log.__getitem__)
    vstate = s._vstate
    if s._validator is not None:
        vstate = s._validator.check(vstate, event)
    return event, sp, vstate


def commit_single(s: SessionState, single: SinglePlan) -> None:
    """Apply a :func:`plan_single` result to ``s``; :class:`SessionError` (nothing
    changes) if the log changed after it was planned, as :func:`commit` checks."""
    event, sp, vstate = single
    if event.seq != len(s._events):
        raise _stale(s, event.seq)
    apply_plan(s._surface, event.seq, sp)
    if event.type in NOTED:
        s._note_type(event.type, event.seq)
    s._events.append(event)
    s._vstate = vstate


def commit(s: SessionState, plan: AppendPlan) -> tuple[Event, ...]:
    """Apply ``plan`` to ``s`` (see :meth:`Session.commit`)."""
    if plan.session is not s or plan.base_seq != len(s._events):
        raise _stale(s, plan.base_seq)
    events = plan.events
    if plan.surface is not None:
        s._surface = plan.surface
    else:
        surface = s._surface
        append_node = surface.append_node
        # The event's own seq object, not a fresh int: the surface then shares it,
        # and its nodes stay packed in memory (a fresh int per node, allocated while
        # the plan's ints were alive, left every node on its own cache line and a
        # fork's copy of the nodes 25% slower). apply_plan inlined: the W10 loop.
        for ev, sp in zip(events, plan.plans, strict=True):
            if sp is PLAIN_APPEND:
                append_node(ev.seq)
            elif sp is not NO_SURFACE:
                surface.apply(sp)
    noted = NOTED
    for ev in events:
        if ev.type in noted:
            s._note_type(ev.type, ev.seq)
    s._events.extend(events)
    s._vstate = plan.validator_state
    return plan.events


def _stale(s: SessionState, planned_at: int) -> SessionError:
    return SessionError(
        f'stale append plan for session "{s.id}": planned at seq {planned_at}, log is at seq {len(s._events)}',
        session_id=s._sid,
    )
