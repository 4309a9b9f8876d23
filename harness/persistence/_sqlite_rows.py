"""Event rows of the SQLite schema 17 (reference §3): binding, decoding, scanning.

A *scalar* row is one event: ``type``, ``seq``, ``time``; ``data`` is the JSON text of
the event's ``data`` (compact, UTF-8), or, when that is 4096 bytes or more and its
Zstandard frame (level 3) is smaller, that frame as a BLOB; ``source_event_seqs`` the
varint BLOB of :mod:`harness.persistence._varint` (NULL when absent);
``surface_op`` the JSON text of ``surfaceOp`` (``"append"`` with its quotes);
``ignorable`` 1 for ``ignorable: true``, else NULL.

A *packed* row (``ignorable = 0``, the discriminator) is a run of 3..1024 streamed
chunk deltas of one append batch: ``type`` is the chunk tag (``text-chunks``, ...),
``seq``/``time`` the first member's, ``data`` the JSON of the row's ``data`` object
(at most 1 MiB; compressed as above), the surface columns NULL.

Reading: a row whose *columns* have the wrong types fails the whole read (as the
reference's ``decodeEventRow``); a row whose *content* does not decode (bad JSON,
bad frame, bad varint, a malformed packed row) or does not continue the seq is
handled by :func:`scan_rows`, the reference's torn-tail rule.

``zstandard`` is optional: without it, large data is stored as text (valid schema 17,
just uncompressed) and reading a compressed row raises
:class:`~harness.persistence._zstd.ZstdUnavailableError`.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import orjson

from harness.errors import (
    RecordEncodingError,
    SessionCorruptionError,
    StorageRowError,
    ZstdUnavailableError,
)
from harness.persistence._varint import SAFE_MAX, VarintError, decode_seqs, encode_seqs
from harness.session._chunks import ROW_TAGS, decode_chunk_row, pack_chunk_runs
from harness.session._events import ENVELOPE_KEYS

ZSTD_THRESHOLD: Final = 4096
ZSTD_LEVEL: Final = 3
MAX_MEMBERS: Final = 1024
MAX_PACKED_BYTES: Final = 1_048_576
PACKED: Final = 0  # the ``ignorable`` value that marks a packed row

COLUMNS: Final = "seq, type, time, data, source_event_seqs, surface_op, ignorable"
_INSERT_INTO: Final = "INSERT INTO events (session_id, seq, type, time, data, source_event_seqs, surface_op, ignorable) "
INSERT: Final = _INSERT_INTO + "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
#: A scalar event with ``surfaceOp: "append"`` and nothing else optional: five parameters.
INSERT_APPEND: Final = _INSERT_INTO + """VALUES (?, ?, ?, ?, ?, NULL, '"append"', NULL)"""
#: A scalar event with no optional field: five parameters.
INSERT_PLAIN: Final = _INSERT_INTO + "VALUES (?, ?, ?, ?, ?, NULL, NULL, NULL)"
#: The same two with ``ignorable: true`` (an extension's type, e.g. the SDK sessions' items).
INSERT_APPEND_IGNORABLE: Final = _INSERT_INTO + """VALUES (?, ?, ?, ?, ?, NULL, '"append"', 1)"""
INSERT_PLAIN_IGNORABLE: Final = _INSERT_INTO + "VALUES (?, ?, ?, ?, ?, NULL, NULL, 1)"
_NARROW: Final = {
    (False, False): INSERT_PLAIN,
    (True, False): INSERT_APPEND,
    (False, True): INSERT_PLAIN_IGNORABLE,
    (True, True): INSERT_APPEND_IGNORABLE,
}
SEGMENT_ROWS: Final = 512

Row = tuple[Any, ...]
"""One physical row as read: ``(seq, type, time, data, source_event_seqs, surface_op, ignorable)``."""


class _Malformed(Exception):
    """A row's content does not decode (feeds the torn-tail rule)."""


# -- zstd ------------------------------------------------------------------------------------

_zstd: Any = None
_zstd_lock = threading.Lock()
_local = threading.local()


def _module(required: bool) -> Any:
    """The ``zstandard`` module, imported on first use; ``None`` if it is missing and
    not ``required``."""
    global _zstd
    if _zstd is None:
        with _zstd_lock:
            if _zstd is None:
                try:
                    _zstd = importlib.import_module("zstandard")
                except ImportError as exc:
                    if not required:
                        return None
                    raise ZstdUnavailableError(
                        'this SQLite session database holds Zstandard-compressed rows, which need the optional '
                        'dependency "zstandard": pip install "trio-harness[zstd]"'
                    ) from exc
    return _zstd


