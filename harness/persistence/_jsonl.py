"""The JSONL backend, the embedded default: one directory, no server (reference §1).

Layout: ``<root>/--<projectKey(cwd)>--/<encodeSegment(id)>/session.jsonl`` (``_no-cwd``
when a session has no cwd), or ``session.jsonl.zstd`` with ``compression="zstd"``
(reference §1.3, see :mod:`._zstd`). Line 1 is the header; every further line is one
event or one packed chunk row. All methods block: call them from a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import attrs
import orjson

from harness.errors import (
    PersistedSessionNotFoundError,
    PersistenceArgumentError,
    PersistenceError,
    RecordEncodingError,
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    SessionIdInUseError,
    SessionLockedError,
    SessionLogExistsError,
    StorageIOError,
    StorageLayoutError,
    StorageRowError,
)
from harness.persistence._backend import (
    GroupWrite,
    StoredLines,
    StoredLog,
    WriterLease,
    check_header_record,
    header_line,
    unwritten_after_failure,
)
from harness.persistence._files import OsFiles
from harness.persistence._zstd import (
    ZstdCodec,
    check_header_frame,
    load_codec,
    read_header_frame,
    scan_frames,
)
from harness.session import MAX_SESSION_ID_BYTES, decode_storage_record, gc_paused, pack_chunk_runs
from harness.session._chunks import ROW_TAGS

T = TypeVar("T")

TRANSCRIPT: Final = "session.jsonl"
TRANSCRIPT_ZSTD: Final = "session.jsonl.zstd"
COMPRESSIONS: Final = ("none", "zstd")
#: The reference's ``compression`` option: ``"zstd"`` needs the optional ``zstandard``.
Compression = Literal["none", "zstd"]
LOCKFILE: Final = "writer.lock"
ROOT_LOCKFILE: Final = ".root.lock"  # not a directory: listing and lookup skip it
ROOT_LOCK_TIMEOUT: Final = 10.0
"""Seconds a first write waits for the root lock while no other creation takes it."""
_MARK_BYTES: Final = 8


class _RootMutex:
    """The threads of this process that want one root's lock queue here, blocked, so
    at most one of them polls the ``flock`` (hundreds of sessions created at once
    would otherwise each poll it, and starve the holder of the CPU and the GIL).
    ``taken`` counts acquisitions: a waiter times out only while it does not move."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken = 0


# Weak: an entry lives while some thread is inside the root lock (or waits for it).
_ROOT_MUTEXES: weakref.WeakValueDictionary[str, _RootMutex] = weakref.WeakValueDictionary()
_ROOT_MUTEXES_GUARD = threading.Lock()


def _root_mutex(root: Path) -> _RootMutex:
    with _ROOT_MUTEXES_GUARD:
        mutex = _ROOT_MUTEXES.get(str(root))
        if mutex is None:
            mutex = _ROOT_MUTEXES[str(root)] = _RootMutex()
        return mutex


def _lock_mark(fd: int) -> bytes:
    """The root lock file's progress mark (see ``JsonlBackend._root_lock``)."""
    try:
        return os.pread(fd, _MARK_BYTES, 0)
    except OSError:
        return b""


_SAFE: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def _escape(ch: str, out: list[str]) -> None:
    if ch in _SAFE:
        out.append(ch)
        return
    units = ch.encode("utf-16-be")  # one ~XXXX per UTF-16 code unit, like the reference
    for i in range(0, len(units), 2):
        out.append(f"~{units[i]:02X}{units[i + 1]:02X}")


def encode_segment(value: str) -> str:
    """Injective path segment: ``[A-Za-z0-9._-]`` literal, every other UTF-16 unit
    (``~`` included) as ``~XXXX``; ``.`` and ``..`` encoded whole."""
    if value == "":
        raise ValueError("cannot encode an empty path segment")
    if value == ".":
        return "~002E"
    if value == "..":
        return "~002E~002E"
    out: list[str] = []
    for ch in value:
        _escape(ch, out)
    return "".join(out)


