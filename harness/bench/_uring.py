"""A minimal io_uring ring over ``ctypes`` (Linux 5.6+), for W19's measurement of a
durable write with no worker thread of ours (decision 0025). Not used by the runtime.
``IORING_OP_WRITE``, ``IOSQE_ASYNC`` and offset -1 (the file's position) came in 5.6
with ``IORING_FEAT_RW_CUR_POS``, which :class:`Ring` requires: on 5.4 and 5.5 a ring sets
up but W19's write would fail, so :func:`unavailable` says so instead.

What it relies on, and why that is enough here:

* **No SQPOLL.** The kernel reads the submission queue inside our own
  ``io_uring_enter``, on the submitting thread, so the entries written before the tail
  (plain stores through ``struct.pack_into``) are seen in program order.
* **x86-64's ordering for the completion queue** (:func:`unavailable` offers the ring
  nowhere else). ``ctypes`` cannot issue the acquire load liburing uses on the
  completion tail, nor the release store on the head. The kernel writes each completion
  before its store-release of the tail, and on x86-64 a load is not reordered with an
  older load, nor a store with an older load (TSO): a tail read shows every completion
  before it, and the head is stored after those completions were read. Reading the
  eventfd first is not enough by itself: the kernel signals it after posting, under the
  eventfd's lock, which the ``read`` takes too, but that covers only the completions
  signalled before the ``read``, while :meth:`Ring.reap` takes every one up to the tail
  it sees (the fdatasync's can be posted in between). On a weakly ordered CPU (arm64)
  such a completion could be read stale.
* **``IOSQE_ASYNC`` on the write.** The kernel runs it on its own worker instead of
  inline in ``io_uring_enter``, so the submitting (Trio) thread does no file I/O; the
  linked fdatasync always runs there.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import struct
import sys
from typing import Any, Final

_SETUP: Final = 425
_ENTER: Final = 426
_REGISTER: Final = 427
_REGISTER_EVENTFD: Final = 4
_FEAT_SINGLE_MMAP: Final = 1
_FEAT_RW_CUR_POS: Final = 8
_OFF_SQES: Final = 0x10000000
_SQE: Final = struct.Struct("BBHiQQIIQHHiQQ")  # struct io_uring_sqe, 64 bytes
_CQE: Final = struct.Struct("QiI")  # struct io_uring_cqe, 16 bytes
_U32: Final = struct.Struct("I")

OP_FSYNC: Final = 3
OP_WRITE: Final = 23
FSYNC_DATASYNC: Final = 1
SQE_IO_LINK: Final = 4
SQE_ASYNC: Final = 16


def unavailable() -> str | None:
    """Why no ring can be set up here (``None``: it can), naming the step that failed."""
    if not sys.platform.startswith("linux"):
        return f"io_uring is Linux only (this is {sys.platform})"
    if (machine := platform.machine()) != "x86_64":
        return f"this ring's memory ordering holds on x86-64 only (this is {machine}; see harness/bench/_uring.py)"
    try:
        Ring(2).close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _libc_syscall() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall


def _failed(step: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{step} failed: {os.strerror(err)}")


class Ring:
    """One ring of ``entries`` submission slots with an eventfd (:attr:`efd`, non-blocking)
    registered for its completions. Single-threaded: one task submits and reaps."""

    def __init__(self, entries: int = 8) -> None:
        self._syscall = _libc_syscall()
        params = ctypes.create_string_buffer(120)  # struct io_uring_params
        fd = self._syscall(_SETUP, ctypes.c_uint(entries), params)
        if fd < 0:
            raise _failed("io_uring_setup")
        self.fd = int(fd)
        self.efd = -1
        try:
            raw = params.raw
            sq_entries, cq_entries, _flags, _cpu, _idle, features = struct.unpack_from("6I", raw, 0)
            sq = struct.unpack_from("7I", raw, 40)  # head, tail, mask, entries, flags, dropped, array
            cq = struct.unpack_from("7I", raw, 80)  # head, tail, mask, entries, overflow, cqes, flags
            for bit, name in ((_FEAT_SINGLE_MMAP, "SINGLE_MMAP"), (_FEAT_RW_CUR_POS, "RW_CUR_POS")):
                if not features & bit:
                    raise OSError(0, f"the kernel's io_uring lacks IORING_FEAT_{name} (Linux < 5.6)")
            size = max(sq[6] + sq_entries * 4, cq[5] + cq_entries * _CQE.size)
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            try:
                self._ring = mmap.mmap(self.fd, size, mmap.MAP_SHARED, prot, offset=0)
                self._sqes = mmap.mmap(self.fd, sq_entries * _SQE.size, mmap.MAP_SHARED, prot, offset=_OFF_SQES)
            except OSError as exc:
                raise OSError(exc.errno, f"io_uring mmap failed: {exc.strerror}") from exc
            self._sq_tail_at, self._sq_mask = sq[1], _U32.unpack_from(self._ring, sq[2])[0]
            self._cq_head_at, self._cq_tail_at, self._cqes_at = cq[0], cq[1], cq[5]
            self._cq_mask = _U32.unpack_from(self._ring, cq[2])[0]
            for i in range(sq_entries):  # slot i of the array names entry i, for good
                _U32.pack_into(self._ring, sq[6] + 4 * i, i)
            self._tail = _U32.unpack_from(self._ring, self._sq_tail_at)[0]
            self._queued = 0
            self._sq_entries = sq_entries
            self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            efd = ctypes.c_int(self.efd)
            if self._syscall(_REGISTER, self.fd, _REGISTER_EVENTFD, ctypes.byref(efd), 1) < 0:
                raise _failed("io_uring_register(EVENTFD)")
        except BaseException:
            self.close()
            raise

    def prepare(self, opcode: int, fd: int, *, flags: int = 0, addr: int = 0, length: int = 0,
                offset: int = -1, op_flags: int = 0, user_data: int = 0) -> None:
        """Fill the next submission entry (sent by :meth:`submit`). ``offset=-1``: the
        file's position (an ``O_APPEND`` file appends). More entries than the ring has
        slots between two submits is a ``ValueError`` (they would overwrite each other)."""
        if self._queued >= self._sq_entries:
            raise ValueError(f"io_uring: {self._queued} entries prepared and not submitted fill the ring's {self._sq_entries} slots")
        slot = self._tail & self._sq_mask
        _SQE.pack_into(self._sqes, slot * _SQE.size, opcode, flags, 0, fd, offset & 0xFFFF_FFFF_FFFF_FFFF,
                       addr, length, op_flags, user_data, 0, 0, 0, 0, 0)
        self._tail = (self._tail + 1) & 0xFFFF_FFFF
        self._queued += 1

    def submit(self) -> None:
        """Publish the prepared entries and hand them to the kernel (returns at once:
        no completion is waited for)."""
        _U32.pack_into(self._ring, self._sq_tail_at, self._tail)
        count, self._queued = self._queued, 0
        taken = self._syscall(_ENTER, self.fd, count, 0, 0, None, 0)
        if taken < 0:
            raise _failed("io_uring_enter")
        if taken != count:  # the kernel ran short (memory): the wait for the rest would hang
            raise OSError(0, f"io_uring_enter took {taken} of {count} entries")

    def reap(self) -> list[tuple[int, int]]:
        """The completions posted so far, as ``(user_data, result)``; read the eventfd
        first (see the module)."""
        head = _U32.unpack_from(self._ring, self._cq_head_at)[0]
        tail = _U32.unpack_from(self._ring, self._cq_tail_at)[0]
        out: list[tuple[int, int]] = []
        while head != tail:
            user_data, result, _flags = _CQE.unpack_from(self._ring, self._cqes_at + (head & self._cq_mask) * _CQE.size)
            out.append((user_data, result))
            head = (head + 1) & 0xFFFF_FFFF
        _U32.pack_into(self._ring, self._cq_head_at, head)
        return out

    def close(self) -> None:
        for name in ("_sqes", "_ring"):
            mapped = getattr(self, name, None)
            if mapped is not None:
                mapped.close()
        if self.efd >= 0:
            os.close(self.efd)
            self.efd = -1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
