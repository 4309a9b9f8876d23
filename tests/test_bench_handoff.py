"""W19 (harness/bench/_handoff.py): each form really writes its messages, the io_uring
ring reports a failed step as an error, and a machine without io_uring gets a reason."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from harness.bench import _handoff, _uring
from harness.persistence import JsonlBackend

URING_MISSING = _uring.unavailable()


def test_every_form_lands_each_of_its_messages(tmp_path: Path) -> None:
    forms = _handoff.FORMS if URING_MISSING is None else tuple(f for f in _handoff.FORMS if f != "uring")
    samples = _handoff.measure(150, tmp_path, forms)  # two blocks of 100 each
    assert {form: len(values) for form, values in samples.items()} == {form: 2 for form in forms}
    assert all(v > 0 for values in samples.values() for v in values)
    for form in ("inline", "thread", "uring"):
        if form in forms:
            assert (tmp_path / f"{form}.jsonl").read_bytes() == _handoff.LINE * 200, form
    stored = JsonlBackend(tmp_path / "harness").load("w19")
    appended = [r for r in stored.records if r["type"] == "user/message"]
    assert len(appended) == 1 + 200  # the untimed first one, then two blocks


@pytest.mark.skipif(URING_MISSING is not None, reason=f"no io_uring here: {URING_MISSING}")
def test_a_failed_io_uring_step_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "read-only"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    ring = _uring.Ring()
    line = ctypes.create_string_buffer(_handoff.LINE, len(_handoff.LINE))
    try:
        with pytest.raises(OSError, match="io_uring write") as caught:
            trio.run(_handoff._uring_write, ring, fd, ctypes.addressof(line))
        assert caught.value.errno == errno.EBADF
        # The linked fdatasync completed too (cancelled): nothing is left in the ring.
        assert ring.reap() == []
    finally:
        ring.close()
        os.close(fd)
    assert path.read_bytes() == b""


def test_without_io_uring_the_other_forms_are_measured_and_the_reason_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_uring, "unavailable", lambda: "io_uring_setup failed: Operation not permitted")
    results = {r.key: r for r in _handoff.w19(100, 1)}
    assert set(results) == {f"W19-{form}" for form in _handoff.FORMS}
    assert results["W19-uring"].extra == {"unavailable": "io_uring_setup failed: Operation not permitted"}
    for form in ("inline", "thread", "harness"):
        r = results[f"W19-{form}"]
        assert r.extra["blocks"] == 1 and r.extra["per_message_us"] > 0 and r.ratio is not None
    assert results["W19-inline"].extra["ratio_to_inline"] == 1.0


def _open_fds() -> list[str]:
    return sorted(os.listdir("/proc/self/fd"))


def _ring_maps() -> int:
    return Path("/proc/self/maps").read_text().count("io_uring")


def _wrap_syscall(monkeypatch: pytest.MonkeyPatch, hook: Callable[..., int]) -> None:
    real = _uring._libc_syscall()
    monkeypatch.setattr(_uring, "_libc_syscall", lambda: lambda nr, *args: hook(real, nr, *args))


@pytest.mark.skipif(URING_MISSING is not None, reason=f"no io_uring here: {URING_MISSING}")
def test_a_kernel_before_5_6_is_unavailable_not_a_failing_write(monkeypatch: pytest.MonkeyPatch) -> None:
    # Linux 5.4 and 5.5 set a ring up, but have no IORING_OP_WRITE, IOSQE_ASYNC or
    # offset -1: W19 would pass unavailable() and then fail on its first write.
    def before_5_6(real: Any, nr: int, *args: Any) -> int:
        fd: int = real(nr, *args)
        if nr == _uring._SETUP and fd >= 0:
            params = args[1]
            (features,) = struct.unpack_from("I", params, 20)
            struct.pack_into("I", params, 20, features & ~_uring._FEAT_RW_CUR_POS)
        return fd

    _wrap_syscall(monkeypatch, before_5_6)
    fds, maps = _open_fds(), _ring_maps()
    with pytest.raises(OSError, match="RW_CUR_POS"):
        _uring.Ring()
    assert (_open_fds(), _ring_maps()) == (fds, maps)
    assert _uring.unavailable() == "the kernel's io_uring lacks IORING_FEAT_RW_CUR_POS (Linux < 5.6)"


@pytest.mark.skipif(URING_MISSING is not None, reason=f"no io_uring here: {URING_MISSING}")
def test_a_ring_failing_half_way_closes_what_it_opened_and_names_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse_register(real: Any, nr: int, *args: Any) -> int:
        if nr == _uring._REGISTER:
            ctypes.set_errno(errno.EPERM)
            return -1
        result: int = real(nr, *args)
        return result

    _wrap_syscall(monkeypatch, refuse_register)
    fds, maps = _open_fds(), _ring_maps()
    with pytest.raises(OSError, match="io_uring_register") as caught:
        _uring.Ring()
    assert caught.value.errno == errno.EPERM
    assert (_open_fds(), _ring_maps()) == (fds, maps)  # the ring's fd, its eventfd, both mmaps
    # The reason names the step that failed (the setup itself succeeded).
    assert _uring.unavailable() == "io_uring_register(EVENTFD) failed: Operation not permitted"


def test_a_ring_that_cannot_be_set_up_leaves_no_file_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(entries: int = 8) -> _uring.Ring:
        raise OSError(errno.EPERM, "io_uring_setup failed: Operation not permitted")

    monkeypatch.setattr(_uring, "Ring", refused)
    fds = _open_fds()
    with pytest.raises(OSError, match="io_uring_setup"):
        _handoff.measure(100, tmp_path)
    assert _open_fds() == fds  # the three forms' files were opened before the ring


@pytest.mark.skipif(URING_MISSING is not None, reason=f"no io_uring here: {URING_MISSING}")
def test_the_ring_keeps_its_completions_straight_far_past_its_size(tmp_path: Path) -> None:
    # A 2-entry ring (4 completion slots) through 40 messages: the slots wrap 20 and
    # 10 times. Each completion is its own (user_data, result), the file has grown by one
    # line when the wait returns, and a broken ring fails the deadline instead of hanging.
    path = tmp_path / "wrap.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    ring = _uring.Ring(2)
    line = ctypes.create_string_buffer(_handoff.LINE, len(_handoff.LINE))
    size = len(_handoff.LINE)

    async def one(k: int) -> list[tuple[int, int]]:
        ring.prepare(_uring.OP_WRITE, fd, flags=_uring.SQE_IO_LINK, addr=ctypes.addressof(line), length=size, user_data=2 * k + 1)
        ring.prepare(_uring.OP_FSYNC, fd, offset=0, op_flags=_uring.FSYNC_DATASYNC, user_data=2 * k + 2)
        ring.submit()
        got: list[tuple[int, int]] = []
        while len(got) < 2:
            await trio.lowlevel.wait_readable(ring.efd)
            try:
                os.read(ring.efd, 8)
            except BlockingIOError:
                continue
            got.extend(ring.reap())
        return got

    async def main() -> None:
        with trio.fail_after(60):
            for k in range(20):
                assert await one(k) == [(2 * k + 1, size), (2 * k + 2, 0)]
            for k in range(20, 40):
                await _handoff._uring_write(ring, fd, ctypes.addressof(line))
                assert os.fstat(fd).st_size == (k + 1) * size
                assert ring.reap() == []

    try:
        trio.run(main)
    finally:
        ring.close()
        os.close(fd)
    assert path.read_bytes() == _handoff.LINE * 40


def test_off_x86_64_the_ring_is_not_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its completion reads lean on x86-64's load ordering (harness/bench/_uring.py): on
    # arm64 a completion posted after the eventfd's read could be read stale.
    monkeypatch.setattr(_uring.platform, "machine", lambda: "aarch64")
    assert _uring.unavailable() == (
        "this ring's memory ordering holds on x86-64 only (this is aarch64; see harness/bench/_uring.py)"
    )


@pytest.mark.skipif(URING_MISSING is not None, reason=f"no io_uring here: {URING_MISSING}")
def test_more_entries_than_slots_between_submits_is_refused(tmp_path: Path) -> None:
    ring = _uring.Ring(2)
    try:
        ring.prepare(_uring.OP_FSYNC, 0, user_data=1)
        ring.prepare(_uring.OP_FSYNC, 0, user_data=2)
        with pytest.raises(ValueError, match="fill the ring's 2 slots"):
            ring.prepare(_uring.OP_FSYNC, 0, user_data=3)  # would overwrite the first
    finally:
        ring.close()


@pytest.mark.skipif(URING_MISSING is not None, reason=f"no io_uring here: {URING_MISSING}")
def test_a_short_submit_is_an_error_not_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def short(real: Any, nr: int, *args: Any) -> int:
        if nr == _uring._ENTER:
            return 1  # took one of the two, as under memory pressure
        result: int = real(nr, *args)
        return result

    _wrap_syscall(monkeypatch, short)
    fd = os.open(tmp_path / "short.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    ring = _uring.Ring()
    line = ctypes.create_string_buffer(_handoff.LINE, len(_handoff.LINE))
    try:
        with pytest.raises(OSError, match="took 1 of 2 entries"):
            trio.run(_handoff._uring_write, ring, fd, ctypes.addressof(line))
    finally:
        ring.close()
        os.close(fd)


def test_every_workload_has_its_description_and_no_more() -> None:
    from harness.bench._cli import WORKLOADS
    from harness.bench._descriptions import DESCRIPTIONS

    assert set(DESCRIPTIONS) == set(WORKLOADS)