def project_key(cwd: str) -> str:
    """``--<slug>--`` for a cwd: runs of ``/ \\ :`` become ``-`` (lossy on purpose)."""
    if cwd == "":
        raise ValueError("cannot encode an empty project path")
    out: list[str] = []
    in_sep = False
    for ch in cwd:
        if ch in "/\\:":
            if not in_sep:
                out.append("-")
            in_sep = True
            continue
        in_sep = False
        _escape(ch, out)
    slug = "".join(out).lstrip("-") or "root"
    return f"--{slug[:251]}--"


def _suffix(compression: str) -> str:
    return ".jsonl.zstd" if compression == "zstd" else ".jsonl"


class JsonlBackend:
    """Sessions as JSONL files under ``root``. Blocking; thread-compatible per session.

    Durability: the first write of a session is atomic (temp file, fsync, link without
    overwrite, fsync of the directory); later writes are whole batches followed by
    fsync, rolled back by truncation if the write or the fsync fails. One live writer
    per session across processes: :meth:`acquire_writer` takes an exclusive ``flock``
    on ``writer.lock`` in the session directory (released by the OS if the process dies;
    never unlinked, so every process locks the same inode). One id per root: a first
    write checks, under the ``flock`` on ``<root>/.root.lock``, that no project
    directory holds the id yet.

    Encodings (reference §1.3): ``compression="none"`` (the default here) writes plain
    ``session.jsonl``; ``"zstd"`` writes ``session.jsonl.zstd``, one checksummed
    Zstandard frame for the header and one per batch (needs the optional
    ``zstandard`` package: :class:`~harness.persistence._zstd.ZstdUnavailableError` at
    construction without it). A root holds one encoding: an artifact of the other one,
    or of the obsolete flat layout, is refused with :class:`StorageLayoutError`.

    Every mutating file operation goes through ``files`` (see :mod:`._files`); reads
    are direct. A failed rollback or a failed directory fsync is remembered by this
    instance and settled by its next write to that session (see :meth:`append`,
    :meth:`materialize`).
    """

    name = "jsonl"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        files: OsFiles | None = None,
        pack_chunks: bool = True,
        compression: Compression = "none",
    ) -> None:
        if compression not in COMPRESSIONS:
            raise PersistenceArgumentError(
                f'JSONL compression must be "none" or "zstd", got {compression!r}'
            )
        self.root = Path(root).resolve()
        self.files = files or OsFiles()
        self.pack_chunks = pack_chunks
        self.compression: Compression = compression
        self._codec: ZstdCodec | None = load_codec() if compression == "zstd" else None
        self.transcript = TRANSCRIPT_ZSTD if compression == "zstd" else TRANSCRIPT
        self._opposite = TRANSCRIPT if compression == "zstd" else TRANSCRIPT_ZSTD
        self._root_checked = False
        self._paths: dict[str, Path] = {}
        # id -> known-good size: a failed rollback left bytes after it (see append)
        self._torn: dict[str, int] = {}
        # id -> (path, inode, records): linked, but the directory fsync failed
        self._unsynced_links: dict[str, tuple[Path, int, int]] = {}
        self._dirs_to_sync: set[Path] = set()
        # zstd: id -> (torn frame start, revision, complete lines recovered from it),
        # from the last load; the repair writes them back (see commit_repair)
        self._recovered: dict[str, tuple[int, str, bytes]] = {}

    # -- layout --------------------------------------------------------------------------

    def session_dir(self, header: dict[str, Any]) -> Path:
        cwd = header.get("cwd")
        project = "_no-cwd" if cwd is None else project_key(cwd)
        return self.root / project / encode_segment(header["id"])

    def log_path(self, header: dict[str, Any]) -> Path:
        """Where the transcript of the session ``header`` describes is (or would be):
        the reference's ``locate(meta)``. No I/O."""
        return self.session_dir(header) / self.transcript

    def locate(self, session_id: str) -> Path | None:
        """The transcript path of an existing session (scans every project dir).

        Raises :class:`SessionCorruptionError` if the id appears in more than one
        project directory, :class:`StorageLayoutError` for a flat-layout file of the id
        or a transcript of the other encoding."""
        cached = self._paths.get(session_id)
        if cached is not None and cached.exists():
            return cached
        self._check_root()
        found = self._transcripts(session_id)
        if len(found) > 1:
            raise _duplicate(session_id)
        if not found:
            return None
        self._paths[session_id] = found[0]
        return found[0]

    def _project_dirs(self) -> list[Path]:
        try:
            with os.scandir(self.root) as it:
                return sorted(Path(e.path) for e in it if e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _session_dirs(self, project: Path) -> list[Path]:
        """The session directories of a project directory; refuses flat-layout files."""
        try:
            with os.scandir(project) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError):
            return []
        for e in entries:
            if (e.name.endswith(".jsonl") or e.name.endswith(".jsonl.zstd")) and e.is_file(follow_symlinks=False):
                raise self._flat_layout(Path(e.path))
        return sorted(Path(e.path) for e in entries if e.is_dir())

    def _check_root(self) -> None:
        """Once per instance (until it passes): no session directory of the root holds
        a transcript of the other encoding, no project directory a flat-layout file."""
        if self._root_checked:
            return
        for project in self._project_dirs():
            for sdir in self._session_dirs(project):
                if (sdir / self._opposite).exists():
                    raise self._encoding_mismatch(sdir / self._opposite)
        self._root_checked = True

    def _encoding_mismatch(self, path: Path) -> StorageLayoutError:
        other = "none" if self.compression == "zstd" else "zstd"
        return StorageLayoutError(
            f"session artifact {_quote(path)} uses {_suffix(other)}, but this backend is configured for "
            f"compression {_quote(self.compression)}; use a separate root or select the matching compression mode"
        )

    @staticmethod
    def _flat_layout(path: Path) -> StorageLayoutError:
        return StorageLayoutError(
            f"session artifact {_quote(path)} uses the unsupported flat-file layout; "
            "use a separate root or move it into a project/session directory before loading"
        )

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
                f"{exc.message} (raw log: {path})", session_id=exc.session_id
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

    # -- writing ---------------------------------------------------------------------------

    def _encode(self, session_id: str, records: list[dict[str, Any]]) -> bytes:
        """The batch as JSONL bytes, or :class:`RecordEncodingError` naming the first
        record that cannot be stored (never a raw ``TypeError`` from orjson)."""
        dumps = orjson.dumps
        try:
            rows = pack_chunk_runs(records) if self.pack_chunks else records
            # Not OPT_APPEND_NEWLINE, although it spares a copy per line: orjson's own
            # output buffers, kept alive together until the join, are malloc blocks
            # (not pymalloc), and a 100k-record batch then wrote 2x slower (W5-write).
            return b"".join(dumps(r) + b"\n" for r in rows)
        except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
            raise _encoding_error(session_id, records, exc) from exc

    def _batch_payload(self, session_id: str, records: list[dict[str, Any]], prefix: bytes = b"") -> bytes:
        """One batch as it is appended: its lines (after ``prefix``, lines already
        encoded), or with zstd one frame holding them. ``b""`` for nothing."""
        text = prefix + self._encode(session_id, records) if records else prefix
        if self._codec is None or not text:
            return text
        return self._codec.frame(text)

    def _first_payload(self, header: dict[str, Any], records: list[dict[str, Any]]) -> bytes:
        """The first write: the header line and the first batch (zstd: the header alone
        in frame 1, the batch in frame 2)."""
        line = header_line(header)
        if self._codec is None:
            return line + self._encode(header["id"], records)
        return self._codec.frame(line) + self._batch_payload(header["id"], records)

    def materialize(
        self, header: dict[str, Any], records: list[dict[str, Any]], *, lease: WriterLease | None = None
    ) -> None:
        """First write: header + first batch become visible atomically; never overwrites.

        The id must be new under the whole root (any project directory): checked under
        the root lock, so two processes cannot both create it. A retry after a failed
        directory fsync recognises the log this backend linked itself and completes it.
        ``lease`` is accepted for protocol symmetry (the ``flock`` is the exclusion).
        """
        sid = header["id"]
        sdir = self.session_dir(header)
        final = sdir / self.transcript
        payload = self._first_payload(header, records)
        self._check_root()
        try:
            self._makedirs(sdir)
            with self._root_lock(sid):
                if self._finish_unsynced_link(sid, header, final, records):
                    return
                self._refuse_existing(sid, final)
                self._link_new(sid, sdir, final, payload, len(records))
        except OSError as exc:
            raise StorageIOError(f'writing session "{sid}" to "{final}" failed: {exc}', session_id=sid) from exc
        self._paths[sid] = final

    def _refuse_existing(self, sid: str, final: Path) -> None:
        for path in self._transcripts(sid):
            if path == final:
                raise SessionLogExistsError(
                    f'refusing to materialize "{sid}": a log already exists on disk (load/resume it instead)',
                    session_id=sid,
                )
            raise SessionIdInUseError(
                f'refusing to materialize "{sid}" at "{final}": a session with this id already exists '
                f'at "{path}" (ids are unique under a store root; load/resume it or choose another id)',
                session_id=sid,
                path=str(path),
            )

    def _link_new(self, sid: str, sdir: Path, final: Path, payload: bytes, n_records: int) -> None:
        tmp = sdir / f"{final.name}.{secrets.token_hex(6)}.tmp"
        fd = self.files.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                self.files.write(fd, payload)
                self.files.fsync(fd)
            finally:
                self.files.close(fd)
            try:
                self.files.link(str(tmp), str(final))
            except FileExistsError:
                raise SessionLogExistsError(
                    f'refusing to materialize "{sid}": a log already exists on disk (load/resume it instead)',
                    session_id=sid,
                ) from None
            # From here the log is ours even if the directory fsync fails: remember it,
            # so that the retry finishes the job instead of refusing "our" file.
            self._unsynced_links[sid] = (final, os.stat(final).st_ino, n_records)
            self.files.fsync_dir(str(sdir))
            del self._unsynced_links[sid]
        finally:
            with contextlib.suppress(OSError):
                self.files.unlink(str(tmp))

    def _finish_unsynced_link(
        self, sid: str, header: dict[str, Any], final: Path, records: list[dict[str, Any]]
    ) -> bool:
        """Complete a first write whose link landed but whose directory fsync failed:
        if ``final`` is still the inode we linked and holds exactly the header and the
        first ``n`` records of this (retried) batch, fsync the directory again and
        append the rest. False if there is no such write to complete."""
        entry = self._unsynced_links.get(sid)
        if entry is None:
            return False
        path, ino, n = entry
        try:
            same = path == final and final.stat().st_ino == ino and len(records) >= n
        except FileNotFoundError:
            same = False
        expected = self._first_payload(header, records[:n]) if same else b""
        if not same or final.read_bytes() != expected:
            del self._unsynced_links[sid]  # not ours any more: the normal refusal applies
            return False
        self.files.fsync_dir(str(final.parent))
        del self._unsynced_links[sid]
        self._paths[sid] = final
        if len(records) > n:
            self._append_bytes(sid, final, self._batch_payload(sid, records[n:]))
        return True

    def append(self, session_id: str, records: list[dict[str, Any]], *, lease: WriterLease | None = None) -> None:
        """Append one batch and fsync; on failure truncate back and raise.

        If a rollback itself failed earlier, the torn bytes it left are truncated (and
        fsynced) first; while that fails, appends fail closed rather than land behind
        garbage that a later load would cut off as a torn tail.
        """
        if not records:
            return
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        self._append_bytes(session_id, path, self._batch_payload(session_id, records))

    def _append_bytes(self, session_id: str, path: Path, payload: bytes) -> None:
        fd, size = self._open_and_write(session_id, path, payload)
        try:
            try:
                self.files.fsync(fd)
            except OSError as exc:
                raise self._roll_back(session_id, path, fd, size, exc) from exc
        finally:
            with contextlib.suppress(OSError):
                self.files.close(fd)

    def _open_and_write(self, session_id: str, path: Path, payload: bytes) -> tuple[int, int]:
        """Open the log, settle a torn tail, write ``payload``: the open descriptor and
        the size to roll back to. A failed write is rolled back (and raised); the
        caller fsyncs, rolls back a failed fsync (:meth:`_roll_back`) and closes."""
        try:
            fd = self.files.open(str(path), os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            raise StorageIOError(f'opening session "{session_id}" failed: {exc}', session_id=session_id) from exc
        try:
            size = self._settle_torn_tail(session_id, path, fd)
            try:
                self.files.write(fd, payload)
            except OSError as exc:
                raise self._roll_back(session_id, path, fd, size, exc) from exc
        except BaseException:
            with contextlib.suppress(OSError):
                self.files.close(fd)
            raise
        return fd, size

    def _roll_back(self, session_id: str, path: Path, fd: int, size: int, exc: OSError) -> StorageIOError:
        """After a failed write or fsync: truncate back to ``size`` and fsync; the error
        to raise. If that fails too, no append may land behind the bytes left until a
        truncate to ``size`` succeeds (see :meth:`_settle_torn_tail`)."""
        try:
            self.files.ftruncate(fd, size)
            self.files.fsync(fd)
        except OSError as rollback:
            self._torn[session_id] = size
            return StorageIOError(
                f'failed to roll back append to "{path}": {exc}; rollback: {rollback} '
                f"(later appends truncate back to byte {size} first)",
                session_id=session_id,
            )
        return StorageIOError(f'appending to session "{session_id}" failed (rolled back): {exc}', session_id=session_id)

    def write_group(self, writes: Sequence[GroupWrite]) -> list[BaseException | None]:
        """Several sessions' batches as one round (group commit, :func:`write_each`'s
        contract): every append is written, then all of them are fsynced together
        (:meth:`OsFiles.fsync_each`); a batch whose write or fsync failed is rolled back
        by truncation exactly as :meth:`append` rolls back, and fails alone (each fsync
        covers one file). A first write is :meth:`materialize`, unchanged (temp file,
        fsync, link, directory fsync), in its place in the round. Batches of one
        session land in the order given: a session seen again starts a new round, and a
        batch behind a failed batch of its session is not written (it would leave a gap)."""
        results: list[BaseException | None] = [None] * len(writes)
        failed: dict[str, BaseException] = {}
        start = 0
        while start < len(writes):
            seen: set[str] = set()
            end = start
            while end < len(writes) and writes[end].session_id not in seen:
                seen.add(writes[end].session_id)
                end += 1
            todo: list[int] = []
            for i in range(start, end):
                earlier = failed.get(writes[i].session_id)
                if earlier is None:
                    todo.append(i)
                else:  # behind a failed batch of its session: writing it would leave a gap
                    results[i] = unwritten_after_failure(self, writes[i].session_id, earlier)
            self._write_round(writes, todo, results)
            for i in range(start, end):
                err = results[i]
                if err is not None:
                    failed.setdefault(writes[i].session_id, err)
            start = end
        return results

    def _write_round(self, writes: Sequence[GroupWrite], indexes: Sequence[int], results: list[BaseException | None]) -> None:
        written: list[tuple[int, Path, int, int]] = []  # index, path, fd, size before
        try:
            for i in indexes:
                w = writes[i]
                try:
                    if not w.materialized:
                        self.materialize(w.header, w.records, lease=w.lease)
                    elif w.records:
                        path = self.locate(w.session_id)
                        if path is None:
                            raise PersistedSessionNotFoundError(
                                f'session "{w.session_id}" not found', session_id=w.session_id
                            )
                        payload = self._batch_payload(w.session_id, w.records)
                        written.append((i, path, *self._open_and_write(w.session_id, path, payload)))
                except Exception as exc:
                    results[i] = exc
            synced = self.files.fsync_each([fd for _, _, fd, _ in written])
            for (i, path, fd, size), err in zip(written, synced, strict=True):
                if err is not None:
                    rolled = self._roll_back(writes[i].session_id, path, fd, size, err)
                    rolled.__cause__ = err
                    results[i] = rolled
        finally:
            for _, _, fd, _ in written:
                with contextlib.suppress(OSError):
                    self.files.close(fd)

    def _settle_torn_tail(self, session_id: str, path: Path, fd: int) -> int:
        """The size to append at: the file's size, after truncating the bytes a failed
        rollback left behind (if any). Raises (fail closed) if that truncate fails."""
        size = os.fstat(fd).st_size
        good = self._torn.get(session_id)
        if good is None:
            return size
        try:
            if size > good:
                self.files.ftruncate(fd, good)
            self.files.fsync(fd)
        except OSError as exc:
            raise StorageIOError(
                f'session "{session_id}": {size - good} byte(s) of a failed append after byte {good} of '
                f'"{path}" could not be truncated ({exc}); refusing to append behind them',
                session_id=session_id,
            ) from exc
        del self._torn[session_id]
        return min(size, good)

    def commit_repair(
        self,
        session_id: str,
        truncate_to: int | None,
        records: list[dict[str, Any]],
        *,
        lease: WriterLease | None = None,
    ) -> None:
        """Truncate a torn tail (fsync), then append the closers as one batch.

        With zstd, ``truncate_to`` is where a torn final frame starts: the complete
        records the last :meth:`load` recovered from it are written back ahead of the
        closers, in one new frame (reference §1.4). Two durable steps, not atomic: a
        crash between them just re-repairs next time.
        """
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        recovered = b""
        if self._codec is not None and truncate_to is not None:
            recovered = self._recovered_lines(session_id, path, truncate_to)
        payload = self._batch_payload(session_id, records, prefix=recovered)
        if truncate_to is not None:
            try:
                fd = self.files.open(str(path), os.O_WRONLY)
                try:
                    self.files.ftruncate(fd, truncate_to)
                    self.files.fsync(fd)
                finally:
                    with contextlib.suppress(OSError):
                        self.files.close(fd)
            except OSError as exc:
                raise StorageIOError(f'repairing session "{session_id}" failed: {exc}', session_id=session_id) from exc
            good = self._torn.get(session_id)
            if good is not None and truncate_to <= good:
                del self._torn[session_id]  # the repair cut the failed append's bytes too
        if payload:
            self._append_bytes(session_id, path, payload)
        self._recovered.pop(session_id, None)

    def _recovered_lines(self, session_id: str, path: Path, truncate_to: int) -> bytes:
        """The lines recovered from the torn frame at ``truncate_to`` by the last load,
        if the file is still as that load read it; else read it again."""
        entry = self._recovered.get(session_id)
        try:
            current = _revision(path)
        except FileNotFoundError:
            current = None
        if entry is None or entry[0] != truncate_to or entry[1] != current:
            stored = self.load(session_id)
            entry = self._recovered.get(session_id)
            if stored.truncate_to != truncate_to or entry is None or entry[0] != truncate_to:
                raise PersistenceError(
                    f'session "{session_id}": repair is stale: the torn tail of "{path}" no longer starts '
                    f"at byte {truncate_to}",
                    session_id=session_id,
                )
        return entry[2]

    def delete(self, session_id: str) -> None:
        """Remove the log (durably: the directory is fsynced).

        The session directory and its ``writer.lock`` stay: unlinking a lock file that
        another process may have open would let two processes lock two inodes."""
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        try:
            self.files.unlink(str(path))
            self._paths.pop(session_id, None)
            self._unsynced_links.pop(session_id, None)
            self._torn.pop(session_id, None)
            self.files.fsync_dir(str(path.parent))
        except OSError as exc:
            raise StorageIOError(f'deleting session "{session_id}" failed: {exc}', session_id=session_id) from exc

    def _makedirs(self, sdir: Path) -> None:
        """Create ``sdir`` and its missing parents, fsyncing each parent. A parent whose
        fsync failed is fsynced again by the next call (its entry is not durable yet,
        even though the directory exists)."""
        missing = []
        p = sdir
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                self.files.mkdir(str(d), 0o700)
            self._dirs_to_sync.add(d.parent)
        for parent in sorted(self._dirs_to_sync, key=lambda d: len(d.parts)):
            self.files.fsync_dir(str(parent))
            self._dirs_to_sync.discard(parent)

    @contextlib.contextmanager
    def _root_lock(self, session_id: str) -> Iterator[None]:
        """Hold ``<root>/.root.lock`` (``flock``) for a check-then-create across the root.

        Waits (on this worker thread) while the lock makes progress, and gives up after
        :data:`ROOT_LOCK_TIMEOUT` seconds without any: each holder writes a fresh mark
        into the lock file when it takes the lock, so a waiter tells a lock that passes
        from creation to creation (a burst of first writes from many processes, each
        critical section one scan plus one small first write) from one that is stuck.
        The mark is a hint for waiters only (not fsynced, not part of any log). Within
        this process the waiters queue on a :class:`_RootMutex` first."""
        mutex = _root_mutex(self.root)
        taken = mutex.taken
        while not mutex.lock.acquire(timeout=ROOT_LOCK_TIMEOUT):
            if mutex.taken == taken:
                raise self._root_lock_stuck(session_id)
            taken = mutex.taken
        try:
            mutex.taken += 1
            with self._root_flock(session_id):
                yield
        finally:
            mutex.lock.release()

    def _root_lock_stuck(self, session_id: str) -> StorageIOError:
        return StorageIOError(
            f'creating session "{session_id}": the store root lock "{self.root / ROOT_LOCKFILE}" '
            f"made no progress for {ROOT_LOCK_TIMEOUT} s",
            session_id=session_id,
        )

    @contextlib.contextmanager
    def _root_flock(self, session_id: str) -> Iterator[None]:
        fd = self.files.open(str(self.root / ROOT_LOCKFILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + ROOT_LOCK_TIMEOUT
            seen = _lock_mark(fd)
            while True:
                try:
                    self.files.lock(fd)
                    break
                except BlockingIOError:
                    mark = _lock_mark(fd)
                    if mark != seen:  # another creation took the lock meanwhile: progress
                        seen, deadline = mark, time.monotonic() + ROOT_LOCK_TIMEOUT
                    elif time.monotonic() > deadline:
                        raise self._root_lock_stuck(session_id) from None
                    time.sleep(0.002)
            with contextlib.suppress(OSError):
                os.pwrite(fd, secrets.token_bytes(_MARK_BYTES), 0)
            yield
        finally:
            with contextlib.suppress(OSError):
                self.files.close(fd)  # closing drops the flock

    def _transcripts(self, session_id: str) -> list[Path]:
        """Every transcript of ``session_id`` under the root (refusing, as
        :meth:`locate` does, flat-layout files and the other encoding)."""
        seg = encode_segment(session_id)
        if len(seg) > MAX_SESSION_ID_BYTES:
            # Never created (the id door refuses it), and probing for it would raise
            # ENAMETOOLONG instead of answering "not found" (issue 16).
            return []
        found = []
        for project in self._project_dirs():
            for suffix in (".jsonl.zstd", ".jsonl"):
                if (project / (seg + suffix)).exists():
                    raise self._flat_layout(project / (seg + suffix))
            if (project / seg / self._opposite).exists():
                raise self._encoding_mismatch(project / seg / self._opposite)
            if (project / seg / self.transcript).is_file():
                found.append(project / seg / self.transcript)
        return found

    # -- one writer per session ----------------------------------------------------------

    def _lock_dir(self, header: dict[str, Any]) -> Path:
        existing = self.locate(header["id"])
        return existing.parent if existing is not None else self.session_dir(header)

    def acquire_writer(self, header: dict[str, Any]) -> WriterLease:
        """Take the session's writer lock at once, or raise :class:`SessionLockedError`
        naming the holder. Creates the session directory (not the transcript). The lock
        file's descriptor is closed on every failure path."""
        sid = header["id"]
        sdir = self._lock_dir(header)
        fd: int | None = None
        try:
            self._makedirs(sdir)
            fd = self.files.open(str(sdir / LOCKFILE), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                self.files.lock(fd)
            except BlockingIOError:
                try:
                    holder: Any = orjson.loads(os.pread(fd, 4096, 0) or b"null")
                except orjson.JSONDecodeError:
                    holder = None
                raise SessionLockedError(
                    f'session "{sid}" is already open for writing by {_describe_holder(holder)}',
                    session_id=sid,
                    holder=holder,
                ) from None
            info = orjson.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": int(time.time() * 1000)})
            self.files.ftruncate(fd, 0)
            self.files.write(fd, info)  # a fresh descriptor: at offset 0
            lease, fd = _FlockLease(self.files, fd), None
            return lease
        except OSError as exc:
            raise StorageIOError(f'locking session "{sid}" failed: {exc}', session_id=sid) from exc
        finally:
            if fd is not None:
                with contextlib.suppress(OSError):
                    self.files.close(fd)

    def lock_held(self, header: dict[str, Any]) -> bool:
        """True if some writer (in any process, this one included) holds the session's
        writer lock. Probes from a fresh descriptor, directly (not through ``files``, so
        it also works after a simulated crash).

        The probe takes the ``flock`` for an instant when it is free: a concurrent
        :meth:`acquire_writer` may then see the session as locked. Meant for invariant
        checks on a quiet store, not for coordination."""
        path = self._lock_dir(header) / LOCKFILE
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)


class _FlockLease(WriterLease):
    def __init__(self, files: OsFiles, fd: int) -> None:
        self._files = files
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                with contextlib.suppress(OSError):
                    self._files.ftruncate(fd, 0)
            finally:
                with contextlib.suppress(OSError):
                    self._files.close(fd)  # closing the descriptor drops the flock


def _encoding_error(session_id: str, records: list[dict[str, Any]], exc: Exception) -> RecordEncodingError:
    """Name the first record (by seq) that does not encode."""
    for r in records:
        try:
            orjson.dumps(r)
        except (TypeError, ValueError) as one:
            return RecordEncodingError(
                f'session "{session_id}": event seq {r.get("seq")} ({r.get("type")}) cannot be stored: {one}',
                session_id=session_id,
            )
    return RecordEncodingError(f'session "{session_id}": a batch cannot be stored: {exc}', session_id=session_id)


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
                bad = next((e for j, e in enumerate(decoded) if e.get("seq") != expected + j), None)
                if bad is None:
                    records.extend(decoded)
                    committed = pos
                    continue
                issue = (
                    f"corrupt session log: seq gap in committed region at line {line_no} "
                    f"(expected {expected + decoded.index(bad)}, got {bad.get('seq')})"
                )
        if decoded is not None and any(e.get("type") == "turn/end" for e in decoded):
            raise SessionCorruptionError(issue, session_id=session_id)
    return records, committed


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


def _quote(value: object) -> str:
    """``JSON.stringify`` of a string, as the reference quotes paths in messages."""
    return orjson.dumps(str(value)).decode()


def _duplicate(session_id: str) -> SessionCorruptionError:
    return SessionCorruptionError(
        f'duplicate JSONL session id "{session_id}" appears in multiple project directories',
        session_id=session_id,
    )


def _describe_holder(holder: Any) -> str:
    if isinstance(holder, dict):
        return f"process {holder.get('pid')} on {holder.get('host')}"
    return "another process"


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
