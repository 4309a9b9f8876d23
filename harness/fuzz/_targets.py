"""Targets of the coverage-guided fuzzer: bytes in, and either a typed
:class:`~harness.errors.HarnessError` or a restored session out.

Each target does what a load does with stored bytes: the backend's reader (the JSONL
scanner with its torn-tail rule, or the SQLite row scanner), then the coordinator's
checks (legacy and unknown types, crash-repair closers) and the restore. Any other
exception escaping a target is a crash: the fuzzer stops and keeps the input.

The SQLite rows are not read from a database file (the SQLite library is not what is
under test): an input is JSON lines, one row each, ``[seq, type, time, data,
source_event_seqs, surface_op, ignorable]`` with blobs written ``{"b": "<hex>"}``; a line
that does not parse becomes a row whose ``data`` blob is the line itself. The corpus
(``tests/fuzz_corpus/sqlite_rows``) holds rows of real databases in this form.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson

from harness.errors import HarnessError, SessionCorruptionError
from harness.fuzz._budget import TARGETS
from harness.persistence._coordinator import build_session
from harness.persistence._jsonl import JsonlBackend
from harness.persistence._service import refuse_legacy
from harness.persistence._sqlite_rows import Row, scan_rows
from harness.session import KNOWN_EVENT_TYPES, Session, closers_for_records, event_to_record, thaw

SID: Final = "fuzz"
HEADER: Final = {"version": 0, "id": SID, "createdAt": 1, "delegationDepth": 0}


def restore(records: list[Any], header: dict[str, Any]) -> Session | None:
    """The coordinator's load, after the backend read (``Persistence._check_and_repair``
    and ``build_session``): typed errors only; ``None`` for a log it refuses."""
    for rec in records:
        refuse_legacy(SID, rec)
        t = rec.get("type") if type(rec) is dict else None
        if type(t) is str and t not in KNOWN_EVENT_TYPES and rec.get("ignorable") is not True:
            return None  # the coordinator refuses the log (SessionFormatUnsupportedError)
    try:
        closers = [event_to_record(e) for e in closers_for_records(records)]
    except HarnessError:
        raise
    except Exception as exc:
        # The coordinator wraps these too (its ``except Exception``): the scan of an
        # invalid log, reported as corruption. Kept identical here.
        raise SessionCorruptionError(f"closers: {exc}", session_id=SID) from exc
    return build_session(SID, header, records + closers)


def _state(session: Session) -> list[Any]:
    # Every event but the end-seed the restore appends (its time is the clock's).
    return [
        (e.type, e.seq, e.time, thaw(e.data), e.surface_op, e.source_event_seqs, e.ignorable)
        for e in session.events[:-1]
    ]


def check_fast_read(backend: JsonlBackend, general: Session | None, truncate_to: int | None) -> None:
    """The resume's fast read (decision 0010) of the same bytes: when it yields a
    session, the general reader must have yielded an equal one, with the same torn
    tail. A mismatch is a crash (``AssertionError``)."""
    try:
        lines = backend.load_lines(SID)
        fast = (
            None
            if lines is None
            else Session.restore_stored_lines(SID, lines.lines, lines.header, KNOWN_EVENT_TYPES)
        )
    except HarnessError:
        return  # the coordinator falls back to the general reader
    if fast is None:
        return
    assert lines is not None
    if general is None or _state(fast) != _state(general) or lines.truncate_to != truncate_to:
        raise AssertionError("the resume's fast read differs from the general reader")


class JsonlTarget:
    """A whole JSONL transcript (header line included) read by :class:`JsonlBackend`."""

    def __init__(self, compression: str = "none") -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="harness-fuzz-")
        self.root = Path(self._dir.name)
        self.compression = compression
        backend = JsonlBackend(self.root, compression=compression)  # type: ignore[arg-type]
        self.path = backend.log_path(HEADER)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, data: bytes) -> None:
        self.path.write_bytes(data)
        backend = JsonlBackend(self.root, compression=self.compression)  # type: ignore[arg-type]
        general: Session | None = None
        truncate_to: int | None = None
        try:
            stored = backend.load(SID)
            truncate_to = stored.truncate_to
            general = restore(list(stored.records), dict(stored.header))
        except HarnessError:
            general = None
        check_fast_read(backend, general, truncate_to)

    def close(self) -> None:
        self._dir.cleanup()


def _column(value: Any) -> Any:
    if type(value) is dict and type(value.get("b")) is str:
        try:
            return bytes.fromhex(value["b"])
        except ValueError:
            return value["b"].encode("utf-8", "surrogatepass")
    return value


def parse_rows(data: bytes) -> list[Row]:
    rows: list[Row] = []
    for i, line in enumerate(data.split(b"\n")):
        if not line:
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            value = None
        if type(value) is list and len(value) == 7:
            rows.append(tuple(_column(v) for v in value))
        else:
            rows.append((i, "feedback/record", 0, line, None, None, None))
    return rows


def sqlite_rows(data: bytes) -> None:
    """Rows as the SQLite backend reads them, through ``scan_rows`` and the restore."""
    rows = parse_rows(data)
    try:
        events, _torn = scan_rows(SID, rows)
        restore(events, dict(HEADER))
    except HarnessError:
        pass


def row_line(row: Row) -> bytes:
    """One row in the corpus form (the inverse of :func:`parse_rows`)."""
    return orjson.dumps([{"b": v.hex()} if type(v) is bytes else v for v in row])


def make_target(name: str) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    """The target called ``name`` and its cleanup."""
    if name == "jsonl":
        t = JsonlTarget()
        return t, t.close
    if name == "jsonl-zstd":
        t = JsonlTarget("zstd")
        return t, t.close
    if name == "sqlite-rows":
        return sqlite_rows, lambda: None
    raise ValueError(f"unknown fuzz target {name!r} (one of {', '.join(TARGETS)})")

