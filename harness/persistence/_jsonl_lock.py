"""The JSONL backend's locks: the ``<root>/.root.lock`` ``flock`` (with the per-root
mutex its waiters in this process queue on) that makes a first write's id check and
creation one step across processes, and the per-session ``writer.lock`` lease."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson

from harness.errors import (
    SessionLockedError,
    StorageIOError,
)
from harness.persistence._backend import (
    WriterLease,
)
from harness.persistence._files import OsFiles
from harness.persistence._jsonl_layout import _JsonlLayout
from harness.persistence._jsonl_logs import OpenLog

LOCKFILE: Final = "writer.lock"
ROOT_LOCKFILE: Final = ".root.lock"  # not a directory: listing and lookup skip it
ROOT_LOCK_TIMEOUT: Final = 10.0
"""Seconds a first write waits for the root lock while no other creation takes it."""
_MARK_BYTES: Final = 8


class _RootMutex:
    """The threads of this process that want one root's lock queue here, blocked, so
    at most one of them polls the ``flock`` (hundreds of sessions created at once
    would otherwise each poll it, and starve the holder of the CPU and the GIL).
    ``taken`` counts acquisitions: a waiter times out only while it does not move."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken = 0


# Weak: an entry lives while some thread is inside the root lock (or waits for it).
_ROOT_MUTEXES: weakref.WeakValueDictionary[str, _RootMutex] = weakref.WeakValueDictionary()
_ROOT_MUTEXES_GUARD = threading.Lock()


def _root_mutex(root: Path) -> _RootMutex:
    with _ROOT_MUTEXES_GUARD:
        mutex = _ROOT_MUTEXES.get(str(root))
        if mutex is None:
            mutex = _ROOT_MUTEXES[str(root)] = _RootMutex()
        return mutex


def _lock_mark(fd: int) -> bytes:
    """The root lock file's progress mark (see ``JsonlBackend._root_lock``)."""
    try:
        return os.pread(fd, _MARK_BYTES, 0)
    except OSError:
        return b""