def _compress(raw: bytes) -> bytes | None:
    z = _module(required=False)
    if z is None:
        return None
    c = getattr(_local, "c", None)
    if c is None:
        c = _local.c = z.ZstdCompressor(level=ZSTD_LEVEL)
    out: bytes = c.compress(raw)
    return out


def _decompress(blob: bytes, limit: int | None) -> bytes:
    z = _module(required=True)
    d = getattr(_local, "d", None)
    if d is None:
        d = _local.d = z.ZstdDecompressor()
    try:
        if limit is not None:
            size = z.frame_content_size(blob)
            if size > limit:
                raise _Malformed(f"data exceeds {limit} UTF-8 bytes")
            out: bytes = d.decompress(blob, max_output_size=limit)
            if len(out) > limit:
                raise _Malformed(f"data exceeds {limit} UTF-8 bytes")
            return out
        obj = d.decompressobj()
        out = obj.decompress(blob)
        if not obj.eof or obj.unused_data:
            raise _Malformed("data is not one complete Zstandard frame")
        return out
    except z.ZstdError as exc:
        raise _Malformed(f"data does not decompress: {exc}") from exc


def _data_value(raw: bytes) -> str | bytes:
    """The ``data`` column for serialised JSON ``raw``: the text (a ``str``: bound as
    TEXT), or its zstd frame (``bytes``: a BLOB) if it is 4096 bytes or more and the
    frame is smaller. (Keeping orjson's ``bytes`` and casting in SQL is slower: a
    retained ``bytes`` per row costs more than a ``str`` copy.)"""
    if len(raw) >= ZSTD_THRESHOLD:
        packed = _compress(raw)
        if packed is not None and len(packed) < len(raw):
            return packed
    return raw.decode()


def _data_text(value: str | bytes, limit: int | None = None) -> str | bytes:
    """The JSON text of a ``data`` column (decompressed bytes as they are: orjson
    takes bytes, and refuses invalid UTF-8 as it parses)."""
    if isinstance(value, str):
        return value
    return _decompress(value, limit)


# -- binding ---------------------------------------------------------------------------------


def _refuse(sid: str, rec: Any, why: str) -> RecordEncodingError:
    seq = rec.get("seq") if type(rec) is dict else None
    return RecordEncodingError(f'session "{sid}": event seq {seq} cannot be stored: {why}', session_id=sid)


