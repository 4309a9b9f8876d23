"""The JSONL backend, the embedded default: one directory, no server (reference §1).

Layout: ``<root>/--<projectKey(cwd)>--/<encodeSegment(id)>/session.jsonl`` (``_no-cwd``
when a session has no cwd), or ``session.jsonl.zstd`` with ``compression="zstd"``
(reference §1.3, see :mod:`._zstd`). Line 1 is the header; every further line is one
event or one packed chunk row. All methods block: call them from a worker thread.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.errors import PersistenceArgumentError, StorageLayoutError
from harness.persistence._files import OsFiles
from harness.persistence._jsonl_layout import (
    COMPRESSIONS,
    GROUP_SYNCS,
    TRANSCRIPT,
    TRANSCRIPT_ZSTD,
    Compression,
    GroupSync,
    encode_segment,
    project_key,
)
from harness.persistence._jsonl_lock import LOCKFILE, ROOT_LOCK_TIMEOUT, ROOT_LOCKFILE
from harness.persistence._jsonl_read import _read_lines
from harness.persistence._jsonl_write import _JsonlWriting
from harness.persistence._zstd import load_codec

__all__ = [
    "COMPRESSIONS",
    "GROUP_SYNCS",
    "LOCKFILE",
    "ROOT_LOCKFILE",
    "ROOT_LOCK_TIMEOUT",
    "TRANSCRIPT",
    "TRANSCRIPT_ZSTD",
    "Compression",
    "GroupSync",
    "JsonlBackend",
    "StorageLayoutError",
    "_read_lines",
    "encode_segment",
    "project_key",
]


class JsonlBackend(_JsonlWriting):
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

    Group commit (several sessions' batches in one round, decision 0012):
    ``group_sync="auto"`` makes a round of many files durable with one ``syncfs(2)``
    per filesystem (Linux 5.8+; decision 0014), which also writes back every other
    dirty file of that filesystem; ``"each"`` keeps one ``fdatasync`` per file.

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
        group_sync: GroupSync = "auto",
    ) -> None:
        if compression not in COMPRESSIONS:
            raise PersistenceArgumentError(
                f'JSONL compression must be "none" or "zstd", got {compression!r}'
            )
        if group_sync not in GROUP_SYNCS:
            raise PersistenceArgumentError(f'JSONL group_sync must be "auto" or "each", got {group_sync!r}')
        self.root = Path(root).resolve()
        self.files = files or OsFiles()
        self.pack_chunks = pack_chunks
        self.compression = compression
        self.group_sync = group_sync
        self._codec = load_codec() if compression == "zstd" else None
        self.transcript = TRANSCRIPT_ZSTD if compression == "zstd" else TRANSCRIPT
        self._opposite = TRANSCRIPT if compression == "zstd" else TRANSCRIPT_ZSTD
        self._root_checked = False
        self._paths = {}
        self._torn = {}
        self._unsynced_links = {}
        self._dirs_to_sync = set()
        self._recovered = {}
