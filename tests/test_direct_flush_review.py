"""Review of the direct flush path (decision 0020): the same results, errors and
cancellation contract as the general path it replaces, under the races the general
path is known to survive. Every test runs on both paths: ``direct`` (the store calls
``DirectFlush.direct``) and ``general`` (the same single persistence listener through
``Listeners.run_flush``, the path before 0020), so a difference between them fails."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from harness.errors import FlushError, PersistenceCloseError, SessionNotLiveError, WriterWedgedError
from harness.persistence import open_persistence
from harness.persistence._coordinator import Persistence
from harness.persistence._writer import SessionWriter
from harness.runtime import Store, open_store
from tests.test_group_commit import (
    GatedJsonl,
    bounded_waits,
    flush_held,
    on_disk,
    sessions,
    started,
)

PATHS = ["direct", "general"]


def choose(store: Store, path: str) -> None:
    """Keep the persistence's listener on ``path`` (``general``: the store resolves no
    direct form, as before decision 0020; recomputed only on a (un)registration)."""
    assert store.listeners.flush.direct is not None
    if path == "general":
        store.listeners.flush.direct = None


@asynccontextmanager
async def gated(tmp_path: Path, path: str) -> AsyncIterator[tuple[GatedJsonl, Store, Persistence]]:
    """A store with a persistence on a ``GatedJsonl`` whose flush listener is on
    ``path``; the gate is opened on the way out, so a failing test never leaves a round
    held."""
    backend = GatedJsonl(tmp_path)
    try:
        async with open_store() as store, open_persistence(store, backend, write_delay=1000) as p:
            choose(store, path)
            yield backend, store, p
    finally:
        backend.gate.set()


class Spy:
    """Counts which of the writer's flush entries ran (so a test proves the path it says)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        direct, general = SessionWriter.flush_direct, SessionWriter.flush

        async def flush_direct(w: SessionWriter, shielded: bool = False) -> None:
            self.calls.append("direct")
            await direct(w, shielded)

        async def flush(w: SessionWriter) -> None:
            self.calls.append("flush")
            await general(w)

        monkeypatch.setattr(SessionWriter, "flush_direct", flush_direct)
        monkeypatch.setattr(SessionWriter, "flush", flush)


def writer_of(p: Persistence, sid: str) -> SessionWriter:
    return p._writers[sid]




