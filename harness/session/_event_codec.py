"""Single events outside a session: the type guards, snapshot/adopt, and the decoder of
stored records (reference §1.2, §5).

A :class:`~harness.session.Session` validates events against its log (contiguity,
surface rules). These functions judge one event alone, for code that handles events
without a session: a tool reading a stored log, a transcript viewer, a test. They check
what one event can show by itself: its envelope, the syntax of its surface metadata and
the shape of its message (§6.3); a :class:`Session` checks the rest when it takes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from harness.errors import EventError, NotJsonError, SurfaceError
from harness.session._chunks import decode_storage_record, is_storage_row
from harness.session._events import APPEND, SURFACE_TYPES, Event, SurfaceOp, valid_envelope
from harness.session._json import RawJson, raw_of, snapshot_raw
from harness.session._shape import MESSAGE_TYPES, check_message_shape
from harness.session._surface import (
    _MISSING,
    _check_sources,
    _parse_surface_op,
    raw_surface_metadata,
)

# -- type guards (reference §5) ----------------------------------------------------------


def is_surface_eligible_type(type_: object) -> bool:
    """Whether ``type_`` is one of the three model-visible types (``user/message``,
    ``assistant/message``, ``tool/result``)."""
    return type(type_) is str and type_ in SURFACE_TYPES


def _op_of(event: Event | Mapping[str, Any]) -> object:
    if isinstance(event, Event):
        return event.surface_op
    return event.get("surfaceOp") if isinstance(event, Mapping) else None


def _type_of(event: Event | Mapping[str, Any]) -> object:
    # Anything else is no event: a guard answers False rather than raising.
    if isinstance(event, Event):
        return event.type
    return event.get("type") if isinstance(event, Mapping) else None


def is_surface_event(event: Event | Mapping[str, Any]) -> bool:
    """A surface-eligible type carrying a surface op (an :class:`Event` or a record)."""
    return is_surface_eligible_type(_type_of(event)) and _op_of(event) is not None


def is_append_surface_event(event: Event | Mapping[str, Any]) -> bool:
    """A surface event whose op is ``"append"``: what a human transcript shows."""
    return is_surface_event(event) and _op_of(event) == APPEND


def is_replacement_surface_event(event: Event | Mapping[str, Any]) -> bool:
    """A surface event whose op is not ``"append"`` (a replace, e.g. a compaction)."""
    return is_surface_event(event) and _op_of(event) != APPEND


# -- snapshot / adopt (reference §1.2) ---------------------------------------------------


def adopt_event(record: dict[str, Any]) -> Event:
    """Restore mode: take ownership of a freshly decoded record and return its
    :class:`Event`, without copying or JSON-walking it.

    The caller transfers ownership (it must not keep or mutate ``record``; ``orjson``
    output is lossless JSON by construction). Checked: the envelope (own keys, ``type``
    a string, ``seq`` a non-negative and ``time`` a safe integer, ``data`` present,
    ``ignorable`` only ``true``), for the three message types the message shape, and
    the surface metadata as far as one event shows it (a log-only type carries no
    ``surfaceOp``/``sourceEventSeqs``, a surface type carries a well-formed
    ``surfaceOp``, ``sourceEventSeqs`` name earlier seqs).

    Raises:
        EventError: a bad envelope or message (``INVALID_EVENT``), naming the seq.
        SurfaceError: bad surface metadata (``INVALID_SURFACE``).
    """
    if not valid_envelope(record):
        raise EventError(f"stored record has an invalid event envelope: {_brief(record)}")
    type_: str = record["type"]
    seq: int = record["seq"]
    data: RawJson = record["data"]
    if type_ in MESSAGE_TYPES:
        check_message_shape(type_, data, seq=seq)
    raw_op = record.get("surfaceOp", _MISSING)
    op, sources = _surface_metadata(type_, seq, raw_op, record.get("sourceEventSeqs", _MISSING))
    return Event(type_, seq, record["time"], data, op, sources, record.get("ignorable") is True)


def _surface_metadata(
    type_: str, seq: int, raw_op: RawJson, raw_src: RawJson
) -> tuple[SurfaceOp | None, tuple[int, ...] | None]:
    """The rules of reference §4.1 that one event shows by itself, in its order: a
    log-only type carries neither ``surfaceOp`` nor ``sourceEventSeqs`` (rule 2), a
    surface type carries a ``surfaceOp`` (rule 3), both are well formed (rules 3, 5).
    An explicit ``null`` is a value, not an absence (as in a :class:`Session`)."""
    if type_ not in SURFACE_TYPES:
        if raw_op is not _MISSING:
            raise SurfaceError(f'session event "{type_}" is not surface-eligible and cannot carry surfaceOp')
        if raw_src is not _MISSING:
            raise SurfaceError(f'session event "{type_}" is not surface-eligible and cannot carry sourceEventSeqs')
        return None, None
    if raw_op is _MISSING:
        raise SurfaceError(f'session event "{type_}" is surface-eligible and requires a surfaceOp marker')
    op = _parse_surface_op(type_, raw_op)
    return op, None if raw_src is _MISSING else _check_sources(type_, seq, raw_src)


def snapshot_event(event: Event | Mapping[str, Any]) -> Event:
    """Snapshot mode: validate a borrowed event or record and return an :class:`Event`
    the caller's later mutations cannot reach.

    A record is JSON-walked and deep-copied (frozen views inside it are shared), then
    adopted (:func:`adopt_event`). An :class:`Event` is immutable already: its message
    shape and surface metadata are checked and it is returned as it is.

    Raises:
        EventError: not lossless JSON, a bad envelope or message (``INVALID_EVENT``).
        SurfaceError: bad surface metadata (``INVALID_SURFACE``).
    """
    if isinstance(event, Event):
        if event.type in MESSAGE_TYPES:
            check_message_shape(event.type, raw_of(event.data), seq=event.seq)
        raw_op, raw_src = raw_surface_metadata(event)
        _surface_metadata(event.type, event.seq, raw_op, raw_src)
        return event
    if not isinstance(event, Mapping):
        raise EventError(f"snapshot_event takes an Event or a record, got {_brief(event)}")
    try:
        record = snapshot_raw(dict(event), "stored record", raw_arrays=True)
    except NotJsonError:
        raise EventError(f"event record is not losslessly JSON-serializable: {_brief(event)}") from None
    return adopt_event(record)


# -- stored records ------------------------------------------------------------------------


def record_to_event(record: bytes | str | dict[str, Any]) -> Event:
    """Decode one stored event record (a JSON line, or a freshly decoded dict whose
    ownership transfers) into an :class:`Event`: the inverse of
    :func:`~harness.session.event_to_record`.

    A packed chunk row (a storage encoding of several events) is refused: decode it with
    :func:`storage_record_to_events`.

    Raises:
        EventError: invalid JSON, a chunk row, a bad envelope or message.
        SurfaceError: bad surface metadata.
    """
    value = _loads(record) if isinstance(record, (bytes, str)) else record
    if not isinstance(value, dict):
        raise EventError(f"stored record is not a JSON object: {_brief(value)}")
    if is_storage_row(value):
        raise EventError("stored record is a packed chunk row: use storage_record_to_events")
    return adopt_event(value)


def storage_record_to_events(record: bytes | str | dict[str, Any]) -> list[Event]:
    """Decode one stored record, expanding a packed chunk row into its events
    (:func:`~harness.session.decode_storage_record`); a plain record gives one event.

    Raises:
        StorageRowError: a malformed chunk row (``MALFORMED_STORAGE_ROW``).
        EventError: invalid JSON, a bad envelope or message.
        SurfaceError: bad surface metadata.
    """
    value = _loads(record) if isinstance(record, (bytes, str)) else record
    if not isinstance(value, dict):
        raise EventError(f"stored record is not a JSON object: {_brief(value)}")
    return [adopt_event(r) for r in decode_storage_record(value)]


def _loads(line: bytes | str) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise EventError(f"stored record is not valid JSON: {exc}") from exc


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
