"""The event envelope, the vocabulary, and record (de)serialisation.

An :class:`Event` is a frozen, slotted attrs value. Its ``data`` is a frozen JSON
value (:mod:`harness.session._json`). Records are the plain-dict wire form that
orjson writes, with the reference's camelCase keys and key order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal, TypeAlias

import attrs
import orjson

from harness.session._json import (
    FrozenDict,
    FrozenList,
    JsonValue,
    RawJson,
    raw_equal,
    raw_of,
    view,
)

_loads: Final = orjson.loads
_Fragment: Final = orjson.Fragment

SAFE_INT_MAX: Final = 2**53 - 1

USER_MESSAGE: Final = "user/message"
ASSISTANT_MESSAGE: Final = "assistant/message"
TOOL_RESULT: Final = "tool/result"
END_SEED: Final = "session/end-seed"

SURFACE_TYPES: Final = frozenset({USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT})
"""The three model-visible (surface-eligible) event types."""

CORE_EVENT_TYPES: Final = frozenset(
    {
        "turn/start",
        "turn/end",
        "step/start",
        "step/end",
        USER_MESSAGE,
        "assistant/chunk",
        ASSISTANT_MESSAGE,
        "tool/call",
        TOOL_RESULT,
        "todo/write",
        "request/header",
        "request/context",
        END_SEED,
    }
)

KNOWN_EVENT_TYPES: Final = CORE_EVENT_TYPES | frozenset(
    {
        "agent/inbox/spliced",
        "agent-preset/selected",
        "approval/asked",
        "approval/decided",
        "approval/policy",
        "command/run",
        "command/done",
        "compaction/start",
        "compaction/summary",
        "compaction/prune",
        "compaction/end",
        "feedback/record",
        "goal/change",
        "hook/invoked",
        "hook/result",
        "llm/retry",
        "llm/retry-started",
        "permission/preset",
        "plan/mode",
        "sandbox/mode",
        "schedule/change",
        "session/title",
        "session/title-llm-request",
        "subagent/descriptor",
        "team/member",
        "team/task",
        "team/message/queued",
        "team/message/delivered",
        "tool/code-dispatch",
        "tool/code-dispatch-start",
        "tool-workflow/run-start",
        "tool-workflow/run-end",
        "tool-workflow/agent-start",
        "tool-workflow/agent-end",
        "web/deepseek-search-llm-request",
    }
)
"""The 48 types a persistence reader understands (the reference's list)."""

ENVELOPE_KEYS: Final = frozenset(
    {"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable"}
)


@attrs.frozen(slots=True)
class ReplaceOp:
    """``surfaceOp: {op: "replace", start, end}``: shadow the surface range start..end."""

    start: int
    end: int

    def to_raw(self) -> dict[str, Any]:
        return {"op": "replace", "start": self.start, "end": self.end}


SurfaceOp: TypeAlias = Literal["append"] | ReplaceOp
APPEND: Final = "append"


@attrs.frozen(slots=True, eq=False, repr=False)
class Event:
    """One immutable log entry.

    Construct events through :class:`~harness.session.Session` (append, seed or
    restore), which validates them; direct construction skips every check. The
    ``data`` argument is a raw tree the event takes ownership of (or a frozen value),
    or that tree's compact JSON as ``bytes`` (decision 0023: what an append keeps),
    decoded afresh on every read of :attr:`data`.
    """

    type: str
    seq: int
    time: int
    # The raw tree, not its view: one GC-tracked object less per event (decision 0003);
    # or its JSON bytes, which the collector never visits (decision 0023).
    _data: RawJson | bytes
    surface_op: SurfaceOp | None = None
    source_event_seqs: tuple[int, ...] | None = None
    ignorable: bool = False

    @property
    def data(self) -> JsonValue:
        """The payload as a frozen JSON value (of an appended event: decoded on every
        read, so two reads are equal, not identical)."""
        data = self._data
        return view(_loads(data) if type(data) is bytes else data)

    @property
    def raw_data(self) -> RawJson:
        """The payload's raw tree (private to the harness: read it, never mutate it)."""
        data = self._data
        if isinstance(data, bytes):
            return _loads(data)
        return raw_of(data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return (
            self.seq == other.seq
            and self.type == other.type
            and self.time == other.time
            and self.surface_op == other.surface_op
            and self.source_event_seqs == other.source_event_seqs
            and self.ignorable == other.ignorable
            and raw_equal(self.raw_data, other.raw_data)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def is_surface(self) -> bool:
        """Surface-eligible type carrying a surface op."""
        return self.surface_op is not None

    def __repr__(self) -> str:
        op = "" if self.surface_op is None else f", surface_op={self.surface_op!r}"
        return f"Event({self.type!r}, seq={self.seq}, data={self.data!r}{op})"


def slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """The setter of slot ``name`` of the frozen, slotted attrs class ``cls``, for the
    hot paths that build an instance without attrs' ``__init__`` (decision 0022): the
    slot's member descriptor, whose ``__set__`` bypasses the frozen ``__setattr__``."""
    descriptor: Any = cls.__dict__[name]
    return descriptor.__set__  # type: ignore[no-any-return]


_new_object = object.__new__
_set_type, _set_seq, _set_time, _set_data, _set_op, _set_src, _set_ignorable = (
    slot_setter(Event, n) for n in ("type", "seq", "time", "_data", "surface_op", "source_event_seqs", "ignorable")
)

set_ignorable: Final = _set_ignorable
"""``ignorable``'s slot setter, for a planner that marks an event it has just made (and
nothing else holds yet): the frozen class's ``attrs.evolve`` walks every field."""


def plain_event(type_: str, seq: int, time: int, data: RawJson | bytes, op: SurfaceOp | None) -> Event:
    """``Event(type_, seq, time, data, op, None)`` for the hot paths (a plain append, a
    log-only event, an event read from the log's columns), without attrs' frozen
    ``__init__``: that calls ``object.__setattr__`` once per field, and the slots'
    own setters are ~35% cheaper (decision 0022). Nothing is validated, as with the
    constructor; the caller's data is already checked."""
    e = _new_object(Event)
    _set_type(e, type_)
    _set_seq(e, seq)
    _set_time(e, time)
    _set_data(e, data)
    _set_op(e, op)
    _set_src(e, None)
    _set_ignorable(e, False)
    return e


def event_to_record(event: Event) -> dict[str, Any]:
    """The record orjson writes: key order type, seq, time, data, [sourceEventSeqs],
    [surfaceOp], [ignorable].

    The record shares the event's frozen tree (arrays may be tuples): serialise it, or
    pass it through :func:`~harness.session.thaw` for a plain, mutable copy.
    """
    return _record(event, event.raw_data)


def event_to_write_record(event: Event) -> dict[str, Any]:
    """:func:`event_to_record` for a writer that serialises it with orjson: the data an
    append kept as JSON is an ``orjson.Fragment`` of those bytes (decision 0023), so it
    is written as it was encoded, not decoded and encoded again."""
    # Called per event by the persistence writer on the Trio thread.
    data = event._data
    if type(data) is bytes:
        data = _Fragment(data)
    elif type(data) is FrozenDict or type(data) is FrozenList:
        data = data._raw
    if event.surface_op == APPEND and event.source_event_seqs is None and not event.ignorable:
        return {"type": event.type, "seq": event.seq, "time": event.time, "data": data, "surfaceOp": APPEND}
    return _record(event, data)


def _record(event: Event, data: Any) -> dict[str, Any]:
    # The plain append (an "append" op, nothing else) is one dict display.
    op = event.surface_op
    src = event.source_event_seqs
    if src is None:
        if op == APPEND and not event.ignorable:
            return {"type": event.type, "seq": event.seq, "time": event.time, "data": data, "surfaceOp": APPEND}
        if op is None and event.ignorable is True:  # an extension's log-only type (the SDK sessions' items)
            return {"type": event.type, "seq": event.seq, "time": event.time, "data": data, "ignorable": True}
    rec: dict[str, Any] = {"type": event.type, "seq": event.seq, "time": event.time, "data": data}
    if src is not None:
        rec["sourceEventSeqs"] = src
    if op is not None:
        rec["surfaceOp"] = op if isinstance(op, str) else op.to_raw()
    if event.ignorable:
        rec["ignorable"] = True
    return rec


def is_safe_int(v: object) -> bool:
    return type(v) is int and -SAFE_INT_MAX <= v <= SAFE_INT_MAX


def is_nonneg_safe_int(v: object) -> bool:
    return type(v) is int and 0 <= v <= SAFE_INT_MAX


def valid_envelope(rec: RawJson) -> bool:
    """The seed/restore envelope check of reference §1 (own keys, types, ranges)."""
    if type(rec) is not dict or "data" not in rec:
        return False
    for key in rec:
        if key not in ENVELOPE_KEYS:
            return False
    if type(rec.get("type")) is not str:
        return False
    if not is_nonneg_safe_int(rec.get("seq")) or not is_safe_int(rec.get("time")):
        return False
    return "ignorable" not in rec or rec["ignorable"] is True
