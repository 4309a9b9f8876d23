"""The file layer the backends write through (swappable for fault injection).

Every mutating file operation of the JSONL backend goes through an :class:`OsFiles`
(open, write, fsync, ftruncate, close, link, rename, mkdir, unlink, lock, fsync_dir),
and so do the SQLite backend's own file operations (creating the database's directory
and file). Reads (``read_bytes``, ``stat``, ``iterdir``, ``pread`` of a lock holder) stay
direct: they change nothing on disk, so there is nothing to fail on purpose or to lose
in a power cut. ``harness.faults`` subclasses this to count, fail and "crash" operations.

Every method is blocking: the backends run on worker threads, never on Trio's.
"""

from __future__ import annotations

import fcntl
import os


class SimulatedCrash(BaseException):
    """The process "died" at a fault-injection crash point (``harness.faults``).

    A ``BaseException`` on purpose: no ``except Exception`` (and no error translation in
    the backends) may swallow it, just as no handler runs when the power goes out. Code
    that catches it is the test harness that decided to crash.
    """


class OsFiles:
    """Plain POSIX file operations. Subclass to inject failures (see harness.faults)."""

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    def link(self, src: str, dst: str) -> None:
        os.link(src, dst)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        os.mkdir(path, mode)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def lock(self, fd: int) -> None:
        """Take an exclusive ``flock`` at once; ``BlockingIOError`` if another open file
        description holds it (in this process or another)."""
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
