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

import ctypes
import errno
import fcntl
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Final

import trio


class SimulatedCrash(BaseException):
    """The process "died" at a fault-injection crash point (``harness.faults``).

    A ``BaseException`` on purpose: no ``except Exception`` (and no error translation in
    the backends) may swallow it, just as no handler runs when the power goes out. Code
    that catches it is the test harness that decided to crash.
    """


def _kernel_at_least(release: str, want: tuple[int, int]) -> bool:
    parts: list[int] = []
    for piece in release.split("-")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            return False
        parts.append(int(digits))
    return len(parts) == 2 and (parts[0], parts[1]) >= want


def _load_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs``, where it reports writeback errors: Linux 5.8 and later.
    Before 5.8 it returned 0 even when writeback had failed, which would acknowledge
    data that never reached the disk, so it is not used there."""
    if not sys.platform.startswith("linux") or not _kernel_at_least(os.uname().release, (5, 8)):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_syncfs = _load_syncfs()

#: ``statfs`` magic numbers of the filesystems whose ``syncfs`` writes back, commits the
#: journal and flushes the device cache: ext2/3/4, XFS, Btrfs, F2FS. Elsewhere (FUSE
#: without FUSE_SYNCFS, network filesystems, tmpfs where it is moot) a round keeps its
#: fdatasyncs, whose promise those filesystems do implement.
SYNCFS_FILESYSTEMS: Final = frozenset({0xEF53, 0x58465342, 0x9123683E, 0xF2F52010})


def _load_fstatfs() -> Callable[..., int] | None:
    if _syncfs is None:
        return None
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).fstatfs
    except (OSError, AttributeError):
        return None
    return fn


_fstatfs = _load_fstatfs()


def syncfs_is_durable(fd: int) -> bool:
    """Whether ``fd``'s filesystem is one of :data:`SYNCFS_FILESYSTEMS` (``fstatfs``'s
    ``f_type``, the first field of ``struct statfs``, a native word on Linux; read
    each round, so a remount is seen: ~1 us)."""
    if _fstatfs is None:
        return False
    buf = ctypes.create_string_buffer(256)  # larger than struct statfs on any ABI
    if _fstatfs(fd, buf) != 0:
        return False
    return (ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF) in SYNCFS_FILESYSTEMS

#: :attr:`OsFiles.syncfs_min` where ``syncfs`` is usable. Measured on ext4 (a
#: Firecracker virtio disk; decision 0014): one fdatasync 160 us, one syncfs 300;
#: 8 files appended and made durable: 707 us with parallel fdatasyncs, 183 with one
#: syncfs; 32 files: 2.0 ms, 0.26-0.36. Below 8 the two are within noise of each other.
SYNCFS_MIN: Final = 8 if _syncfs is not None else None


class OsFiles:
    """Plain POSIX file operations. Subclass to inject failures (see harness.faults)."""

    #: Whether :meth:`fsync_each` must make its fsyncs one after the other, in the
    #: order given: a layer that counts operations to fail or crash the k-th one
    #: (``harness.faults``) needs the count to name the same operation in every run.
    ordered: bool = False

    #: The fewest descriptors a round (:meth:`sync_round`) makes durable with one
    #: ``syncfs(2)`` per filesystem instead of one ``fdatasync`` each (decision 0014);
    #: ``None``: never (the platform has no ``syncfs`` that reports writeback errors).
    syncfs_min: int | None = SYNCFS_MIN

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes) -> None:
        n = os.write(fd, data)
        if n < len(data):  # a short write (a signal, a full disk): write the rest
            view = memoryview(data)[n:]
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

    def syncfs(self, fds: Sequence[int]) -> None:
        """Make every descriptor of ``fds`` durable with one ``syncfs(2)`` on the
        filesystem of ``fds[0]`` (every one of them must be on it): the kernel writes
        back every dirty page and inode of that filesystem, commits its journal and
        flushes the device cache, as ``fdatasync`` does for one file. Raises
        ``OSError`` if it failed, including a writeback error anywhere on that
        filesystem since ``fds[0]`` was opened (Linux 5.8 and later report those;
        :data:`SYNCFS_MIN` is ``None`` before that), so the caller opens ``fds[0]``
        before it writes the data ``fds`` must make durable. Blocking."""
        if _syncfs is None:
            raise OSError(errno.ENOSYS, "syncfs(2) is not available on this platform")
        if _syncfs(fds[0]) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs: {os.strerror(code)}")

    def sync_round(self, fds: Sequence[int], devs: Sequence[int] | None = None) -> list[OSError | None]:
        """Blocking: make one round's descriptors durable, the cheaper of two ways,
        with :meth:`fsync_each`'s result. From :attr:`syncfs_min` descriptors on, one
        :meth:`syncfs` per filesystem (by ``st_dev``, in the order the descriptors
        come; only on the filesystems of :data:`SYNCFS_FILESYSTEMS`; ``fds[0]`` of each is the first opened, before any of the round's data
        was written); a filesystem whose ``syncfs`` failed has its descriptors
        fsynced one by one (:meth:`fsync_each`), so each batch still gets its own
        verdict: its own writeback error reaches its own descriptor. Below it, or
        where a layer replaced :meth:`fsync` but not :meth:`syncfs` (a layer that
        fails or counts fsyncs would otherwise be bypassed), :meth:`fsync_each`.

        ``devs``, aligned with ``fds``: each descriptor's ``st_dev``, if the caller
        already has it (JSONL's round stats every file before writing it): no
        ``fstat`` per descriptor here."""
        least = self.syncfs_min
        cls = type(self)
        if (
            least is None
            or len(fds) < least
            or (cls.fsync is not OsFiles.fsync and cls.syncfs is OsFiles.syncfs)
        ):
            return self.fsync_each(fds)
        groups: dict[int, list[int]] = {}
        try:
            if devs is None:
                devs = [os.fstat(fd).st_dev for fd in fds]
            for i, dev in enumerate(devs):
                groups.setdefault(dev, []).append(i)
        except OSError:
            return self.fsync_each(fds)
        out: list[OSError | None] = [None] * len(fds)
        for members in groups.values():
            mine = [fds[i] for i in members]
            if len(mine) >= least and syncfs_is_durable(mine[0]):
                try:
                    self.syncfs(mine)
                    continue
                except OSError:
                    pass  # each descriptor's own fdatasync tells whose data failed
            for i, err in zip(members, self.fsync_each(mine), strict=True):
                out[i] = err
        return out

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
