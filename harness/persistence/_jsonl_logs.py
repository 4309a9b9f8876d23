"""The JSONL transcript descriptors a writer keeps open between its batches (decision 0019).

A writer's lease (its ``flock`` on ``writer.lock``) may hold the append descriptor of
its session's log (:class:`OpenLog`), so that an append does not open and close the log
every batch. Before each use the descriptor is checked against the log's *name*: one
``stat`` of the path must name the same inode (``st_dev``, ``st_ino``) as the
descriptor, which is exactly what opening the path would have given (a log deleted,
replaced or moved away since is not written behind: the descriptor is closed and the
path opened as without one). The ``stat`` also gives the size to roll back to and the
filesystem the round groups by, so a cached append costs one ``stat`` and one ``write``
instead of ``open``, ``fstat``, ``write``, ``close`` and the round's ``fstat``.

The descriptors are bounded per process (:data:`LOG_DESCRIPTORS`, a quarter of the
open-files limit, at most 1024): a lease that finds the budget spent opens and closes
the log per batch, as before. A descriptor is closed when its lease is released, when
the check above fails, or when the session is appended to under another path.

All blocking; any thread (the budget is shared under a lock).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Final

from harness.persistence._files import OsFiles


def _default_budget() -> int:
    """A quarter of the soft ``RLIMIT_NOFILE`` (each live writer already holds its lock
    file's descriptor, and the process has other files and sockets), at most 1024."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return 64
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 1024
    return max(0, min(1024, soft // 4))


#: The most transcript descriptors kept open by one process (all backends together).
LOG_DESCRIPTORS: Final = _default_budget()


class LogBudget:
    """How many :class:`OpenLog` descriptors may be open at once in this process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        """One more descriptor may be kept (False: the budget is spent)."""
        with self._lock:
            if self.used >= self.limit:
                return False
            self.used += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.used -= 1


#: The process's budget (tests replace its ``limit``).
BUDGET: Final = LogBudget(LOG_DESCRIPTORS)


class OpenLog:
    """One kept append descriptor: the path it was opened by, and the inode it opened
    (what a ``stat`` of that path must still name for the descriptor to be used)."""

    __slots__ = ("dev", "fd", "ino", "path")

    def __init__(self, path: str, fd: int, dev: int, ino: int) -> None:
        self.path = path
        self.fd = fd
        self.dev = dev
        self.ino = ino

    def close(self, files: OsFiles) -> None:
        """Close the descriptor (through ``files``, which opened it) and return its
        place in :data:`BUDGET`. Never raises ``OSError``."""
        try:
            with contextlib.suppress(OSError):
                files.close(self.fd)
        finally:
            BUDGET.give_back()
