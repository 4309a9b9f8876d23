"""The Trio-thread cost of a durable flush (issue 26, W9/W17): one schedule point per
flush that writes (its wait for the round), not three (the barrier checkpoint, the
writer lock's checkpoint, the wait), and no cancel scope per flush (the bounded,
shielded wait is kept by one watchdog task per committer). These pin the structure
(task steps, counted by an instrument: deterministic, not timed) and that the contracts
stay: a flush is a checkpoint, a cancelled caller writes nothing, the bound holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import Owner
from harness.errors import FlushError
from harness.persistence import JsonlBackend, open_persistence
from harness.persistence import _writer as writer_module
from harness.runtime import SessionHandle, open_store
from harness.runtime._listeners import DirectFlush
from tests.test_group_commit import (
    GatedJsonl,
    bounded_waits,
    flush_held,
    on_disk,
    sessions,
    started,
    wedge_collector,
)


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


async def _steps_of_flushes(h: SessionHandle, count: int, *, append: bool) -> int:
    """Task steps while ``count`` flushes run (each after an append if ``append``)."""
    total = 0
    for i in range(count):
        if append:
            await h.append("feedback/record", i)
        steps = _Steps()
        trio.lowlevel.add_instrument(steps)
        try:
            await h.flush()
        finally:
            trio.lowlevel.remove_instrument(steps)
        total += steps.steps
    return total


async def test_a_durable_flush_is_two_task_steps(tmp_path: Path) -> None:
    # The flusher submits its batch and parks once: the round's completion (one
    # ``run_sync_soon`` callback) is one step, the flusher's resumption the other. The
    # old path took four: a barrier checkpoint and the writer lock's checkpoint
    # before the park, each a whole scheduler pass.
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000) as p:
        (h,) = await sessions(store, "s")  # the first write (header, file): not counted
        await trio.testing.wait_all_tasks_blocked()
        rounds = p.committer.rounds
        assert await _steps_of_flushes(h, 10, append=True) == 20
        assert p.committer.rounds == rounds + 10  # each flush did write
    assert on_disk(tmp_path, "s")[-10:] == list(range(10))


async def test_a_flush_with_nothing_to_write_is_one_step(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000) as p:
        (h,) = await sessions(store, "s")
        await trio.testing.wait_all_tasks_blocked()
        rounds = p.committer.rounds
        assert await _steps_of_flushes(h, 10, append=False) == 10
        assert p.committer.rounds == rounds


@pytest.mark.parametrize("append", [True, False], ids=["writes", "nothing-to-write"])
async def test_a_flush_is_a_checkpoint(tmp_path: Path, append: bool) -> None:
    # A cancel point and a schedule point, whether it writes (the wait is its only
    # schedule point) or not (one added), and whether persistence hears the session.
    async with open_store() as store:
        bare = await store.create("bare", cwd="/w")
        with trio.testing.assert_checkpoints():
            assert await bare.flush() is False  # no flush listener
        async with open_persistence(store, JsonlBackend(tmp_path), write_delay=1000):
            (h,) = await sessions(store, "s")
            if append:
                await h.append("feedback/record", 1)
            with trio.testing.assert_checkpoints():
                assert await h.flush() is True


async def test_a_cancelled_flush_writes_nothing_and_a_later_one_does(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000) as p:
        (h,) = await sessions(store, "s")
        await h.append("feedback/record", 1)
        rounds = p.committer.rounds
        with trio.CancelScope() as scope:
            scope.cancel()
            await h.flush()
            pytest.fail("not cancelled")
        assert p.committer.rounds == rounds and on_disk(tmp_path, "s") == [0]
        await h.flush()
        assert on_disk(tmp_path, "s") == [0, 1]


async def test_a_cancelled_waiter_returns_once_its_batch_is_durable(tmp_path: Path) -> None:
    # The wait is shielded by its abort function (no cancel scope): the flush returns
    # when the round comes back, and the cancellation lands at the next checkpoint.
    backend = GatedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=1000):
        (h,) = await sessions(store, "s")
        await h.append("feedback/record", 1)
        backend.gate.clear()
        returned: list[bool] = []
        async with trio.open_nursery() as n:

            async def flush() -> None:
                with trio.CancelScope() as scope:
                    waiter_scope.append(scope)
                    await h.flush()
                    returned.append(True)
                    await trio.lowlevel.checkpoint()
                    returned.append(False)  # not reached: cancelled

            waiter_scope: list[trio.CancelScope] = []
            n.start_soon(flush)
            await started(backend)
            waiter_scope[0].cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert returned == []  # still waiting for its round
            backend.gate.set()
        assert returned == [True]
    assert on_disk(tmp_path, "s") == [0, 1]


async def test_a_shorter_bound_set_later_still_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    # The watchdog sleeps until the earliest deadline it knows; a wait with an earlier
    # one (the bound lowered meanwhile) wakes it sooner. Both clocks bound each wait.
    clock = mock_clock
    wall = bounded_waits(monkeypatch, 10.0)
    backend = GatedJsonl(tmp_path)
    errors: dict[str, BaseException] = {}
    flush = wedge_collector(errors)

    try:
        async with open_store() as store:
            with pytest.raises(Exception, match="closing failed"):
                async with open_persistence(store, backend, write_delay=60) as p:
                    a, b = await sessions(store, "a", "b")
                    backend.gate.clear()
                    async with trio.open_nursery() as n:
                        await a.append("feedback/record", 1)
                        n.start_soon(flush, a)  # bound 10 s
                        await started(backend)
                        monkeypatch.setattr(writer_module, "WRITE_WAIT_LIMIT", 1.0)
                        await b.append("feedback/record", 1)
                        n.start_soon(flush, b)  # bound 1 s, queued behind a's round
                        await trio.testing.wait_all_tasks_blocked()
                        wall[0] = 2.0
                        clock.jump(2)
                        await trio.testing.wait_all_tasks_blocked()
                        assert set(errors) == {"b"} and p._writers["a"].wedged is None
                        wall[0] = 11.0
                        clock.jump(9)
                    assert set(errors) == {"a", "b"}
                    backend.gate.set()
                    await trio.to_thread.run_sync(lambda: None)
                    await trio.testing.wait_all_tasks_blocked()
    finally:
        backend.gate.set()
    assert on_disk(tmp_path, "b") == [0]  # withdrawn before a round took it


async def test_the_watchdog_ends_when_nothing_is_watched(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000) as p:
        (h,) = await sessions(store, "s")
        assert p.committer._watching  # lingers until the last deadline it saw
        mock_clock.jump(writer_module.WRITE_WAIT_LIMIT + 1)
        await trio.testing.wait_all_tasks_blocked()
        assert not p.committer._watching and not p.committer._watched
        await h.append("feedback/record", 1)
        await h.flush()  # a new wait starts a new one
        assert p.committer._watching
    assert on_disk(tmp_path, "s") == [0, 1]


async def test_the_watchdog_ends_with_the_persistence(tmp_path: Path) -> None:
    # It lingers between flushes (not one task per flush), but no task outlives the
    # persistence's block (the chaos scenarios check that no task is left).
    async with open_store() as store:
        async with open_persistence(store, JsonlBackend(tmp_path), write_delay=1000) as p:
            (h,) = await sessions(store, "s")
            await h.append("feedback/record", 1)
            await h.flush()
            assert p.committer._watching
        await trio.testing.wait_all_tasks_blocked()
        assert not p.committer._watching


async def test_events_appended_while_a_flush_writes_are_durable_when_it_returns(tmp_path: Path) -> None:
    # The direct flush (the persistence's only listener, an idle session) writes one
    # batch in its own frame; what was enqueued meanwhile is written before it returns
    # (SessionWriter.flush: "enqueued before the call and while it runs").
    backend = GatedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=1000) as p:
        (h,) = await sessions(store, "s")
        assert store.listeners.flush.direct is not None
        await h.append("feedback/record", 1)
        rounds = p.committer.rounds
        async with flush_held(backend, h, after=lambda: on_disk(tmp_path, "s")) as held:
            await h.append("feedback/record", 2)  # while the batch of 1 is written
        assert held.results == [True, [0, 1, 2]]
        assert p.committer.rounds == rounds + 2


async def test_a_concurrent_flush_shares_the_barrier(tmp_path: Path) -> None:
    # A second flusher finds the writer's lock taken by a direct flush: it waits for
    # it, then writes what is left; neither returns before its own events are durable.
    backend = GatedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=1000):
        (h,) = await sessions(store, "s")
        await h.append("feedback/record", 1)
        second: list[list[Any]] = []

        async def flush_second() -> None:
            await h.flush()
            second.append(on_disk(tmp_path, "s"))

        async with flush_held(backend, h, after=lambda: on_disk(tmp_path, "s")) as first:
            await h.append("feedback/record", 2)
            first.nursery.start_soon(flush_second)
            await trio.testing.wait_all_tasks_blocked()
            assert first.results == [] and second == []
        assert first.results == [True, [0, 1, 2]] and second == [[0, 1, 2]]


async def test_another_flush_listener_turns_the_direct_flush_off(tmp_path: Path) -> None:
    # The store calls the persistence's direct form only while it is the only flush
    # registration, unscoped; with another listener both are called, through the
    # general path; unsubscribed, the direct form is back.
    heard: list[str] = []
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000):
        (h,) = await sessions(store, "s")
        assert store.listeners.flush.direct is not None
        unsubscribe = store.on_flush(lambda handle: heard.append(handle.id))
        assert store.listeners.flush.direct is None
        await h.append("feedback/record", 1)
        with trio.testing.assert_checkpoints():
            assert await h.flush() is True
        assert heard == ["s"] and on_disk(tmp_path, "s") == [0, 1]
        unsubscribe()
        assert store.listeners.flush.direct is not None
        await h.append("feedback/record", 2)
        assert await h.flush() is True
        assert heard == ["s"] and on_disk(tmp_path, "s") == [0, 1, 2]
        async with Owner("o") as scope:
            store.on_flush(DirectFlush(lambda handle: None, lambda handle: None), scope=scope)
            assert store.listeners.flush.direct is None  # two registrations, one scoped


async def test_a_failed_direct_write_is_a_flush_error_and_retried(tmp_path: Path) -> None:
    # The direct flush maps a failed round as the general path does: a typed
    # FlushError, the batch kept (and the lock released), written by the next flush.
    backend = GatedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=1000):
        (h,) = await sessions(store, "s")
        await h.append("feedback/record", 1)
        backend.fail_round = True
        with trio.testing.assert_checkpoints(), pytest.raises(FlushError):
            await h.flush()
        backend.fail_round = False
        await h.flush()
        assert on_disk(tmp_path, "s") == [0, 1]
