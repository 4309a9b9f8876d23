"""The surface manager: which events the model sees, in which order (reference §4).

Validation produces a plan without touching state; committing applies it. A replace
is resolved by surface *position* (a seq -> position index makes that O(1)); its
commit splices the shadowed positions out, inserts the new seq at the start
position and bumps ``generation``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs

from harness.errors import SurfaceError
from harness.session._derive import SnapshotView
from harness.session._events import (
    APPEND,
    SURFACE_TYPES,
    TOOL_RESULT,
    Event,
    ReplaceOp,
    SurfaceOp,
    is_nonneg_safe_int,
)
from harness.session._json import ARRAY, RawJson, raw_equal, raw_of

_MISSING: Final[Any] = object()
"""Marks an absent optional field (None is a JSON value and may be present)."""


@attrs.frozen(slots=True)
class SurfacePlan:
    """The validated effect of one candidate event on the surface."""

    seq: int
    surface_op: SurfaceOp | None
    source_event_seqs: tuple[int, ...] | None
    start_index: int = -1
    end_index: int = -1


@attrs.frozen(slots=True)
class Replacement:
    """One committed replace, as reported by :func:`fold_surface`."""

    seq: int
    start: int
    end: int
    shadowed_seqs: tuple[int, ...]


@attrs.frozen(slots=True)
class SurfaceFold:
    nodes: tuple[int, ...]
    replacements: tuple[Replacement, ...]


class SurfaceState:
    """Mutable surface state owned by one Session (or by a fold).

    ``nodes`` only ever grows at its end, except under a replace: a replace that
    would rewrite positions some handed-out :class:`SurfaceNodes` view covers builds
    a new list instead (copy-on-write), so a view never changes under its holder.
    """

    __slots__ = ("_pos", "_view", "generation", "nodes")

    def __init__(self) -> None:
        self.nodes: list[int] = []
        self._pos: dict[int, int] | None = {}
        self.generation = 0
        self._view: SurfaceNodes | None = None

    def view(self) -> SurfaceNodes:
        """The current nodes as an immutable view: O(1), and the same object until the
        surface changes."""
        v = self._view
        nodes = self.nodes
        if v is None or v._items is not nodes or v._n != len(nodes):
            v = self._view = SurfaceNodes(nodes, len(nodes), self.generation)
        return v

    def clone(self) -> SurfaceState:
        other = SurfaceState()
        other.nodes = list(self.nodes)
        other._pos = None
        other.generation = self.generation
        return other

    def position(self, seq: int) -> int | None:
        pos = self._pos
        if pos is None:
            # Rebuilt lazily after a replace: O(n) once, then O(1) lookups.
            pos = self._pos = {s: i for i, s in enumerate(self.nodes)}
        return pos.get(seq)

    def append_node(self, seq: int) -> None:
        """Apply a plain ``"append"`` of event ``seq``."""
        if self._pos is not None:
            self._pos[seq] = len(self.nodes)
        self.nodes.append(seq)

    def apply(self, plan: SurfacePlan) -> None:
        op = plan.surface_op
        if op is None:
            return
        if op == APPEND:
            self.append_node(plan.seq)
            return
        i, j = plan.start_index, plan.end_index
        pos = self._pos
        if pos is not None and i == j:
            # One node for one node (a pruned tool result): positions do not move.
            del pos[self.nodes[i]]
            pos[plan.seq] = i
        else:
            self._pos = None  # positions after the span moved: rebuilt on first use
        nodes = self.nodes
        v = self._view
        if v is not None and v._items is nodes and i < v._n:
            # A handed-out view covers position i: leave its list alone.
            fresh = nodes[:i]
            fresh.append(plan.seq)
            fresh += nodes[j + 1 :]
            self.nodes = fresh
        else:
            nodes[i : j + 1] = [plan.seq]
        self.generation += 1


def raw_surface_metadata(event: Event) -> tuple[RawJson, RawJson]:
    """An event's ``(surfaceOp, sourceEventSeqs)`` as :func:`plan_surface` takes them:
    ``_MISSING`` when absent, else as given (a :class:`ReplaceOp` as its record). An
    :class:`Event` built directly is unchecked: its metadata is validated here like a
    record's, never coerced (a string is not a list of seqs)."""
    op: Any = event.surface_op
    src: Any = event.source_event_seqs
    return (
        _MISSING if op is None else op.to_raw() if isinstance(op, ReplaceOp) else op,
        _MISSING if src is None else src,
    )


def _event_label(type_: str) -> str:
    return f'session event "{type_}"'


def _parse_surface_op(type_: str, raw: RawJson) -> SurfaceOp:
    if raw == APPEND and type(raw) is str:
        return APPEND
    if type(raw) is not dict:
        raise SurfaceError(f"{_event_label(type_)} carries an invalid surfaceOp")
    if (
        len(raw) != 3
        or raw.keys() != {"op", "start", "end"}
        or raw["op"] != "replace"
        or not is_nonneg_safe_int(raw["start"])
        or not is_nonneg_safe_int(raw["end"])
    ):
        raise SurfaceError(f"{_event_label(type_)} carries an invalid replace surfaceOp")
    return ReplaceOp(raw["start"], raw["end"])


def _check_sources(type_: str, seq: int, raw: RawJson) -> tuple[int, ...]:
    if type(raw) not in ARRAY:
        raise SurfaceError(f"sourceEventSeqs on event at seq {seq} must be an array when present")
    if not raw and type_ != "assistant/message":
        raise SurfaceError("sourceEventSeqs must not be empty except on assistant/message")
    for s in raw:
        if not is_nonneg_safe_int(s):
            raise SurfaceError(
                f"{_event_label(type_)} sourceEventSeqs must densely contain non-negative safe integers"
            )
    if len(set(raw)) != len(raw):
        raise SurfaceError("sourceEventSeqs must not contain duplicates")
    for s in raw:
        if s >= seq:
            raise SurfaceError(f"sourceEventSeqs must reference earlier events: {s} >= current seq {seq}")
    return tuple(raw)


