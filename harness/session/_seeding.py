"""Seeding a session: snapshot seeds copied in, restored records and lines adopted.

Every rule a seed or stored log must meet (envelope, contiguity, message shape,
legacy forms, surface rules, a validator's replay) is checked here, on the fields of
a fresh :class:`~harness.session._state.SessionState`; the hot loop adopts records
of the common shapes straight into the log's columns (decisions 0006, 0010).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import orjson

from harness.errors import EventError, NotJsonError, SurfaceError
from harness.session._commit import append_one
from harness.session._events import (
    APPEND,
    ASSISTANT_MESSAGE,
    END_SEED,
    SAFE_INT_MAX,
    USER_MESSAGE,
    Event,
    valid_envelope,
)
from harness.session._gc import gc_paused
from harness.session._header import SessionHeader, validate_header_record
from harness.session._json import (
    MAX_STORABLE_DEPTH,
    RawJson,
    raw_storable_depth,
    try_snapshot_storable,
)
from harness.session._log import APPEND_OP, INTERNED, NO_OP
from harness.session._planning import LEGACY_DELTA, is_fallback_header
from harness.session._shape import MESSAGE_TYPES, check_message_shape, check_request_header
from harness.session._state import NOTED, SessionState
from harness.session._surface import _MISSING, plan_surface, raw_surface_metadata


def decode_records(lines: Iterable[bytes | str]) -> list[Any]:
    """Decode JSON lines with orjson, the collector paused (see :func:`gc_paused`).

    The result is freshly owned by the caller: pass it to :meth:`Session.restore`.
    """
    loads = orjson.loads
    with gc_paused():
        return [loads(line) for line in lines]


def seed_items(s: SessionState, session_id: str, seed: Sequence[Event | dict[str, Any]]) -> None:
    """Validate, copy and adopt a snapshot seed (see :meth:`Session.create`); the
    caller pauses the collector."""
    for i, item in enumerate(seed):
        if isinstance(item, Event):
            # An Event built by the caller was never measured by an append (the
            # first reviewer: a frozen 300-level value was seeded, then every flush
            # failed).
            if not raw_storable_depth(item.raw_data):
                raise _seed_too_deep(i, session_id)
            seed_one(s, i, item.type, item.raw_data, item, None)
            continue
        # The record wraps its data one level deeper: the append rule (data at
        # most MAX_STORABLE_DEPTH deep) is MAX_STORABLE_DEPTH + 1 for a record.
        why, rec = try_snapshot_storable(item, MAX_STORABLE_DEPTH + 1)
        if why == "too deep":
            # Refused here: accepted, it would fail every write-behind flush.
            raise _seed_too_deep(i, session_id)
        if why is not None:
            raise EventError(
                f"seed event at index {i} is not losslessly JSON-serializable",
                session_id=session_id,
            )
        seed_record(s, i, rec)


def _seed_too_deep(i: int, session_id: str) -> NotJsonError:
    return NotJsonError(
        f"seed event at index {i} carries data nested more than {MAX_STORABLE_DEPTH} "
        "levels deep, which cannot be stored",
        session_id=session_id,
    )


def restored_header(header: dict[str, Any] | SessionHeader, session_id: str) -> SessionHeader:
    """The header of a restore, validated (a record, or a header as its record)."""
    return validate_header_record(header.to_record() if isinstance(header, SessionHeader) else header, session_id)


def begin_seed(s: SessionState, types: Iterable[object]) -> None:
    """Before a seed replay: show a validator that defines ``begin_seed`` the
    seed's event types in seq order (the compaction invariants look ahead to the
    end-seed that proves an orphan bracket stale, compaction reference §1.4)."""
    hook = getattr(s._validator, "begin_seed", None)
    if hook is not None:
        s._vstate = hook(s._vstate, types)


def restore_records(s: SessionState, records: list[dict[str, Any]]) -> None:
    if s._validator is not None:
        begin_seed(s, (rec.get("type") if type(rec) is dict else None for rec in records))
        for i, rec in enumerate(records):
            seed_record(s, i, rec)
        return
    restore_items(s, records, False, None)


def restore_items(s: SessionState, items: Sequence[Any], encoded: bool, types: frozenset[str] | None) -> bool:
    # The hot loop of W4 and W7. Records of the common shapes (log-only events
    # without metadata, plain surface appends of well-formed messages) are checked
    # and adopted straight into the log's columns (no Event objects, decision
    # 0006); anything else, valid or not, takes the general path, which also
    # produces the exact error. Exact key sets are checked by length: the four
    # required keys are read, so 4 keys (or 5 with surfaceOp) means no others.
    # ``encoded``: items are JSON lines, decoded here one at a time; a bytes line
    # on the fast path is what the column keeps (decision 0010). ``types``: the
    # strict mode of restore_stored_lines (False when a line is not plain).
    surface = s._surface
    # The position index is rebuilt on first use (a replace), not kept per append.
    surface._pos = None
    nodes = surface.nodes
    push_node = nodes.append
    cols = s._events.own
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

    def general(i: int, rec: Any) -> bool:
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
        seed_record(s, i, rec)
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
            if not general(i, rec):
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
            if not general(i, rec):
                return False
            continue
        n = len(rec)
        if t in message_types:
            if n != 5 or rec.get("surfaceOp") != APPEND or not message_ok(t, data):
                if not general(i, rec):
                    return False
                continue
            push_node(i)
            kind = APPEND_OP
        elif n == 4 and t != "request/header" and t != LEGACY_DELTA and (not strict or t in types):  # type: ignore[operator]
            if t in NOTED:
                s._note_type(t, i)
            kind = NO_OP
        else:
            if not general(i, rec):
                return False
            continue
        push_type(interned(t, t))
        push_time(tm)
        push_data(item if encoded and type(item) is bytes else data)
        push_kind(kind)
    return True


def seed_record(s: SessionState, i: int, rec: dict[str, Any]) -> None:
    if not valid_envelope(rec):
        raise EventError(
            f"seed event at index {i} has an invalid event envelope", session_id=s._sid
        )
    if type(rec["data"]) is bytes:
        # Not JSON, and a column entry of bytes means an encoded line (0010).
        raise EventError(f"seed event at index {i} has bytes data, not a JSON value", session_id=s._sid)
    seed_one(s, i, rec["type"], rec["data"], None, rec)


def seed_one(
    s: SessionState, i: int, type_: str, data: RawJson, event: Event | None, rec: dict[str, Any] | None
) -> None:
    sid = s._sid
    if type_ == LEGACY_DELTA:
        raise EventError(
            f"seed event at index {i} uses unsupported legacy request/header-delta format",
            session_id=sid,
        )
    if type_ == "request/header":
        check_request_header(i, data)
    elif type_ in MESSAGE_TYPES:
        check_message_shape(type_, data, index=i)
    if is_fallback_header(type_, data):
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
            s._surface,
            type_=type_,
            seq=seq,
            expected_seq=len(s._events),
            data=data,
            surface_op=raw_op,
            source_event_seqs=raw_src,
            event_at=s._events.__getitem__,
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
    if s._validator is not None:
        s._vstate = s._validator.check(s._vstate, event)
    s._surface.apply(plan)
    if event.type in NOTED:
        s._note_type(event.type, event.seq)
    s._events.append(event)


def finish_construction(s: SessionState, seeded: bool) -> None:
    s._first_live_seq = len(s._events)
    if seeded and (not s._events or s._events[-1].type != END_SEED):
        append_one(s, END_SEED, {}, None, None)


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
