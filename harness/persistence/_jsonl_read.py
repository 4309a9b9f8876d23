"""The JSONL backend's reads: headers, a whole log with the torn-tail rule
(reference §1.5), the resume fast path's lines, the revision and the raw bytes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs
import orjson

from harness.errors import (
    PersistedSessionNotFoundError,
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    StorageRowError,
)
from harness.persistence._backend import (
    StoredLines,
    StoredLog,
    check_header_record,
)
from harness.persistence._jsonl_layout import _duplicate, _JsonlLayout
from harness.persistence._zstd import (
    ZstdCodec,
    check_header_frame,
    read_header_frame,
    scan_frames,
)
from harness.session import decode_storage_record, gc_paused
from harness.session._chunks import ROW_TAGS
from harness.session._json import ABSENT, js_string

T = TypeVar("T")


class _JsonlReading(_JsonlLayout):
    """The reading part of :class:`~harness.persistence._jsonl.JsonlBackend`."""

    # -- reading ---------------------------------------------------------------------------

    def list_headers(self) -> list[dict[str, Any]]:
        """Headers of every stored session, reading only each header (reference §1.5).

        Skips session directories without a transcript, with an empty or incomplete
        first line (zstd: first frame) or with a first line that is not a valid header.
        Refuses a header that does not name its file, an id in two project directories
        (:class:`SessionCorruptionError`), the other encoding and flat-layout files
        (:class:`StorageLayoutError`), and a zstd header frame that does not decode."""
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        self._check_root()
        for project in self._project_dirs():
            for sdir in self._session_dirs(project):
                if (sdir / self._opposite).exists():
                    raise self._encoding_mismatch(sdir / self._opposite)
                path = sdir / self.transcript
                first = self._first_line(path)
                if first is None:
                    continue
                try:
                    header = check_header_record(_header_value(first), None)
                except Exception:
                    continue
                expected = self.log_path(header)
                if expected != path and not _same_file(expected, path):
                    raise SessionCorruptionError(
                        f'corrupt session log "{path}": header id "{header["id"]}" and cwd identify "{expected}"',
                        session_id=header["id"],
                    )
                if header["id"] in seen:
                    raise _duplicate(header["id"])
                seen.add(header["id"])
                out.append(header)
        return out

    def _first_line(self, path: Path) -> bytes | None:
        """The transcript's header line without its newline; ``None`` if there is no
        transcript or no complete first line (zstd: first frame) yet."""
        try:
            with open(path, "rb") as f:
                if self._codec is not None:
                    return read_header_frame(self._codec, f)
                first = f.readline()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        return first[:-1] if first.endswith(b"\n") else None

    def load(self, session_id: str) -> StoredLog:
        """Read and scan a log (reference §1.5); raises if absent or corrupt."""
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        data, revision = _read_stable(path, Path.read_bytes)
        good = self._torn.get(session_id)
        if good is not None and len(data) > good:
            # A failed append whose rollback failed left bytes past ``good``: they
            # were never acknowledged. Read the log as if they were cut, and report
            # them as a torn tail so that a repair cuts them before anything lands.
            stored = self._read(session_id, path, data[:good], revision)
            if stored.truncate_to is None:
                stored = attrs.evolve(stored, truncate_to=good)
                if self._codec is not None:
                    self._recovered[session_id] = (good, stored.revision, b"")
            return stored
        return self._read(session_id, path, data, revision)

    def load_lines(self, session_id: str) -> StoredLines | None:
        """The resume fast path's read (decision 0010): the header checked, the event
        lines split but not decoded. ``None`` where only :meth:`load`'s rules apply: a
        log with unacknowledged bytes from a failed rollback, a Zstandard log whose
        frames do not all decode into whole lines (a torn final frame included). Raises
        as :meth:`load` does for an absent log or a bad header."""
        if session_id in self._torn:
            return None
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        if self._codec is not None:
            data, revision = _read_stable(path, Path.read_bytes)
            return self._zstd_lines(session_id, path, data, self._codec, revision)
        (lines, size), revision = _read_stable(path, _read_lines)
        if len(lines) < 2:
            return None  # no newline: load() names the corruption
        header = self._header(session_id, path, lines[0])
        del lines[0]
        fragment = lines.pop()
        return StoredLines(header, lines, size - len(fragment) if fragment else None, revision)

    def _zstd_lines(self, session_id: str, path: Path, data: bytes, codec: ZstdCodec, revision: str) -> StoredLines | None:
        try:
            frames, torn_start = scan_frames(data)
            if not frames or torn_start is not None:
                return None
            plaintexts = codec.decode_frames(data, frames)
            check_header_frame(plaintexts[0])
        except SessionCorruptionError:
            return None  # load() names it
        header = self._header(session_id, path, plaintexts[0][:-1])
        body = b"".join(plaintexts[1:])
        del plaintexts, data
        lines = body.split(b"\n")
        del body
        if lines.pop():
            return None  # a complete frame ending inside a line: load() refuses it
        self._recovered.pop(session_id, None)  # as load() does for a log with no torn frame
        return StoredLines(header, lines, None, revision)

    def _read(self, session_id: str, path: Path, data: bytes, revision: str) -> StoredLog:
        if self._codec is None:
            return self._scan(session_id, path, data, revision)
        return self._scan_zstd(session_id, path, data, self._codec, revision)

    def _header(self, session_id: str, path: Path, line: bytes) -> dict[str, Any]:
        """Parse and check the header line (no newline), then the file's identity.
        A format refusal names the file: `` (raw log: <path>)`` (reference §2.9)."""
        try:
            raw_header = _header_value(line)
        except (orjson.JSONDecodeError, ValueError):
            raise SessionCorruptionError(
                "corrupt session log: header line is not valid JSON", session_id=session_id
            ) from None
        try:
            header = check_header_record(raw_header, session_id)
        except SessionFormatUnsupportedError as exc:
            raise SessionFormatUnsupportedError(
                f"{exc.message} (raw log: {path})", session_id=exc.session_id, location=str(path)
            ) from None
        if header["id"] != session_id:
            raise SessionCorruptionError(
                f'corrupt session log "{path}": requested id "{session_id}" does not match header id "{header["id"]}"',
                session_id=session_id,
            )
        expected_path = self.log_path(header)
        if expected_path != path and not _same_file(expected_path, path):
            raise SessionCorruptionError(
                f'corrupt session log "{path}": header id "{header["id"]}" and cwd identify "{expected_path}"',
                session_id=session_id,
            )
        return header

    def _scan(self, session_id: str, path: Path, data: bytes, revision: str) -> StoredLog:
        nl = data.find(b"\n")
        if nl < 0:
            raise SessionCorruptionError("empty or header-less session log", session_id=session_id)
        header = self._header(session_id, path, data[:nl])
        size = len(data)
        lines = data.split(b"\n")  # splitting the whole buffer spares a copy of it
        del lines[0]  # the header line, read above
        fragment = lines.pop()  # after the last newline: b"" or a torn fragment
        with gc_paused():
            records = _fast_scan(lines)
            if records is not None:
                committed = size - len(fragment)
            else:
                records, committed = _slow_scan(session_id, lines, nl + 1)
        truncate_to = committed if committed < size else None
        return StoredLog(header, records, truncate_to, revision)

    def _scan_zstd(self, session_id: str, path: Path, data: bytes, codec: ZstdCodec, revision: str) -> StoredLog:
        """The zstd reading rules (reference §1.3, §1.5 rule 5): every complete frame
        must decode (checksums verified) and end on a record boundary with no issue;
        only a torn final frame is repairable. Its complete lines that continue the
        log are kept (``truncate_to`` is its start; the repair writes them back)."""
        try:
            frames, torn_start = scan_frames(data)
            if not frames:
                raise SessionCorruptionError("empty or header-less Zstandard session log")
            plaintexts = codec.decode_frames(data, frames)
            check_header_frame(plaintexts[0])
        except SessionCorruptionError as exc:
            exc.session_id = session_id
            raise
        header = self._header(session_id, path, plaintexts[0][:-1])
        body = b"".join(plaintexts[1:])
        del plaintexts
        lines = body.split(b"\n")
        fragment = lines.pop()
        with gc_paused():
            records = _fast_scan(lines)
            if records is None:
                records, committed = _slow_scan(session_id, lines, 0)
            else:
                committed = len(body) - len(fragment)
            if committed != len(body):
                raise SessionCorruptionError(
                    "corrupt Zstandard session log: complete frame contains a torn JSONL record",
                    session_id=session_id,
                )
            if torn_start is None:
                self._recovered.pop(session_id, None)
                return StoredLog(header, records, None, revision)
            # Best effort: a frame torn early may yield no plaintext at all.
            tail = codec.decode_prefix(data[torn_start:]).split(b"\n")
            tail.pop()  # no newline after it: not a complete record
            records, kept = _slow_scan(session_id, tail, 0, records=records, first_line=len(lines) + 1)
        self._recovered[session_id] = (torn_start, revision, b"".join(line + b"\n" for line in tail)[:kept])
        return StoredLog(header, records, torn_start, revision)

    def revision(self, session_id: str) -> str | None:
        path = self.locate(session_id)
        if path is None:
            return None
        try:
            return _revision(path)
        except FileNotFoundError:
            return None

    def read_raw(self, session_id: str) -> bytes | None:
        """The stored JSONL text verbatim (reference ``readRaw``): the file's bytes, or
        for zstd its complete frames decoded (a torn final frame omitted). ``None`` if
        the session has no transcript. The header line must name ``session_id``."""
        path = self.locate(session_id)
        if path is None:
            return None
        data, _ = _read_stable(path, Path.read_bytes)
        if self._codec is not None:
            frames, _ = scan_frames(data)
            if not frames:
                raise SessionCorruptionError("empty or header-less Zstandard session log", session_id=session_id)
            data = b"".join(self._codec.decode_frames(data, frames))
        try:
            nl = data.find(b"\n")
            header = check_header_record(_header_value(data[: nl if nl >= 0 else len(data)]), None)
        except Exception:
            header = None
        if header is None or header["id"] != session_id:
            raise SessionCorruptionError(
                f'corrupt session log: invalid header line in "{path}"', session_id=session_id
            )
        return data


_BAD: Final[Any] = object()


def _fast_scan(lines: list[bytes]) -> list[Any] | None:
    """The common case, in one tight pass: every line one plain event, seqs 0..n-1.
    ``None`` if anything is off (then :func:`_slow_scan` applies the exact rules)."""
    loads = orjson.loads
    records: list[Any] = []
    push = records.append
    try:
        # Checked as decoded, while each object is still in cache.
        for i, line in enumerate(lines):
            obj = loads(line)
            if type(obj) is not dict or obj.get("seq") != i or obj.get("type") in ROW_TAGS:
                return None
            push(obj)
    except orjson.JSONDecodeError:
        return None
    # A boolean seq equals 0 or 1 in Python but continues nothing in the reference's
    # ``===``: only the first two lines can hold one unnoticed above.
    if (records and records[0]["seq"] is False) or (len(records) > 1 and records[1]["seq"] is True):
        return None
    return records


def _slow_scan(
    session_id: str, lines: list[bytes], start: int, *, records: list[Any] | None = None, first_line: int = 1
) -> tuple[list[Any], int]:
    """The reading rules of reference §1.5, line by line (rows, bad lines, gaps).

    ``lines`` start at byte ``start`` and are numbered from ``first_line``, counting
    event lines as the reference does (the first line after the header is line 1); the
    good ones extend ``records``. Returns the
    records and where the last good line ends."""
    if records is None:
        records = []
    committed = start
    pos = start
    issue: str | None = None
    loads = orjson.loads
    for k, line in enumerate(lines):
        line_no = k + first_line
        pos += len(line) + 1
        obj: Any
        try:
            obj = loads(line)
        except orjson.JSONDecodeError:
            obj = _BAD
        decoded = _decode(obj)
        if issue is None:
            if decoded is None:
                issue = f"corrupt session log: unparsable committed event at line {line_no}"
            else:
                expected = len(records)
                k_bad = next((j for j, e in enumerate(decoded) if not _is_seq(e.get("seq"), expected + j)), None)
                if k_bad is None:
                    records.extend(decoded)
                    committed = pos
                    continue
                issue = (
                    f"corrupt session log: seq gap in committed region at line {line_no} "
                    f"(expected {expected + k_bad}, got {js_string(decoded[k_bad].get('seq', ABSENT))})"
                )
        if decoded is not None and any(e.get("type") == "turn/end" for e in decoded):
            raise SessionCorruptionError(issue, session_id=session_id)
    return records, committed


def _is_seq(value: Any, expected: int) -> bool:
    """``value === expected`` as the reference compares: ``1.0`` is ``1``, ``true`` is not."""
    return value == expected and type(value) is not bool


def _decode(obj: Any) -> list[dict[str, Any]] | None:
    """A stored record's events, or None if it is not a valid record."""
    if obj is _BAD:
        return None
    try:
        decoded = decode_storage_record(obj)
    except StorageRowError:
        return None
    if not all(type(e) is dict for e in decoded):
        return None
    return decoded