@pytest.mark.parametrize("path", PATHS)
async def test_a_wall_clock_overrun_wedges_the_writer_on_either_path(
    tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    wall = bounded_waits(monkeypatch, 10.0)
    backend = GatedJsonl(tmp_path)
    errors: list[BaseException] = []
    try:
        async with open_store() as store:
            with pytest.raises(Exception, match="closing failed"):
                async with open_persistence(store, backend, write_delay=1000) as p:
                    choose(store, path)
                    (h,) = await sessions(store, "s")
                    w = writer_of(p, "s")
                    await h.append("feedback/record", 1)
                    backend.gate.clear()
                    async with trio.open_nursery() as n:

                        async def flush() -> None:
                            try:
                                await h.flush()
                            except WriterWedgedError as exc:
                                errors.append(exc)

                        n.start_soon(flush)
                        await started(backend)
                        wall[0] = 11.0
                        mock_clock.jump(11)
                    assert len(errors) == 1 and w.wedged is not None
                    assert not w._lock.locked() and len(w.pending) == 1  # the batch is kept
                    with pytest.raises(WriterWedgedError), trio.testing.assert_checkpoints():
                        await h.flush()  # fails closed for good
                    backend.gate.set()
                    await trio.to_thread.run_sync(lambda: None)
                    await trio.testing.wait_all_tasks_blocked()
    finally:
        backend.gate.set()


@pytest.mark.parametrize("path", PATHS)
async def test_a_trio_clock_jump_alone_does_not_wedge(
    tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    # The watchdog wakes the wait at the Trio-clock bound; the wall clock says the bound
    # has not passed: it waits again (``_wait_out``) and returns once the round is back.
    bounded_waits(monkeypatch, 10.0)
    async with gated(tmp_path, path) as (backend, store, p):
        (h,) = await sessions(store, "s")
        await h.append("feedback/record", 1)
        async with flush_held(backend, h) as held:
            mock_clock.jump(11)
            await trio.testing.wait_all_tasks_blocked()
            assert held.results == [] and writer_of(p, "s").wedged is None
            mock_clock.jump(11)  # twice: the second wait is bounded too
            await trio.testing.wait_all_tasks_blocked()
            assert held.results == []
        assert held.results == [True] and on_disk(tmp_path, "s") == [0, 1]


@pytest.mark.parametrize("path", PATHS)
async def test_a_detach_racing_a_flush_in_flight(tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The flush took the writer's lock and waits for its round; the session is detached
    # meanwhile (its retirement waits for the lock). The flush returns, durable; the
    # retirement writes what was appended after the flush started, and frees the lock.
    spy = Spy(monkeypatch)
    async with gated(tmp_path, path) as (backend, store, p):
        (h,) = await sessions(store, "s")
        header = h.header.to_record()
        await h.append("feedback/record", 1)
        spy.calls.clear()
        async with flush_held(backend, h, after=lambda: on_disk(tmp_path, "s")) as held:
            await h.append("feedback/record", 2)
            await store.detach(h)
            with pytest.raises(SessionNotLiveError):
                await h.flush()
        assert spy.calls[0] == ("direct" if path == "direct" else "flush")
        returned = held.results
        assert returned[0] is True and returned[1][:2] == [0, 1]
        await p.wait_retired("s")
        assert on_disk(tmp_path, "s") == [0, 1, 2]
        assert not backend.lock_held(header)


@pytest.mark.parametrize("path", PATHS)
async def test_a_close_racing_a_flush_in_flight(tmp_path: Path, path: str) -> None:
    # ``aclose`` unsubscribes (the direct form goes) and retires the writer while a flush
    # waits for its round: both end cleanly, nothing is lost, the lock is freed.
    backend = GatedJsonl(tmp_path)
    try:
        async with open_store() as store:
            async with open_persistence(store, backend, write_delay=1000) as p:
                choose(store, path)
                (h,) = await sessions(store, "s")
                header = h.header.to_record()
                await h.append("feedback/record", 1)
                async with flush_held(backend, h) as held:
                    await h.append("feedback/record", 2)
                    held.nursery.start_soon(p.aclose)
                    await trio.testing.wait_all_tasks_blocked()
                    assert store.listeners.flush.direct is None and len(store.listeners.flush) == 0
                assert held.results == [True]
                assert await h.flush() is False  # nobody listens any more
            assert on_disk(tmp_path, "s") == [0, 1, 2]
            assert not backend.lock_held(header)
    finally:
        backend.gate.set()


@pytest.mark.parametrize("path", PATHS)
async def test_a_listener_registered_during_a_flush_is_not_called_by_it(tmp_path: Path, path: str) -> None:
    # The listeners a flush runs are decided when it starts, on both paths; the next
    # flush runs both (the direct form is off while two are registered).
    heard: list[str] = []
    async with gated(tmp_path, path) as (backend, store, _):
        (h,) = await sessions(store, "s")
        await h.append("feedback/record", 1)
        async with flush_held(backend, h) as held:
            unsubscribe = store.on_flush(lambda handle: heard.append(handle.id))
            assert store.listeners.flush.direct is None
        assert held.results == [True] and heard == [] and on_disk(tmp_path, "s") == [0, 1]
        await h.append("feedback/record", 2)
        assert await h.flush() is True
        assert heard == ["s"] and on_disk(tmp_path, "s") == [0, 1, 2]
        unsubscribe()
        assert store.listeners.flush.direct is not None  # back (also for `general`)


@pytest.mark.parametrize("path", PATHS)
async def test_the_persistence_unsubscribed_during_a_flush(tmp_path: Path, path: str) -> None:
    # The only flush listener removed while its flush is in flight (the store's direct
    # form gone): that flush still ends as it began, durable.
    async with gated(tmp_path, path) as (backend, store, p):
        (h,) = await sessions(store, "s")
        await h.append("feedback/record", 1)
        async with flush_held(backend, h) as held:
            for f in p._unsubscribe:
                f()
            p._unsubscribe = []
            assert store.listeners.flush.direct is None
        assert held.results == [True] and on_disk(tmp_path, "s") == [0, 1]


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


@pytest.mark.parametrize("path", PATHS)
async def test_a_failed_write_is_a_flush_error_with_the_batch_kept(tmp_path: Path, path: str) -> None:
    async with gated(tmp_path, path) as (backend, store, p):
        (h,) = await sessions(store, "s")
        await h.append("feedback/record", 1)
        backend.fail_round = True
        steps = _Steps()
        trio.lowlevel.add_instrument(steps)
        try:
            with trio.testing.assert_checkpoints(), pytest.raises(FlushError):
                await h.flush()
        finally:
            trio.lowlevel.remove_instrument(steps)
        w = writer_of(p, "s")
        assert len(w.pending) == 1 and w.failure is not None and not w._lock.locked()
        # Steps taken by a failed flush: the round's completion and the flusher's
        # resumption, plus (general path only) the writer's "failure keeps its schedule
        # point" after the wait already yielded.
        assert steps.steps == (2 if path == "direct" else 3)
        backend.fail_round = False
        await h.flush()
        assert on_disk(tmp_path, "s") == [0, 1] and w.failure is None


@pytest.mark.parametrize("path", PATHS)
async def test_a_new_incarnation_s_first_write_waits_for_the_old_one_s_retirement(
    tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A session detached while its last batch is held in a round; the same id created
    # again: its first flush must wait for the old writer's retirement (the first-write
    # check, ``_before_first_write``) and then find the stored log is not its own
    # (refused, typed). The direct flush hands that case to the general one.
    spy = Spy(monkeypatch)
    backend = GatedJsonl(tmp_path)
    try:
        async with open_store() as store:
            with pytest.raises(PersistenceCloseError, match="id collision"):
                async with open_persistence(store, backend, write_delay=1000):
                    choose(store, path)
                    (old,) = await sessions(store, "s")
                    await old.append("feedback/record", 1)
                    async with flush_held(backend, old) as held:
                        await store.detach(old)
                        new = await store.create("s", cwd="/w")
                        await new.append("feedback/record", 2)
                        spy.calls.clear()
                        done: list[BaseException] = []

                        async def flush_new() -> None:
                            with pytest.raises(FlushError) as caught:
                                await new.flush()
                            done.append(caught.value)

                        held.nursery.start_soon(flush_new)
                        await trio.testing.wait_all_tasks_blocked()
                        assert done == []  # behind the old incarnation's retirement
                    # Then its check: the stored log is not a prefix of this one (an id collision).
                    assert len(done) == 1 and "id collision" in str(done[0])
                    assert spy.calls[:2] == (["direct", "flush"] if path == "direct" else ["flush"])[:2]
                    assert on_disk(tmp_path, "s") == [0, 1]
    finally:
        backend.gate.set()
