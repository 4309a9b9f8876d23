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
import threading
from collections.abc import Callable, Sequence

import trio


class SimulatedCrash(BaseException):
    """The process "died" at a fault-injection crash point (``harness.faults``).

    A ``BaseException`` on purpose: no ``except Exception`` (and no error translation in
    the backends) may swallow it, just as no handler runs when the power goes out. Code
    that catches it is the test harness that decided to crash.
    """


class OsFiles:
    """Plain POSIX file operations. Subclass to inject failures (see harness.faults)."""

    #: Whether :meth:`fsync_each` must make its fsyncs one after the other, in the
    #: order given: a layer that counts operations to fail or crash the k-th one
    #: (``harness.faults``) needs the count to name the same operation in every run.
    ordered: bool = False

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def fsync(self, fd: int) -> None:
        """Make the file's data durable, with the metadata needed to read it back.

        ``fdatasync`` where the platform has it: it flushes the data and every
        metadata change a later read depends on -- the file size an append or a
        truncate changed, the blocks allocated for it -- but not the timestamps,
        which no reader of a log looks at (POSIX, fdatasync(2)). A new file's *name*
        is the directory's (:meth:`fsync_dir`), under both calls."""
        _datasync(fd)

    def fsync_each(self, fds: Sequence[int]) -> list[OSError | None]:
        """Blocking: :meth:`fsync` every descriptor, as one round: issued together
        (a few helper threads) so the filesystem journal can commit them together,
        unless :attr:`ordered`. The result is aligned with ``fds`` (``None``: durable,
        or the ``OSError`` of that descriptor's fsync). Anything else raised by an
        fsync (a simulated crash) is raised once every fsync of the round ended."""
        if len(fds) == 1:  # the common round of one batch: no closure, no bookkeeping
            try:
                self.fsync(fds[0])
            except OSError as exc:
                return [exc]
            return [None]
        out: list[OSError | None] = [None] * len(fds)
        raised: list[BaseException] = []

        def one(i: int) -> None:
            try:
                self.fsync(fds[i])
            except OSError as exc:
                out[i] = exc
            except BaseException as exc:
                raised.append(exc)

        if self.ordered or len(fds) < 2:
            for i in range(len(fds)):
                one(i)
        else:
            _concurrently(one, len(fds))
        if raised:
            raise raised[0]
        return out

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


#: Helper threads of one :meth:`OsFiles.fsync_each` round, besides the caller's own.
FSYNC_HELPERS = 15

_datasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync: fsync


def _concurrently(fn: Callable[[int], None], n: int) -> None:
    """Run ``fn(0) .. fn(n - 1)`` on the calling thread and up to :data:`FSYNC_HELPERS`
    threads of Trio's thread cache (daemon threads that end when idle; usable from any
    thread), returning once every call returned (``fn`` must not raise)."""
    lock = threading.Lock()
    next_i = 0
    left = n
    done = threading.Event()

    def work() -> None:
        nonlocal next_i, left
        while True:
            with lock:
                i = next_i
                next_i += 1
            if i >= n:
                return
            fn(i)
            with lock:
                left -= 1
                if left == 0:
                    done.set()

    for _ in range(min(n - 1, FSYNC_HELPERS)):
        trio.lowlevel.start_thread_soon(work, lambda _result: None)
    work()
    done.wait()
