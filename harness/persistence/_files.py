"""The file layer the JSONL backend writes through (swappable for fault injection).

Every method is blocking: the backend runs on a worker thread, never on Trio's.
"""

from __future__ import annotations

import os


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

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
