"""The JSONL backend, the embedded default: one directory, no server (reference §1).

Layout: ``<root>/--<projectKey(cwd)>--/<encodeSegment(id)>/session.jsonl`` (``_no-cwd``
when a session has no cwd). Line 1 is the header; every further line is one event or
one packed chunk row. All methods block: call them from a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Final

import orjson

from harness.errors import (
    PersistedSessionNotFoundError,
    SessionCorruptionError,
    SessionLockedError,
    SessionLogExistsError,
    StorageIOError,
    StorageRowError,
)
from harness.persistence._backend import StoredLog, WriterLease, check_header_record, header_line
from harness.persistence._files import OsFiles
from harness.session import decode_storage_record, gc_paused, pack_chunk_runs
from harness.session._chunks import ROW_TAGS

TRANSCRIPT: Final = "session.jsonl"
LOCKFILE: Final = "writer.lock"
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


class JsonlBackend:
    """Sessions as JSONL files under ``root``. Blocking; thread-compatible per session.

    Durability: the first write of a session is atomic (temp file, fsync, link without
    overwrite, fsync of the directory); later writes are whole batches followed by
    fsync, rolled back by truncation if the write or the fsync fails. One live writer
    per session across processes: :meth:`acquire_writer` takes an exclusive ``flock``
    on ``writer.lock`` in the session directory (released by the OS if the process dies).
    """

    name = "jsonl"

    def __init__(self, root: str | os.PathLike[str], *, files: OsFiles | None = None, pack_chunks: bool = True) -> None:
        self.root = Path(root).resolve()
        self.files = files or OsFiles()
        self.pack_chunks = pack_chunks
        self._paths: dict[str, Path] = {}

    # -- layout --------------------------------------------------------------------------

    def session_dir(self, header: dict[str, Any]) -> Path:
        cwd = header.get("cwd")
        project = "_no-cwd" if cwd is None else project_key(cwd)
        return self.root / project / encode_segment(header["id"])

    def locate(self, session_id: str) -> Path | None:
        """The transcript path of an existing session (scans every project dir)."""
        cached = self._paths.get(session_id)
        if cached is not None and cached.exists():
            return cached
        if not self.root.is_dir():
            return None
        seg = encode_segment(session_id)
        found = [p / seg / TRANSCRIPT for p in self.root.iterdir() if (p / seg / TRANSCRIPT).is_file()]
        if len(found) > 1:
            raise SessionCorruptionError(
                f'duplicate JSONL session id "{session_id}" appears in multiple project directories',
                session_id=session_id,
            )
        if not found:
            return None
        self._paths[session_id] = found[0]
        return found[0]

    # -- reading ---------------------------------------------------------------------------

    def list_headers(self) -> list[dict[str, Any]]:
        """Headers of every stored session (skips dirs without a valid transcript)."""
        out: list[dict[str, Any]] = []
        if not self.root.is_dir():
            return out
        for project in sorted(self.root.iterdir()):
            if not project.is_dir():
                continue
            for sdir in sorted(project.iterdir()):
                path = sdir / TRANSCRIPT
                try:
                    with open(path, "rb") as f:
                        first = f.readline()
                except (FileNotFoundError, NotADirectoryError):
                    continue
                if not first.endswith(b"\n"):
                    continue
                try:
                    header = check_header_record(orjson.loads(first), None)
                except Exception:
                    continue
                expected = self.session_dir(header) / TRANSCRIPT
                if expected != path:
                    raise SessionCorruptionError(
                        f'corrupt session log "{path}": header id "{header["id"]}" and cwd identify "{expected}"',
                        session_id=header["id"],
                    )
                out.append(header)
        return out

    def load(self, session_id: str) -> StoredLog:
        """Read and scan a log (reference §1.5); raises if absent or corrupt."""
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        for _ in range(10):
            before = _stat_key(path)
            data = path.read_bytes()
            if _stat_key(path) == before:
                break
        return self._scan(session_id, path, data)

    def _scan(self, session_id: str, path: Path, data: bytes) -> StoredLog:
        nl = data.find(b"\n")
        if nl < 0:
            raise SessionCorruptionError("empty or header-less session log", session_id=session_id)
        try:
            raw_header = orjson.loads(data[:nl])
        except orjson.JSONDecodeError:
            raise SessionCorruptionError(
                "corrupt session log: header line is not valid JSON", session_id=session_id
            ) from None
        header = check_header_record(raw_header, session_id)
        if header["id"] != session_id:
            raise SessionCorruptionError(
                f'corrupt session log "{path}": requested id "{session_id}" does not match header id "{header["id"]}"',
                session_id=session_id,
            )
        expected_path = self.session_dir(header) / TRANSCRIPT
        if expected_path != path and not _same_file(expected_path, path):
            raise SessionCorruptionError(
                f'corrupt session log "{path}": header id "{header["id"]}" and cwd identify "{expected_path}"',
                session_id=session_id,
            )
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
        return StoredLog(header, records, truncate_to, _revision(path))

    def revision(self, session_id: str) -> str | None:
        path = self.locate(session_id)
        if path is None:
            return None
        try:
            return _revision(path)
        except FileNotFoundError:
            return None

    # -- writing ---------------------------------------------------------------------------

    def _encode(self, records: list[dict[str, Any]]) -> bytes:
        rows = pack_chunk_runs(records) if self.pack_chunks else records
        dumps = orjson.dumps
        return b"".join(dumps(r) + b"\n" for r in rows)

    def materialize(self, header: dict[str, Any], records: list[dict[str, Any]]) -> None:
        """First write: header + first batch become visible atomically; never overwrites."""
        sid = header["id"]
        sdir = self.session_dir(header)
        final = sdir / TRANSCRIPT
        try:
            self._makedirs(sdir)
            if final.exists():
                raise SessionLogExistsError(
                    f'refusing to materialize "{sid}": a log already exists on disk (load/resume it instead)',
                    session_id=sid,
                )
            tmp = sdir / f"{TRANSCRIPT}.{secrets.token_hex(6)}.tmp"
            fd = self.files.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                try:
                    self.files.write(fd, header_line(header) + self._encode(records))
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
                self.files.fsync_dir(str(sdir))
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        except OSError as exc:
            raise StorageIOError(f'writing session "{sid}" failed: {exc}', session_id=sid) from exc
        self._paths[sid] = final

    def append(self, session_id: str, records: list[dict[str, Any]]) -> None:
        """Append one batch and fsync; on failure truncate back and re-raise."""
        if not records:
            return
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        self._append_bytes(session_id, path, self._encode(records))

    def _append_bytes(self, session_id: str, path: Path, payload: bytes) -> None:
        try:
            fd = self.files.open(str(path), os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            raise StorageIOError(f'opening session "{session_id}" failed: {exc}', session_id=session_id) from exc
        try:
            size = os.fstat(fd).st_size
            try:
                self.files.write(fd, payload)
                self.files.fsync(fd)
            except OSError as exc:
                try:
                    self.files.ftruncate(fd, size)
                    self.files.fsync(fd)
                except OSError as rollback:
                    raise StorageIOError(
                        f'failed to roll back append to "{path}": {exc}; rollback: {rollback}',
                        session_id=session_id,
                    ) from exc
                raise StorageIOError(
                    f'appending to session "{session_id}" failed (rolled back): {exc}', session_id=session_id
                ) from exc
        finally:
            self.files.close(fd)

    def commit_repair(self, session_id: str, truncate_to: int | None, records: list[dict[str, Any]]) -> None:
        """Truncate a torn tail (fsync), then append the closers as one batch.

        Two durable steps, not atomic: a crash between them just re-repairs next time.
        """
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        if truncate_to is not None:
            try:
                fd = self.files.open(str(path), os.O_WRONLY)
                try:
                    self.files.ftruncate(fd, truncate_to)
                    self.files.fsync(fd)
                finally:
                    self.files.close(fd)
            except OSError as exc:
                raise StorageIOError(f'repairing session "{session_id}" failed: {exc}', session_id=session_id) from exc
        if records:
            self._append_bytes(session_id, path, self._encode(records))

    def delete(self, session_id: str) -> None:
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        path.unlink()
        self._paths.pop(session_id, None)
        lock = path.parent / LOCKFILE
        with contextlib.suppress(OSError):
            lock.unlink()
        with contextlib.suppress(OSError):
            path.parent.rmdir()

    def _makedirs(self, sdir: Path) -> None:
        missing = []
        p = sdir
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700)
            self.files.fsync_dir(str(d.parent))

    # -- one writer per session ----------------------------------------------------------

    def acquire_writer(self, header: dict[str, Any]) -> WriterLease:
        """Take the session's writer lock at once, or raise :class:`SessionLockedError`
        naming the holder. Creates the session directory (not the transcript)."""
        sid = header["id"]
        existing = self.locate(sid)
        sdir = existing.parent if existing is not None else self.session_dir(header)
        try:
            self._makedirs(sdir)
            fd = os.open(sdir / LOCKFILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageIOError(f'locking session "{sid}" failed: {exc}', session_id=sid) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder: Any = orjson.loads(os.pread(fd, 4096, 0) or b"null")
            except orjson.JSONDecodeError:
                holder = None
            os.close(fd)
            raise SessionLockedError(
                f'session "{sid}" is already open for writing by {_describe_holder(holder)}',
                session_id=sid,
                holder=holder,
            ) from None
        info = orjson.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": int(time.time() * 1000)})
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
        return _FlockLease(fd)


class _FlockLease(WriterLease):
    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the descriptor drops the flock


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


def _slow_scan(session_id: str, lines: list[bytes], start: int) -> tuple[list[Any], int]:
    """The reading rules of reference §1.5, line by line (rows, bad lines, gaps)."""
    records: list[Any] = []
    committed = start
    pos = start
    issue: str | None = None
    loads = orjson.loads
    for k, line in enumerate(lines):
        line_no = k + 2
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


def _describe_holder(holder: Any) -> str:
    if isinstance(holder, dict):
        return f"process {holder.get('pid')} on {holder.get('host')}"
    return "another process"


def _stat_key(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _revision(path: Path) -> str:
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False