def _dumps(sid: str, rec: Any, value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise _refuse(sid, rec, str(exc)) from exc


_APPEND_JSON: Final = '"append"'


def bind_event(sid: str, rec: Any) -> tuple[Any, ...]:
    """The insert parameters of one scalar event (raises :class:`RecordEncodingError`
    for a record the schema cannot hold exactly)."""
    if type(rec) is not dict:
        raise _refuse(sid, rec, "a stored event must be an object")
    if not rec.keys() <= ENVELOPE_KEYS or "data" not in rec:
        raise _refuse(sid, rec, "its envelope has other keys than type, seq, time, data, surfaceOp, sourceEventSeqs, ignorable, or no data")
    type_, seq, time_ = rec.get("type"), rec.get("seq"), rec.get("time")
    if type(type_) is not str or not type_:
        raise _refuse(sid, rec, "type must be a non-empty string")
    if type(seq) is not int or not 0 <= seq <= SAFE_MAX:
        raise _refuse(sid, rec, "seq must be a non-negative safe integer")
    if type(time_) is not int or not -SAFE_MAX <= time_ <= SAFE_MAX:
        raise _refuse(sid, rec, "time must be a safe integer")
    data = _data_value(_dumps(sid, rec, rec["data"]))
    seqs = None
    if "sourceEventSeqs" in rec:
        sources = rec["sourceEventSeqs"]
        if type(sources) not in (list, tuple):
            raise _refuse(sid, rec, "sourceEventSeqs must be a list")
        try:
            seqs = encode_seqs(sources)
        except TypeError as exc:
            raise _refuse(sid, rec, str(exc)) from exc
    op = None
    if "surfaceOp" in rec:
        raw_op = rec["surfaceOp"]
        op = _APPEND_JSON if raw_op == "append" else _dumps(sid, rec, raw_op).decode()
    ignorable = None
    if "ignorable" in rec:
        if rec["ignorable"] is not True:
            raise _refuse(sid, rec, "ignorable must be true when present")
        ignorable = 1
    return (sid, seq, type_, time_, data, seqs, op, ignorable)


def _bind_run(sid: str, run: list[Any]) -> list[tuple[Any, ...]]:
    """Bind a run of consecutive ``assistant/chunk`` records, packed (bounded)."""
    try:
        stored = pack_chunk_runs(run, max_members=MAX_MEMBERS, max_data_bytes=MAX_PACKED_BYTES)
    except (TypeError, ValueError) as exc:  # a member orjson cannot serialise
        raise RecordEncodingError(f'session "{sid}": a chunk run cannot be stored: {exc}', session_id=sid) from exc
    out: list[tuple[Any, ...]] = []
    for rec in stored:
        if type(rec) is dict and "seq0" in rec and rec.get("type") in ROW_TAGS:
            data = _data_value(_dumps(sid, rec, rec["data"]))
            out.append((sid, rec["seq0"], rec["type"], rec["time0"], data, None, None, PACKED))
        else:
            out.append(bind_event(sid, rec))
    return out


def bind_segments(
    sid: str, records: Sequence[Any], *, pack: bool, narrow: bool = True, size: int = SEGMENT_ROWS
) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
    """The rows of a batch as ``(statement, rows)`` segments to ``executemany`` in
    order, chunk runs packed when ``pack`` (an append batch; never across batches).

    With ``narrow``, the common row (a scalar event without ``sourceEventSeqs``, its
    ``surfaceOp`` absent or ``"append"``, its ``ignorable`` absent or true) binds five
    parameters ``(session_id, seq, type, time, data)`` to :data:`INSERT_APPEND`,
    :data:`INSERT_PLAIN` or their ``_IGNORABLE`` twins, which spell the three constant
    columns as SQL literals (the stored values are the same; binding three fewer
    parameters per row is ~30% of the insert); every other row binds all eight to
    :data:`INSERT`. Segments hold at most
    ``size`` rows: consumed while inserting, each one's rows are still in the CPU cache.
    Without ``narrow``, one segment of eight-parameter :data:`INSERT` rows.

    A generator: a record the schema cannot hold raises :class:`RecordEncodingError`
    when its segment is bound (the caller's transaction then rolls the batch back)."""
    dumps = orjson.dumps
    threshold = ZSTD_THRESHOLD
    top = SAFE_MAX
    append_json = _APPEND_JSON
    sql = INSERT  # the statement of the segment being filled
    rows: list[tuple[Any, ...]] = []
    push = rows.append
    run: list[Any] = []  # consecutive assistant/chunk records: only they can pack
    for rec in records:
        is_dict = type(rec) is dict
        type_ = rec.get("type") if is_dict else None
        if type_ == "assistant/chunk" and pack:
            run.append(rec)
            continue
        before = None
        if run:
            before = _bind_run(sid, run)
            run = []
        row: tuple[Any, ...] | None = None
        target = INSERT
        # The common record, inline: type, seq, time, data [, surfaceOp "append"].
        if is_dict and type(type_) is str and type_:
            # Exactly type, seq, time, data, [surfaceOp "append"], [ignorable true]: the
            # key count and the optional keys' values say which (seq, time and data
            # are read below; a missing one is the general path's verdict).
            n = len(rec)
            append = ignorable = False
            if n == 4:
                fast = True
            elif n == 5:
                append = rec.get("surfaceOp") == "append"
                ignorable = not append and rec.get("ignorable") is True
                fast = append or ignorable
            else:
                append = ignorable = fast = n == 6 and rec.get("surfaceOp") == "append" and rec.get("ignorable") is True
            if fast:
                try:
                    seq = rec["seq"]
                    time_ = rec["time"]
                    data = rec["data"]
                except KeyError:
                    pass
                else:
                    if type(seq) is int and type(time_) is int and 0 <= seq <= top and -top <= time_ <= top:
                        try:
                            raw = dumps(data)
                        except (TypeError, ValueError) as exc:
                            raise _refuse(sid, rec, str(exc)) from exc
                        text = raw.decode() if len(raw) < threshold else _data_value(raw)
                        if narrow:
                            target = _NARROW[append, ignorable]
                            row = (sid, seq, type_, time_, text)
                        else:
                            row = (sid, seq, type_, time_, text, None, append_json if append else None, 1 if ignorable else None)
        if row is None:
            row = bind_event(sid, rec)
        if before is not None:
            for wide in before:
                if sql is not INSERT or len(rows) >= size:
                    if rows:
                        yield sql, rows
                    sql, rows = INSERT, []
                    push = rows.append
                push(wide)
        if target is not sql or len(rows) >= size:
            if rows:
                yield sql, rows
            sql, rows = target, []
            push = rows.append
        push(row)
    if run:
        for wide in _bind_run(sid, run):
            if sql is not INSERT or len(rows) >= size:
                if rows:
                    yield sql, rows
                sql, rows = INSERT, []
                push = rows.append
            push(wide)
    if rows:
        yield sql, rows


def bind_records(sid: str, records: Sequence[Any], *, pack: bool) -> list[tuple[Any, ...]]:
    """The insert parameters of a batch for :data:`INSERT` (eight per row), chunk runs
    packed when ``pack``: :func:`bind_segments` without ``narrow``, as one list."""
    out: list[tuple[Any, ...]] = []
    for _, rows in bind_segments(sid, records, pack=pack, narrow=False, size=len(records) + 1):
        out.extend(rows)
    return out


# -- decoding --------------------------------------------------------------------------------


def check_row(sid: str, row: Row) -> None:
    """The column types of one row (reference ``decodeEventRow``): a violation fails the
    read as :class:`SessionCorruptionError` (not a torn tail)."""
    seq, type_, time_, data, seqs, op, ignorable = row

    def bad(why: str) -> SessionCorruptionError:
        return SessionCorruptionError(f'corrupt session log "{sid}": stored {why}', session_id=sid)

    if type(seq) is not int or not 0 <= seq <= SAFE_MAX:
        raise bad("seq must be a non-negative safe integer")
    if type(type_) is not str or not type_:
        raise bad("type must be a non-empty string")
    if type(time_) is not int or not -SAFE_MAX <= time_ <= SAFE_MAX:
        raise bad("time must be a safe integer")
    if type(data) is not str and type(data) is not bytes:
        raise bad("data must be a string or blob")
    if seqs is not None and type(seqs) is not bytes:
        raise bad("source_event_seqs must be a blob or null")
    if op is not None and type(op) is not str:
        raise bad("surface_op must be a string or null")
    if ignorable is not None and ignorable not in (0, 1):
        raise bad("ignorable must be 0, 1, or null")


def decode_row(row: Row) -> list[dict[str, Any]]:
    """The events of one (type-checked) row; raises :class:`_Malformed` (or
    :class:`ZstdUnavailableError`, which is not about the row)."""
    seq, type_, time_, data, seqs, op, ignorable = row
    if ignorable == PACKED:
        if type_ not in ROW_TAGS:
            raise _Malformed(f"malformed {type_} storage row: packed discriminator requires a chunk tag")
        if seqs is not None or op is not None:
            raise _Malformed(f"malformed {type_} storage row: packed surface fields must be null")
        if type(data) is str and len(data) * 4 > MAX_PACKED_BYTES and len(data.encode()) > MAX_PACKED_BYTES:
            raise _Malformed(f"malformed {type_} storage row: data exceeds {MAX_PACKED_BYTES} UTF-8 bytes")
        try:
            text = _data_text(data, MAX_PACKED_BYTES)
        except _Malformed as exc:
            raise _Malformed(f"malformed {type_} storage row: {exc}") from exc
        try:
            return decode_chunk_row(type_, seq, time_, orjson.loads(text), max_members=MAX_MEMBERS)
        except (orjson.JSONDecodeError, StorageRowError) as exc:
            raise _Malformed(str(exc)) from exc
    try:
        event: dict[str, Any] = {"type": type_, "seq": seq, "time": time_, "data": orjson.loads(_data_text(data))}
        if seqs is not None:
            event["sourceEventSeqs"] = decode_seqs(seqs)
        if op is not None:
            event["surfaceOp"] = "append" if op == _APPEND_JSON else orjson.loads(op)
    except (orjson.JSONDecodeError, VarintError) as exc:
        raise _Malformed(str(exc)) from exc
    if ignorable == 1:
        event["ignorable"] = True
    return [event]


def _try_decode(sid: str, row: Row) -> list[dict[str, Any]] | None:
    check_row(sid, row)
    try:
        return decode_row(row)
    except _Malformed:
        return None


def scan_rows(sid: str, rows: Sequence[Row], base: int = 0) -> tuple[list[dict[str, Any]], int | None]:
    """:func:`scan_batches` of one list of rows."""
    return scan_batches(sid, (rows,), base)


def fetch_batches(cursor: Any, size: int = 256) -> Iterator[list[Row]]:
    """A cursor's rows in batches: decoding each while it is still in cache beats
    ``fetchall`` and a second pass."""
    while True:
        batch = cursor.fetchmany(size)
        if not batch:
            return
        yield batch


def scan_batches(
    sid: str, batches: Iterable[Sequence[Row]], base: int = 0
) -> tuple[list[dict[str, Any]], int | None]:
    """``(events, torn_from)``: the contiguous events from ``base`` on, and the seq of the
    first row that does not decode or does not continue them (``None`` if all do).

    The reference's rule: such a row at or before the last row holding a ``turn/end``
    is committed corruption (:class:`SessionCorruptionError`, ``invalid committed
    physical row at seq N``); after it, the rest is a removable torn tail."""
    events: list[dict[str, Any]] = []
    push = events.append
    loads = orjson.loads
    expected = base
    batches = iter(batches)
    for rows in batches:
        for i, row in enumerate(rows):
            seq, type_, time_, data, seqs, op, ignorable = row
            # The common row, inline: a plain-text scalar event that continues the log.
            if (
                seq == expected
                and ignorable is None
                and seqs is None
                and type(data) is str
                and type(type_) is str
                and type_
                and type(time_) is int
                and -SAFE_MAX <= time_ <= SAFE_MAX
            ):
                try:
                    event = {"type": type_, "seq": seq, "time": time_, "data": loads(data)}
                    if op is not None:
                        event["surfaceOp"] = "append" if op == _APPEND_JSON else loads(op)
                except orjson.JSONDecodeError:
                    pass
                else:
                    push(event)
                    expected += 1
                    continue
            decoded = _try_decode(sid, row)
            if decoded is not None and decoded[0]["seq"] == expected:
                events.extend(decoded)
                expected += len(decoded)
                continue
            # The first issue: fatal if this row or any later one (that decodes) holds a turn/end.
            if _holds_turn_end(decoded) or any(
                _holds_turn_end(_try_decode(sid, later)) for later in _chain(rows[i + 1 :], batches)
            ):
                raise SessionCorruptionError(
                    f"corrupt session log: invalid committed physical row at seq {seq}", session_id=sid
                )
            return events, int(seq)
    return events, None


def _chain(first: Sequence[Row], rest: Iterator[Sequence[Row]]) -> Iterator[Row]:
    yield from first
    for rows in rest:
        yield from rows


def _holds_turn_end(events: list[dict[str, Any]] | None) -> bool:
    return events is not None and any(e["type"] == "turn/end" for e in events)


def covers(sid: str, row: Row, seq: int) -> bool:
    """Whether packed ``row`` reaches ``seq`` (or does not decode: it might, and the
    scan must then fail closed)."""
    if row[6] != PACKED or row[1] not in ROW_TAGS:
        return False
    check_row(sid, row)
    try:
        return bool(decode_row(row)[-1]["seq"] >= seq)
    except _Malformed:
        return True


def next_seq_of_tail(sid: str, tail: Sequence[Row]) -> int:
    """The stored next seq from the last (at most three) physical rows, newest first
    (``ORDER BY seq DESC LIMIT 3``): 0 for none. Only the packed row right before the
    last two can overlap them in a valid log; a tail that does not decode is
    :class:`SessionCorruptionError` (fail closed before an append)."""
    if not tail:
        return 0
    rows = list(tail[::-1])
    if len(rows) == 3 and not covers(sid, rows[0], rows[1][0]):
        rows = rows[1:]
    events, torn = scan_rows(sid, rows, int(rows[0][0]))
    if torn is not None or not events:
        raise SessionCorruptionError(
            f"session {sid} has an invalid physical tail at seq {torn if torn is not None else rows[0][0]}",
            session_id=sid,
        )
    return int(events[-1]["seq"]) + 1

