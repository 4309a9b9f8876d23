"""The JSONL store root lock (``<root>/.root.lock``) under a burst of first writes from
many processes (issue 26, found by bench W18: 8 processes x 50 new sessions on one
root got "the store root lock stayed busy for 10.0 s" on hundreds of first writes).

A waiter gives up only when the lock makes no progress for ``ROOT_LOCK_TIMEOUT``: a
lock that passes from holder to holder (each writes a fresh mark when it takes it) is
waited for however long the queue is. Time is a fake monotonic clock the test moves;
the hand-offs are counted polls, never sleeps."""

from __future__ import annotations

import fcntl
import os
import secrets
import threading
import time
from pathlib import Path

import pytest

from harness.errors import StorageIOError
from harness.persistence import JsonlBackend
from harness.persistence import _jsonl_lock as _jsonl
from tests.helpers import header, rec, user

T = _jsonl.ROOT_LOCK_TIMEOUT


class FakeTime:
    """``time`` for :mod:`harness.persistence._jsonl_lock`: a monotonic clock that moves only
    when the test says, and a ``sleep`` that counts the waiter's polls."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.polls = 0
        self.done = False  # the waiter's thread ended (a poll that will never come)
        self.changed = threading.Condition()

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        with self.changed:
            self.polls += 1
            self.changed.notify_all()
        time.sleep(0.0005)  # only yields; the verdict reads the fake clock

    def after_polls(self, n: int) -> None:
        """Wait until the waiter has polled ``n`` more times (it saw the last change), or
        its thread ended."""
        with self.changed:
            target = self.polls + n
            assert self.changed.wait_for(lambda: self.polls >= target or self.done, timeout=60)  # bounds a broken run


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(_jsonl, "time", fake)
    return fake


def hold_root_lock(root: Path) -> int:
    """Take the root lock as another process does (its own open file description)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / _jsonl.ROOT_LOCKFILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, secrets.token_bytes(8), 0)
    return fd


def create_in_thread(backend: JsonlBackend, sid: str, fake: FakeTime) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            backend.materialize(header(sid), [rec("user/message", 0, user())])
        except BaseException as exc:
            errors.append(exc)
        finally:
            with fake.changed:
                fake.done = True
                fake.changed.notify_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_a_first_write_waits_while_the_root_lock_passes_between_holders(tmp_path: Path, fake_time: FakeTime) -> None:
    root = tmp_path / "root"
    backend = JsonlBackend(root)
    fd = hold_root_lock(root)
    try:
        thread, errors = create_in_thread(backend, "late", fake_time)
        fake_time.after_polls(1)  # it waits for the lock
        for _ in range(3):  # 1.8 x the timeout in all, the lock moving all along
            fake_time.now += 0.6 * T
            os.pwrite(fd, secrets.token_bytes(8), 0)  # the lock passed to another holder
            fake_time.after_polls(2)
        assert thread.is_alive() and not errors, errors
    finally:
        os.close(fd)  # the last holder lets go
    thread.join(60)
    assert not thread.is_alive() and not errors, errors
    assert [r["seq"] for r in backend.load("late").records] == [0]


def test_a_first_write_gives_up_on_a_root_lock_that_does_not_move(tmp_path: Path, fake_time: FakeTime) -> None:
    root = tmp_path / "root"
    backend = JsonlBackend(root)
    fd = hold_root_lock(root)
    try:
        thread, errors = create_in_thread(backend, "stuck", fake_time)
        fake_time.after_polls(1)
        fake_time.now += 0.6 * T
        fake_time.after_polls(2)
        assert thread.is_alive()  # not yet
        fake_time.now += 0.6 * T  # no holder changed for more than the timeout
        thread.join(60)
        assert not thread.is_alive()
    finally:
        os.close(fd)
    [err] = errors
    assert isinstance(err, StorageIOError) and err.code == "STORAGE_IO"
    assert "made no progress" in str(err) and str(root / _jsonl.ROOT_LOCKFILE) in str(err)
    assert backend.locate("stuck") is None  # nothing was written
