"""Forking: a child's state from a prefix of its parent's log, shared, not copied.

A prefix of a valid log is valid, so nothing is re-validated: the child shares the
parent's columns up to the boundary and takes the surface state there.
"""

from __future__ import annotations

import bisect

from harness.session._append_types import check_all
from harness.session._events import APPEND, END_SEED, ReplaceOp
from harness.session._log import Log
from harness.session._seeding import begin_seed
from harness.session._state import BRACKET, SessionState
from harness.session._surface import SurfaceState


def fork_into(child: SessionState, parent: SessionState, boundary: int) -> None:
    """Give ``child`` (blank, with its header) events ``0..boundary`` of ``parent``
    (see :meth:`Session.fork_of`): columns shared (O(1), or a copy of the parent's
    live part when the parent is itself a fork), the surface a copy of the parent's
    when the boundary is its last seq, else a fold of the prefix's ops. The child's
    validator, if any, is replayed over the prefix."""
    child._events = parent._events.prefix(boundary + 1)
    if boundary == len(parent._events) - 1:
        child._surface = parent._surface.clone()
    else:
        child._surface = _fold_trusted(child._events)
    events = child._events
    child._turn_marks = parent._turn_marks[: bisect.bisect_right(parent._turn_marks, boundary)]
    child._last_header = _last_index(events, "request/header", parent._last_header)
    child._last_context = _last_index(events, "request/context", parent._last_context)
    child._last_bracket = _last_index(events, BRACKET, parent._last_bracket)
    child._last_end_seed = _last_index(events, END_SEED, parent._last_end_seed)
    validator = child._validator
    if validator is not None:
        begin_seed(child, (events.type_at(i) for i in range(len(events))))
        child._vstate = check_all(validator, child._vstate, events)


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