def _header_value(line: bytes) -> Any:
    """The header line (no newline) decoded as the reference's ``JSON.parse`` would:
    a ``-0`` number literal stays negative zero (``-0.0``; orjson reads it as the
    integer ``0``), so the header checks refuse it where the reference does."""
    value = orjson.loads(line)
    if b"-0" in line:  # rare: only then is the slower decoder needed
        value = json.loads(line, parse_int=_int_or_negative_zero)
    return value


def _int_or_negative_zero(literal: str) -> int | float:
    return -0.0 if literal == "-0" else int(literal)


def _revision(path: Path) -> str:
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _read_stable(path: Path, read: Callable[[Path], T]) -> tuple[T, str]:
    """What ``read`` makes of the file (``Path.read_bytes``: its bytes) and the revision it
    belongs to. The revision is the stat taken *before* the read, kept only when the
    stat after it is the same: a revision taken after decoding could pair old bytes
    with a newer file (another process appending meanwhile), and the revision checks
    before a write would then miss that append. A file still moving after ten tries is
    returned with the stat from before its last read, which a later revision check sees
    as moved."""
    for _ in range(10):
        before = _revision(path)
        data = read(path)
        if _revision(path) == before:
            break
    return data, before


def _read_lines(path: Path, chunk_size: int = 1 << 20) -> tuple[list[bytes], int]:
    """The file split at newlines (the last item is what follows the last newline) and
    its byte count, read a chunk at a time: the whole file never sits in one buffer,
    which on a 45 MB log spares ~20 ms of fresh pages and a copy."""
    lines: list[bytes] = []
    size = 0
    carry = b""
    with open(path, "rb", buffering=0) as f:
        read, extend = f.read, lines.extend
        while chunk := read(chunk_size):
            size += len(chunk)
            parts = chunk.split(b"\n")
            if carry:
                parts[0] = carry + parts[0]
            carry = parts.pop()
            extend(parts)
    lines.append(carry)
    return lines, size


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False
