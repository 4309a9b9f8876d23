"""File layers that fail on purpose, for durability tests.

* :class:`FailingFiles`: fail the next N writes / fsyncs (simple, stateful counters).
* :class:`FaultyFiles`: count every file operation a backend performs and fail the
  k-th one, so a test can first do a dry run (``fail_at=None``) to learn how many
  operations a scenario performs and then fail each of them in turn.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Collection, Sequence
from typing import Final

from harness.persistence._files import SYNCFS_MIN, OsFiles

#: Every mutating operation kind of :class:`OsFiles` (``close`` is not counted by
#: default: failing it proves nothing about durability, and it cannot be retried).
MUTATING_KINDS: Final = frozenset(
    {"open", "write", "fsync", "syncfs", "ftruncate", "link", "rename", "mkdir", "unlink", "lock", "fsync_dir"}
)


class FailingFiles(OsFiles):
    """Fails the next ``fail_writes`` writes and/or ``fail_fsyncs`` fsyncs with EIO.

    ``partial`` makes a failing write first write half of its data, like a disk that
    filled up mid-write: the backend must roll that back. Counters go down as
    failures are injected; set them again to fail more.
    """

    def __init__(self, *, fail_writes: int = 0, fail_fsyncs: int = 0, partial: bool = True) -> None:
        self.fail_writes = fail_writes
        self.fail_fsyncs = fail_fsyncs
        self.partial = partial
        self.injected = 0

    #: Its counters name "the next" fsync: a group's fsyncs go in order (OsFiles.ordered).
    ordered = True

    def write(self, fd: int, data: bytes) -> None:
        if self.fail_writes > 0:
            self.fail_writes -= 1
            self.injected += 1
            if self.partial and len(data) > 1:
                super().write(fd, data[: len(data) // 2])
            raise OSError(errno.EIO, "injected write failure")
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.fail_fsyncs > 0:
            self.fail_fsyncs -= 1
            self.injected += 1
            raise OSError(errno.EIO, "injected fsync failure")
        super().fsync(fd)


class FaultyFiles(OsFiles):
    """Counts every file operation whose kind is in ``kinds`` (1-based, in the order
    they happen, across threads) and fails the ``fail_at``-th one with
    ``OSError(error, "injected <kind> failure", path)``.

    ``fail_at=None`` never fails (a dry run: read :attr:`count` and :attr:`ops` after).
    A failing write with ``partial=True`` first writes half of its bytes, like a disk
    that filled up mid-write. Set :attr:`fail_at` again (e.g. ``count + 1``) to fail
    a later operation; ``fail_at`` is compared against the running count.

    Attributes: :attr:`count` (operations counted so far), :attr:`ops` (``(kind,
    path)`` of each counted operation; fd operations name the path the fd was opened
    with, or ``fd:<n>``), :attr:`injected` (``(number, kind, path)`` of each failure).
    Thread-safe: the backends call it from worker threads. A group's fsyncs go one
    after the other (:attr:`OsFiles.ordered`), so the k-th operation is the same one in
    every run.

    A round of two or more files makes them durable with one ``syncfs`` (counted as
    one operation, kind ``"syncfs"``, named after the round's first file) where the
    platform has it: the threshold of :attr:`OsFiles.syncfs_min` is lowered to 2 so
    the explorers' small groups take that path and, when it fails, its per-file
    fallback. (:class:`FailingFiles`, whose counters name "the next fsync", keeps one
    fsync per file: it replaces ``fsync`` only.)
    """

    ordered = True
    syncfs_min = None if SYNCFS_MIN is None else 2

    def __init__(
        self,
        *,
        fail_at: int | None = None,
        error: int = errno.EIO,
        kinds: Collection[str] | None = None,
        partial: bool = True,
    ) -> None:
        self.fail_at = fail_at
        self.error = error
        self.kinds: frozenset[str] = MUTATING_KINDS if kinds is None else frozenset(kinds)
        self.partial = partial
        self.count = 0
        self.ops: list[tuple[str, str]] = []
        self.injected: list[tuple[int, str, str]] = []
        self._mutex = threading.RLock()
        self._fd_paths: dict[int, str] = {}

    # -- counting --------------------------------------------------------------------------

    def _describe(self, fd: int) -> str:
        with self._mutex:
            return self._fd_paths.get(fd, f"fd:{fd}")

    def _before(self, kind: str, path: str) -> bool:
        """Count the operation; True if it must fail (the failure is recorded)."""
        with self._mutex:
            if kind not in self.kinds:
                return False
            self.count += 1
            self.ops.append((kind, path))
            if self.fail_at is not None and self.count == self.fail_at:
                self.injected.append((self.count, kind, path))
                return True
            return False

    def _fail(self, kind: str, path: str) -> OSError:
        return OSError(self.error, f"injected {kind} failure", path)

    # -- operations ------------------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        if self._before("open", path):
            raise self._fail("open", path)
        fd = super().open(path, flags, mode)
        with self._mutex:
            self._fd_paths[fd] = path
        return fd

    def write(self, fd: int, data: bytes) -> None:
        path = self._describe(fd)
        if self._before("write", path):
            if self.partial and len(data) > 1:
                super().write(fd, data[: len(data) // 2])
            raise self._fail("write", path)
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        path = self._describe(fd)
        if self._before("fsync", path):
            raise self._fail("fsync", path)
        super().fsync(fd)

    def syncfs(self, fds: Sequence[int]) -> None:
        path = self._describe(fds[0])
        if self._before("syncfs", path):
            raise self._fail("syncfs", path)
        super().syncfs(fds)

    def ftruncate(self, fd: int, size: int) -> None:
        path = self._describe(fd)
        if self._before("ftruncate", path):
            raise self._fail("ftruncate", path)
        super().ftruncate(fd, size)

    def close(self, fd: int) -> None:
        path = self._describe(fd)
        with self._mutex:
            self._fd_paths.pop(fd, None)
        if self._before("close", path):
            # The descriptor is closed anyway (as after a failed close(2) on Linux):
            # the failure reports a lost deferred write, not a leaked descriptor.
            super().close(fd)
            raise self._fail("close", path)
        super().close(fd)

    def link(self, src: str, dst: str) -> None:
        if self._before("link", dst):
            raise self._fail("link", dst)
        super().link(src, dst)

    def rename(self, src: str, dst: str) -> None:
        if self._before("rename", dst):
            raise self._fail("rename", dst)
        super().rename(src, dst)

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        if self._before("mkdir", path):
            raise self._fail("mkdir", path)
        super().mkdir(path, mode)

    def unlink(self, path: str) -> None:
        if self._before("unlink", path):
            raise self._fail("unlink", path)
        super().unlink(path)

    def lock(self, fd: int) -> None:
        path = self._describe(fd)
        if self._before("lock", path):
            raise self._fail("lock", path)
        super().lock(fd)

    def fsync_dir(self, path: str) -> None:
        if self._before("fsync_dir", path):
            raise self._fail("fsync_dir", path)
        super().fsync_dir(path)