class _JsonlLocking(_JsonlLayout):
    """The locking part of :class:`~harness.persistence._jsonl.JsonlBackend`."""

    @contextlib.contextmanager
    def _root_lock(self, session_id: str) -> Iterator[None]:
        """Hold ``<root>/.root.lock`` (``flock``) for a check-then-create across the root.

        Waits (on this worker thread) while the lock makes progress, and gives up after
        :data:`ROOT_LOCK_TIMEOUT` seconds without any: each holder writes a fresh mark
        into the lock file when it takes the lock, so a waiter tells a lock that passes
        from creation to creation (a burst of first writes from many processes, each
        critical section one scan plus one small first write) from one that is stuck.
        The mark is a hint for waiters only (not fsynced, not part of any log). Within
        this process the waiters queue on a :class:`_RootMutex` first."""
        mutex = _root_mutex(self.root)
        taken = mutex.taken
        while not mutex.lock.acquire(timeout=ROOT_LOCK_TIMEOUT):
            if mutex.taken == taken:
                raise self._root_lock_stuck(session_id)
            taken = mutex.taken
        try:
            mutex.taken += 1
            with self._root_flock(session_id):
                yield
        finally:
            mutex.lock.release()

    def _root_lock_stuck(self, session_id: str) -> StorageIOError:
        return StorageIOError(
            f'creating session "{session_id}": the store root lock "{self.root / ROOT_LOCKFILE}" '
            f"made no progress for {ROOT_LOCK_TIMEOUT} s",
            session_id=session_id,
        )

    @contextlib.contextmanager
    def _root_flock(self, session_id: str) -> Iterator[None]:
        fd = self.files.open(str(self.root / ROOT_LOCKFILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + ROOT_LOCK_TIMEOUT
            seen = _lock_mark(fd)
            while True:
                try:
                    self.files.lock(fd)
                    break
                except BlockingIOError:
                    mark = _lock_mark(fd)
                    if mark != seen:  # another creation took the lock meanwhile: progress
                        seen, deadline = mark, time.monotonic() + ROOT_LOCK_TIMEOUT
                    elif time.monotonic() > deadline:
                        raise self._root_lock_stuck(session_id) from None
                    time.sleep(0.002)
            with contextlib.suppress(OSError):
                os.pwrite(fd, secrets.token_bytes(_MARK_BYTES), 0)
            yield
        finally:
            with contextlib.suppress(OSError):
                self.files.close(fd)  # closing drops the flock

    # -- one writer per session ----------------------------------------------------------

    def _lock_dir(self, header: dict[str, Any]) -> Path:
        existing = self.locate(header["id"])
        return existing.parent if existing is not None else self.session_dir(header)

    def acquire_writer(self, header: dict[str, Any]) -> WriterLease:
        """Take the session's writer lock at once, or raise :class:`SessionLockedError`
        naming the holder. Creates the session directory (not the transcript). The lock
        file's descriptor is closed on every failure path."""
        sid = header["id"]
        sdir = self._lock_dir(header)
        fd: int | None = None
        try:
            self._makedirs(sdir)
            fd = self.files.open(str(sdir / LOCKFILE), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                self.files.lock(fd)
            except BlockingIOError:
                try:
                    holder: Any = orjson.loads(os.pread(fd, 4096, 0) or b"null")
                except orjson.JSONDecodeError:
                    holder = None
                raise SessionLockedError(
                    f'session "{sid}" is already open for writing by {_describe_holder(holder)}',
                    session_id=sid,
                    holder=holder,
                ) from None
            info = orjson.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": int(time.time() * 1000)})
            self.files.ftruncate(fd, 0)
            self.files.write(fd, info)  # a fresh descriptor: at offset 0
            lease, fd = _FlockLease(self.files, fd), None
            return lease
        except OSError as exc:
            raise StorageIOError(f'locking session "{sid}" failed: {exc}', session_id=sid) from exc
        finally:
            if fd is not None:
                with contextlib.suppress(OSError):
                    self.files.close(fd)

    def lock_held(self, header: dict[str, Any]) -> bool:
        """True if some writer (in any process, this one included) holds the session's
        writer lock. Probes from a fresh descriptor, directly (not through ``files``, so
        it also works after a simulated crash).

        The probe takes the ``flock`` for an instant when it is free: a concurrent
        :meth:`acquire_writer` may then see the session as locked. Meant for invariant
        checks on a quiet store, not for coordination."""
        path = self._lock_dir(header) / LOCKFILE
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)


class _FlockLease(WriterLease):
    """A writer's ``flock``; while held it may keep its log's append descriptor
    (:class:`~._jsonl_logs.OpenLog`, decision 0019), closed before the lock is
    released."""

    def __init__(self, files: OsFiles, fd: int) -> None:
        self.files = files
        self._fd: int | None = fd
        self._log: OpenLog | None = None
        self._log_mutex = threading.Lock()  # the kept log vs a release on another thread

    def take_log(self) -> OpenLog | None:
        """The kept log descriptor, handed to the caller (who keeps it again with
        :meth:`keep_log` or closes it), or ``None``."""
        with self._log_mutex:
            log, self._log = self._log, None
        return log

    def keep_log(self, log: OpenLog) -> bool:
        """Keep ``log`` until the next append or the release; False if this lease
        was released meanwhile or keeps another one (the caller closes ``log``)."""
        with self._log_mutex:
            if self._fd is None or self._log is not None:
                return False
            self._log = log
            return True

    def release(self) -> None:
        with self._log_mutex:
            log, self._log = self._log, None
            fd, self._fd = self._fd, None
        try:
            if log is not None:
                log.close(self.files)  # before the lock: no write behind another writer's back
        finally:
            if fd is not None:
                try:
                    with contextlib.suppress(OSError):
                        self.files.ftruncate(fd, 0)
                finally:
                    with contextlib.suppress(OSError):
                        self.files.close(fd)  # closing the descriptor drops the flock


def _describe_holder(holder: Any) -> str:
    if isinstance(holder, dict):
        return f"process {holder.get('pid')} on {holder.get('host')}"
    return "another process"
