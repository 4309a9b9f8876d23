"""The JSONL backend's layout: where a session's files are under the root, and the
checks that a root holds one encoding in the project/session layout (reference §1).

``<root>/--<projectKey(cwd)>--/<encodeSegment(id)>/session.jsonl`` (``_no-cwd`` when
a session has no cwd), or ``session.jsonl.zstd``. :class:`_JsonlLayout` also declares
the state every part of :class:`~harness.persistence._jsonl.JsonlBackend` shares.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from harness.errors import (
    SessionCorruptionError,
    StorageLayoutError,
)
from harness.persistence._files import OsFiles
from harness.persistence._zstd import (
    ZstdCodec,
)
from harness.session import MAX_SESSION_ID_BYTES

TRANSCRIPT: Final = "session.jsonl"
TRANSCRIPT_ZSTD: Final = "session.jsonl.zstd"
COMPRESSIONS: Final = ("none", "zstd")
#: The reference's ``compression`` option: ``"zstd"`` needs the optional ``zstandard``.
Compression = Literal["none", "zstd"]

GROUP_SYNCS: Final = ("auto", "each")
#: How a group-commit round makes its appends durable (``JsonlBackend(group_sync=)``,
#: decision 0014): ``"auto"``, one ``syncfs(2)`` per filesystem for a round of
#: :attr:`~harness.persistence._files.OsFiles.syncfs_min` files or more, else one
#: ``fdatasync`` per file; ``"each"``, always one ``fdatasync`` per file.
GroupSync = Literal["auto", "each"]


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


class _JsonlLayout:
    """The layout part of :class:`~harness.persistence._jsonl.JsonlBackend`; the state
    its ``__init__`` sets, declared for the other parts."""

    name: str
    root: Path
    files: OsFiles
    pack_chunks: bool
    compression: Compression
    group_sync: GroupSync
    transcript: str
    _codec: ZstdCodec | None
    _opposite: str
    _root_checked: bool
    _paths: dict[str, Path]
    # id -> known-good size: a failed rollback left bytes after it (see append)
    _torn: dict[str, int]
    # id -> (path, inode, records): linked, but the directory fsync failed
    _unsynced_links: dict[str, tuple[Path, int, int]]
    _dirs_to_sync: set[Path]
    # zstd: id -> (torn frame start, revision, complete lines recovered from it),
    # from the last load; the repair writes them back (see commit_repair)
    _recovered: dict[str, tuple[int, str, bytes]]

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


def _quote(value: object) -> str:
    """``JSON.stringify`` of a string, as the reference quotes paths in messages."""
    return orjson.dumps(str(value)).decode()


def _duplicate(session_id: str) -> SessionCorruptionError:
    return SessionCorruptionError(
        f'duplicate JSONL session id "{session_id}" appears in multiple project directories',
        session_id=session_id,
    )