def _blank_tool_result(data: RawJson) -> RawJson:
    """The tool/result data with only its replaceable content blanked (rule §4.1.6):
    ``message.content`` collapsed to ``[{...content[0], content: null}]``, as the
    reference spreads the first block (an empty list's missing block, or a scalar,
    spreads to nothing; a string or an array to its indexes)."""
    if type(data) is not dict:
        return data
    out = dict(data)
    message = out.get("message")
    if type(message) is dict:
        message = dict(message)
        content = message.get("content")
        if type(content) in ARRAY:
            first: Any = content[0] if content else None
            if type(first) is dict:
                block = dict(first)
            elif type(first) is str or type(first) in ARRAY:
                block = {str(i): v for i, v in enumerate(first)}
            else:
                block = {}
            block["content"] = None
            message["content"] = [block]
        out["message"] = message
    return out


def plan_surface(
    state: SurfaceState,
    *,
    type_: str,
    seq: int,
    expected_seq: int,
    data: RawJson,
    surface_op: RawJson = _MISSING,
    source_event_seqs: RawJson = _MISSING,
    event_at: Callable[[int], Event],
) -> SurfacePlan:
    """Validate one candidate against ``state``; raise :class:`SurfaceError` or return a plan.

    ``surface_op``/``source_event_seqs`` are raw JSON (or absent). The state is not
    modified. ``event_at`` resolves an existing seq (for the tool/result rule).
    """
    if seq != expected_seq:
        raise SurfaceError(f"session event seq {seq} is not contiguous; expected {expected_seq}")
    if type_ not in SURFACE_TYPES:
        if surface_op is not _MISSING:
            raise SurfaceError(f"{_event_label(type_)} is not surface-eligible and cannot carry surfaceOp")
        if source_event_seqs is not _MISSING:
            raise SurfaceError(
                f"{_event_label(type_)} is not surface-eligible and cannot carry sourceEventSeqs"
            )
        return SurfacePlan(seq, None, None)
    if surface_op is _MISSING:
        raise SurfaceError(f"{_event_label(type_)} is surface-eligible and requires a surfaceOp marker")
    op = _parse_surface_op(type_, surface_op)
    start_index = end_index = -1
    if isinstance(op, ReplaceOp):
        si = state.position(op.start)
        if si is None:
            raise SurfaceError(f"surface replace: start seq {op.start} not found in surface")
        ei = state.position(op.end)
        if ei is None:
            raise SurfaceError(f"surface replace: end seq {op.end} not found in surface")
        if si > ei:
            raise SurfaceError(
                f"surface replace: start seq {op.start} (index {si}) is after end seq {op.end} (index {ei})"
            )
        start_index, end_index = si, ei
    sources = None if source_event_seqs is _MISSING else _check_sources(type_, seq, source_event_seqs)
    if isinstance(op, ReplaceOp):
        shadowed = state.nodes[start_index : end_index + 1]
        cited = frozenset(sources) if sources is not None else frozenset()
        missing = [s for s in shadowed if s not in cited]
        if missing:
            raise SurfaceError(
                "surface replace: sourceEventSeqs must include every shadowed surface node; missing "
                + ", ".join(map(str, missing))
            )
        if type_ == TOOL_RESULT:
            if len(shadowed) != 1:
                raise SurfaceError("tool/result surface replacement must rewrite exactly one current node")
            target = event_at(shadowed[0])
            if target.type != TOOL_RESULT:
                raise SurfaceError("tool/result surface replacement must target a current tool/result")
            if not raw_equal(_blank_tool_result(raw_of(target.data)), _blank_tool_result(data)):
                raise SurfaceError("tool/result surface replacement may change only content")
    return SurfacePlan(seq, op, sources, start_index, end_index)


def fold_surface(events: Sequence[Event], base_seq: int = 0) -> SurfaceFold:
    """Replay a complete log (or a window starting at ``base_seq``) from scratch.

    Returns detached nodes and the list of replacements. Raises :class:`SurfaceError`
    if the log breaks a surface rule.
    """
    state = SurfaceState()
    replacements: list[Replacement] = []
    window = list(events)

    def event_at(seq: int) -> Event:
        return window[seq - base_seq]

    for i, ev in enumerate(window):
        raw_op, raw_src = raw_surface_metadata(ev)
        plan = plan_surface(
            state,
            type_=ev.type,
            seq=ev.seq,
            expected_seq=base_seq + i,
            data=raw_of(ev.data),
            surface_op=raw_op,
            source_event_seqs=raw_src,
            event_at=event_at,
        )
        if isinstance(plan.surface_op, ReplaceOp):
            shadowed = tuple(state.nodes[plan.start_index : plan.end_index + 1])
            replacements.append(
                Replacement(ev.seq, plan.surface_op.start, plan.surface_op.end, shadowed)
            )
        state.apply(plan)
    return SurfaceFold(tuple(state.nodes), tuple(replacements))


class SurfaceNodes(SnapshotView[int]):
    """A session's surface nodes (seqs in surface order) at one moment: an immutable
    view, O(1) to make, that never changes under its holder (neither an append nor a
    replace reaches it). ``session.surface`` is the same object until the surface
    changes. Slices are tuples; it equals a list or tuple of the same seqs."""

    __slots__ = ("_generation",)

    def __init__(self, nodes: list[int], n: int, generation: int) -> None:
        super().__init__(nodes, n)
        self._generation = generation

    @property
    def generation(self) -> int:
        """The number of replaces committed when this view was taken."""
        return self._generation
