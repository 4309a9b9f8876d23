"""The bounded storage call of the writer (``run_storage_call``, issue 15): one thread
hop on the common path, the bound on both clocks, shielded from the caller."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from harness.persistence import JsonlBackend, open_persistence
from harness.persistence import _writer as writer_module
from harness.persistence._writer import WaitOverrun, run_storage_call
from harness.runtime import open_store


async def test_the_result_and_the_exception_come_back() -> None:
    assert await run_storage_call(lambda: 41 + 1) == 42

    def boom() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        await run_storage_call(boom)


async def test_a_virtual_clock_that_jumps_is_not_an_overrun(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Trio half of the bound passes at once (the clock jumps while the thread
    # sleeps); the wall clock has not: the call still completes. The wall clock is
    # the test's own, standing still (a real one races the machine's load).
    monkeypatch.setattr(writer_module, "WRITE_WAIT_LIMIT", 0.2)
    monkeypatch.setattr(writer_module, "wall_clock", lambda: 0.0)

    def slow() -> str:
        time.sleep(0.05)
        return "done"

    assert await run_storage_call(slow) == "done"


async def test_a_real_overrun_abandons_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "WRITE_WAIT_LIMIT", 0.1)
    gate = threading.Event()
    finished = threading.Event()

    def stuck() -> None:
        gate.wait(60)
        finished.set()

    with pytest.raises(WaitOverrun):
        await run_storage_call(stuck)
    assert not finished.is_set()  # given up on, not waited out (the gate is still shut)
    gate.set()
    assert await trio.to_thread.run_sync(finished.wait, 5)  # the thread ran on


async def test_the_caller_s_cancellation_does_not_cut_the_call() -> None:
    done: list[int] = []

    def work() -> None:
        time.sleep(0.05)
        done.append(1)

    with trio.CancelScope() as scope:
        scope.cancel()
        await run_storage_call(work)  # shielded: runs to its end
        await trio.lowlevel.checkpoint()  # the cancellation lands here
        pytest.fail("not cancelled")
    assert done == [1]


async def test_a_call_queued_behind_the_limiter(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Queued for a worker thread while the virtual clock jumps: it is queued again
    # (never run twice) as long as the wall clock says the bound has not passed. The
    # wall clock is the test's own (issue 24 §5: with the real one, a loaded machine
    # delivered the first thread's token late enough to give up, even at a 2 s bound):
    # it stands still, and its first reading -- the call's first withdrawal and
    # requeue -- is what lets the thread holding the token go.
    limiter = trio.CapacityLimiter(1)
    gate = threading.Event()
    readings: list[float] = []

    def wall() -> float:
        readings.append(0.0)
        if len(readings) == 2:  # the first reading after the start: a requeue
            gate.set()
        return 0.0

    monkeypatch.setattr(writer_module, "wall_clock", wall)
    monkeypatch.setattr(writer_module, "WRITE_WAIT_LIMIT", 0.3)
    runs: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: trio.to_thread.run_sync(gate.wait, 60, limiter=limiter))
        await trio.testing.wait_all_tasks_blocked()

        def work() -> str:
            runs.append(1)
            return "ok"

        assert await run_storage_call(work, limiter=limiter) == "ok"
    assert runs == [1]
    assert len(readings) >= 2  # it was withdrawn and queued again at least once


async def test_a_queued_call_gives_up_when_the_wall_clock_says_so(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other side of the bound, on the injected wall clock: once it has passed,
    # the call still queued is withdrawn for good (it never runs).
    limiter = trio.CapacityLimiter(1)
    gate = threading.Event()
    now = [0.0]

    def wall() -> float:
        now[0] += 0.2  # each reading: 0.2 s later
        return now[0]

    monkeypatch.setattr(writer_module, "wall_clock", wall)
    monkeypatch.setattr(writer_module, "WRITE_WAIT_LIMIT", 1.0)
    runs: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: trio.to_thread.run_sync(gate.wait, 60, limiter=limiter))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(WaitOverrun, match=r"still queued after 1\.0 s"):
            await run_storage_call(lambda: runs.append(1), limiter=limiter)
        gate.set()
    assert runs == []


async def test_a_call_that_never_got_a_thread_never_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "WRITE_WAIT_LIMIT", 0.1)
    limiter = trio.CapacityLimiter(1)
    gate = threading.Event()
    runs: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: trio.to_thread.run_sync(gate.wait, 5, limiter=limiter))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(WaitOverrun):
            await run_storage_call(lambda: runs.append(1), limiter=limiter)
        gate.set()
    await trio.sleep(0.05)
    assert runs == []


async def test_the_window_task_is_reused_then_ends_when_idle(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=0.2) as p:
        s = await store.create("w", cwd="/proj")
        await s.append("feedback/record", {"i": 0})
        writer = p._writers["w"]
        assert writer._window_task  # armed by the first event
        await s.flush()  # takes the window over; the task stays for the next one
        await s.append("feedback/record", {"i": 1})
        assert writer._window_task and writer.durable < writer.queued
        t0 = trio.current_time()
        for _ in range(100_000):  # the write-behind window still fires (on a thread: poll)
            if writer.durable == writer.queued:
                break
            await trio.sleep(0.01)
        assert writer.durable == writer.queued and trio.current_time() - t0 >= 0.2 - 1e-9
        await trio.sleep(writer_module.WINDOW_TASK_LINGER + 1)
        assert not writer._window_task  # idle: no task held
        await s.append("feedback/record", {"i": 2})
        assert writer._window_task  # the next window starts a new one
        await s.flush()
    assert [r["data"]["i"] for r in JsonlBackend(tmp_path).load("w").records if r["type"] == "feedback/record"] == [0, 1, 2]
