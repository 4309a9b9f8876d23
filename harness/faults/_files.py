"""A file layer that fails on purpose, for durability tests."""

from __future__ import annotations

import errno

from harness.persistence._files import OsFiles


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
