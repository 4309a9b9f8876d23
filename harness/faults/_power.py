"""Power loss at a chosen file operation, for the JSONL backend.

:class:`PowerLossFiles` stops the world at the k-th crash point (a write, fsync, syncfs,
ftruncate, link, rename or directory fsync): that operation and every later one
raise :class:`SimulatedCrash`. After the run, :meth:`PowerLossFiles.apply` rewrites the
disk the way a power cut could have left it, given what was made durable:

* file data: bytes written since the file's last ``fsync`` are either dropped (the
  file is back to its durable content, including bytes an un-fsynced truncate cut)
  or torn at a random offset (a prefix of them survives);
* directory entries created, linked, renamed or unlinked since the last ``fsync`` of
  their directory may be lost. Metadata is journaled in order, so the model keeps a
  random prefix of those non-durable operations and undoes the rest (newest first):
  a created/linked name disappears, an unlinked name reappears (the layer keeps a
  hidden hard link to each unlinked file until :meth:`apply`), a rename goes back,
  a created directory vanishes with its contents.

Simplifications (documented on purpose): data is modelled as append-only (true for
the JSONL backend: logs are opened ``O_APPEND``, lock files are rewritten from
offset 0 after a truncate to 0); a torn write keeps a byte prefix, never a mix of
old and new pages; a rename is durable once the destination's directory is fsynced.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import stat
from collections.abc import Collection, Sequence
from typing import Final

import attrs

from harness.faults._files import FaultyFiles
from harness.persistence._files import OsFiles, SimulatedCrash

#: The operations a power cut can interrupt meaningfully (counted by ``crash_at``).
POWER_LOSS_KINDS: Final = frozenset({"write", "fsync", "syncfs", "ftruncate", "link", "rename", "fsync_dir"})

_STASH_PREFIX: Final = ".powerloss-"


@attrs.define
class _Content:
    """What is durable of one inode's data."""

    durable: int  # size as of the last fsync (or when first seen)
    saved_from: int | None = None  # an un-fsynced truncate cut durable bytes from here on
    saved: bytes = b""  # ... and these were they (durable content [saved_from:durable])
    names: set[str] = attrs.Factory(set)


@attrs.define
class _DirOp:
    kind: str  # "create" | "link" | "mkdir" | "unlink" | "rename"
    path: str  # the name created / removed (the destination of a rename)
    src: str | None = None  # a rename's source
    stash: str | None = None  # hidden hard link keeping an unlinked/overwritten inode
    durable: bool = False


class PowerLossFiles(FaultyFiles):
    """A :class:`FaultyFiles` that crashes at the ``crash_at``-th counted operation
    (counted over ``kinds``, by default :data:`POWER_LOSS_KINDS`; ``None``: never, a
    dry run to learn :attr:`count`) and records what a power cut could undo.

    After the crash every operation raises :class:`SimulatedCrash` (``close`` still
    closes the descriptor, so runs do not leak them). ``fail_at`` / ``error`` still
    inject ``OSError`` failures as in :class:`FaultyFiles`, on the same count.

    Call :meth:`apply` once after the run, from a plain thread (not Trio's), before
    reading the disk: it closes descriptors the "dead" process still held (dropping
    its ``flock``\\ s) and rewrites the disk as the power cut left it.
    """

    def __init__(
        self,
        *,
        crash_at: int | None = None,
        fail_at: int | None = None,
        error: int = errno.EIO,
        kinds: Collection[str] | None = None,
        partial: bool = True,
    ) -> None:
        super().__init__(
            fail_at=fail_at, error=error, kinds=POWER_LOSS_KINDS if kinds is None else kinds, partial=partial
        )
        self.crash_at = crash_at
        self.crashed = False
        self.crash_op: tuple[str, str] | None = None  # the operation that did not happen
        self.applied = False
        self._open: dict[int, int] = {}  # fd -> inode, for descriptors still open
        self._content: dict[int, _Content] = {}  # inode -> durability state
        self._dirops: list[_DirOp] = []
        self._stashes = 0

    # -- the crash -------------------------------------------------------------------------

    def _before(self, kind: str, path: str) -> bool:
        with self._mutex:
            if self.crashed:
                raise SimulatedCrash(f"the world stopped before {kind} {path}")
            fail = super()._before(kind, path)
            if kind in self.kinds and self.crash_at is not None and self.count == self.crash_at:
                self.crashed = True
                self.crash_op = (kind, path)
                raise SimulatedCrash(f"power lost at operation {self.count}: {kind} {path}")
            return fail

    # -- tracked operations ----------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        existed = os.path.lexists(path)
        fd = super().open(path, flags, mode)
        st = os.fstat(fd)
        with self._mutex:
            self._open[fd] = st.st_ino
            if stat.S_ISREG(st.st_mode):
                content = self._content.setdefault(st.st_ino, _Content(durable=0 if not existed else st.st_size))
                content.names.add(path)
            if not existed:
                self._dirops.append(_DirOp("create", path))
        return fd

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self._mark_durable(fd)

    def _mark_durable(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        with self._mutex:
            content = self._content.get(self._open.get(fd, -1))
            if content is not None:
                content.durable = size
                content.saved_from, content.saved = None, b""

    def syncfs(self, fds: Sequence[int]) -> None:
        # The real call writes back the whole filesystem; only the round's own files
        # are counted durable here, which is all the backends rely on (a test that
        # passes under the narrower promise passes under the real one).
        super().syncfs(fds)
        for fd in fds:
            self._mark_durable(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        path = self._describe(fd)
        if self._before("ftruncate", path):
            raise self._fail("ftruncate", path)
        with self._mutex:
            content = self._content.get(self._open.get(fd, -1))
            if content is not None:
                low = content.durable if content.saved_from is None else content.saved_from
                if size < low:
                    # Bytes below ``low`` are untouched durable content (append-only
                    # model): keep them so a power cut can undo the truncate.
                    content.saved = os.pread(fd, low - size, size) + content.saved
                    content.saved_from = size
        OsFiles.ftruncate(self, fd, size)

    def close(self, fd: int) -> None:
        with self._mutex:
            self._open.pop(fd, None)
        try:
            super().close(fd)
        except SimulatedCrash:
            with contextlib.suppress(OSError):
                os.close(fd)  # a dead process's descriptors are closed by the OS
            raise

    def link(self, src: str, dst: str) -> None:
        super().link(src, dst)
        with self._mutex:
            self._add_name(dst)
            self._dirops.append(_DirOp("link", dst))

    def rename(self, src: str, dst: str) -> None:
        if self._before("rename", dst):
            raise self._fail("rename", dst)
        stash = self._stash(dst) if os.path.lexists(dst) else None
        OsFiles.rename(self, src, dst)
        with self._mutex:
            self._add_name(dst)
            self._dirops.append(_DirOp("rename", dst, src=src, stash=stash))

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        super().mkdir(path, mode)
        with self._mutex:
            self._dirops.append(_DirOp("mkdir", path))

    def unlink(self, path: str) -> None:
        if self._before("unlink", path):
            raise self._fail("unlink", path)
        stash = self._stash(path)
        try:
            OsFiles.unlink(self, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(stash)
            raise
        with self._mutex:
            self._dirops.append(_DirOp("unlink", path, stash=stash))

    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        real = os.path.realpath(path)
        with self._mutex:
            for op in self._dirops:
                if not op.durable and os.path.realpath(os.path.dirname(op.path)) == real:
                    op.durable = True

    def _add_name(self, path: str) -> None:
        with contextlib.suppress(OSError):
            content = self._content.get(os.stat(path).st_ino)
            if content is not None:
                content.names.add(path)

    def _stash(self, path: str) -> str:
        """A hidden hard link keeping ``path``'s inode, so :meth:`apply` can bring the
        name back if the power cut undoes its removal."""
        with self._mutex:
            self._stashes += 1
            stash = os.path.join(os.path.dirname(path), f"{_STASH_PREFIX}{os.getpid()}-{self._stashes}")
        os.link(path, stash)
        self._add_name(stash)
        return stash

    # -- after the run ---------------------------------------------------------------------

    def apply(self, rng: random.Random) -> None:
        """Rewrite the disk as the power cut left it (see the module docstring).

        Blocking; call it once, after the run, from a plain thread. Also closes the
        descriptors the crashed run still held (the OS would have), releasing locks.
        """
        with self._mutex:
            if self.applied:
                raise RuntimeError("PowerLossFiles.apply() was already called")
            self.applied = True
            self.crashed = True  # the world stays stopped for anything still running
            for fd in list(self._open):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._open.clear()
            for ino, content in self._content.items():
                self._settle_content(rng, ino, content)
            pending = [op for op in self._dirops if not op.durable]
            keep = rng.randint(0, len(pending))
            for op in reversed(pending[keep:]):
                _undo(op)
            for op in self._dirops:
                if op.stash is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(op.stash)

    @staticmethod
    def _settle_content(rng: random.Random, ino: int, content: _Content) -> None:
        path = next((p for p in sorted(content.names) if _is_inode(p, ino)), None)
        if path is None:
            return
        size = os.stat(path).st_size
        low = content.durable if content.saved_from is None else content.saved_from
        if content.saved_from is None and size == low:
            return  # nothing un-fsynced
        fd = os.open(path, os.O_WRONLY)
        try:
            if rng.random() < 0.5:
                # Dropped: back to exactly the durable content.
                os.ftruncate(fd, low)
                if content.saved:
                    os.pwrite(fd, content.saved, low)
            else:
                # Torn: the truncate (if any) stuck, and a prefix of the later writes.
                os.ftruncate(fd, rng.randint(low, max(low, size)))
        finally:
            os.close(fd)


def _is_inode(path: str, ino: int) -> bool:
    try:
        return os.stat(path).st_ino == ino
    except OSError:
        return False


def _undo(op: _DirOp) -> None:
    """Undo one non-durable directory operation (the disk is no longer in use)."""
    if op.kind in ("create", "link"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(op.path)
    elif op.kind == "mkdir":
        shutil.rmtree(op.path, ignore_errors=True)
    elif op.kind == "unlink":
        if op.stash is not None and not os.path.lexists(op.path):
            with contextlib.suppress(FileNotFoundError):
                os.rename(op.stash, op.path)
    elif op.kind == "rename":
        if op.src is not None and os.path.lexists(op.path):
            with contextlib.suppress(FileNotFoundError):
                os.rename(op.path, op.src)
        if op.stash is not None:
            with contextlib.suppress(FileNotFoundError):
                os.rename(op.stash, op.path)
