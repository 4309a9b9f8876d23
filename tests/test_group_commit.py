"""Group commit (issue 26): every session's batches go through the persistence's
``GroupCommitter``; the batches queued while a round is on the writer thread go out
together in the next round (``write_group``: for JSONL, every append written, then one
round of fsyncs). Hand-offs are driven by events (a gate inside the backend's
``write_group``) and Trio's ``wait_all_tasks_blocked``, never by timing."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from harness.errors import FlushError, WriterWedgedError
from harness.persistence import JsonlBackend, open_persistence
from harness.persistence import _committer as committer_module
from harness.persistence import _writer as writer_module
from harness.persistence._backend import GroupWrite
from harness.persistence._committer import GroupWriterCache, _WriterThread, group_writer
from harness.persistence._files import OsFiles
from harness.runtime import SessionHandle, open_store


class CountingFiles(OsFiles):
    """Counts fsyncs and the rounds of them; fails the fsyncs of the sessions in
    ``failing`` (by the log's directory name) while it is non-empty."""

    def __init__(self) -> None:
        self.fsyncs = 0
        self.rounds: list[int] = []
        self.failing: set[str] = set()

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        session = Path(os.readlink(f"/proc/self/fd/{fd}")).parent.name
        if session in self.failing:
            raise OSError(errno.EIO, "injected fsync failure")
        super().fsync(fd)

    def fsync_each(self, fds: Sequence[int]) -> list[OSError | None]:
        self.rounds.append(len(fds))
        return super().fsync_each(fds)


class GatedJsonl(JsonlBackend):
    """Records the sessions of every ``write_group`` call; holds a round at its start
    while ``gate`` is clear (``entered`` is set when one is held)."""

    def __init__(self, root: Path, files: OsFiles | None = None) -> None:
        super().__init__(root, files=files)
        self.groups: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_round = False

    def write_group(self, writes: Sequence[GroupWrite]) -> list[BaseException | None]:
        self.groups.append([w.session_id for w in writes])
        if not self.gate.is_set():
            self.entered.set()
            self.gate.wait(10)
        if self.fail_round:
            raise OSError(errno.EIO, "the shared step failed")
        return super().write_group(writes)


def on_disk(root: Path, sid: str) -> list[Any]:
    return [r["data"] for r in JsonlBackend(root).load(sid).records]


async def started(backend: GatedJsonl) -> None:
    """Wait until a round is held at the gate."""
    await trio.to_thread.run_sync(backend.entered.wait, 10)


class Held:
    """A flush held in its round (:func:`flush_held`): ``results`` gets what it returned
    (or raised), then ``after()``'s value if one was given; ``nursery`` runs it."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.results: list[Any] = []


@asynccontextmanager
async def flush_held(backend: GatedJsonl, handle: SessionHandle, after: Any = None) -> AsyncIterator[Held]:
    """``handle``'s flush started and held in its round (the backend's gate closed) for
    the block; leaving the block opens the gate and waits for the flush (and for every
    task the block started in ``held.nursery``)."""
    backend.gate.clear()
    async with trio.open_nursery() as n:
        held = Held(n)

        async def flush() -> None:
            try:
                held.results.append(await handle.flush())
            except Exception as exc:
                held.results.append(exc)
            if after is not None:
                held.results.append(after())

        n.start_soon(flush)
        await started(backend)
        yield held
        backend.gate.set()


async def sessions(store: Any, *ids: str) -> list[SessionHandle]:
    out = []
    for sid in ids:
        h = await store.create(sid, cwd="/w")
        await h.append("feedback/record", 0)
        await h.flush()  # materialized: later batches are appends
        out.append(h)
    return out


def bounded_waits(monkeypatch: pytest.MonkeyPatch, limit: float) -> list[float]:
    """Both clocks of the writer's bounded waits in the test's hands: the bound is
    ``limit`` and the wall clock reads the returned one-item list (move it by hand)."""
    wall = [0.0]
    monkeypatch.setattr(writer_module, "WRITE_WAIT_LIMIT", limit)
    monkeypatch.setattr(writer_module, "wall_clock", lambda: wall[0])
    return wall


def wedge_collector(errors: dict[str, BaseException]) -> Callable[[SessionHandle], Awaitable[None]]:
    """A flush that records a :class:`WriterWedgedError` in ``errors`` by session id."""

    async def flush(h: SessionHandle) -> None:
        try:
            await h.flush()
        except WriterWedgedError as exc:
            errors[h.id] = exc

    return flush


async def test_batches_queued_while_a_round_is_in_flight_go_out_in_one_round(tmp_path: Path) -> None:
    files = CountingFiles()
    backend = GatedJsonl(tmp_path, files)
    async with open_store() as store, open_persistence(store, backend, write_delay=60) as p:
        a, b, c, d = await sessions(store, "a", "b", "c", "d")
        backend.groups.clear()
        files.rounds.clear()
        backend.gate.clear()
        async with trio.open_nursery() as n:
            await a.append("feedback/record", 1)
            n.start_soon(a.flush)
            await started(backend)  # a's round is on the writer thread
            for h in (b, c, d):
                await h.append("feedback/record", 1)
                n.start_soon(h.flush)
            await trio.testing.wait_all_tasks_blocked()
            assert len(p.committer._pending) == 3  # queued behind the round in flight
            backend.gate.set()
        assert [sorted(g) for g in backend.groups] == [["a"], ["b", "c", "d"]]
        assert files.rounds == [1, 3]  # b, c and d were fsynced as one round
    for sid in "abcd":
        assert on_disk(tmp_path, sid) == [0, 1]


async def test_one_session_s_failure_does_not_fail_another_s(tmp_path: Path) -> None:
    files = CountingFiles()
    backend = GatedJsonl(tmp_path, files)
    async with open_store() as store, open_persistence(store, backend, write_delay=60) as p:
        hold, a, b, c = await sessions(store, "hold", "a", "b", "c")
        backend.groups.clear()
        files.failing = {"b"}
        outcomes: dict[str, str] = {}

        async def flush(h: SessionHandle) -> None:
            try:
                await h.flush()
                outcomes[h.id] = "ok"
            except FlushError as exc:
                outcomes[h.id] = exc.code

        backend.gate.clear()
        async with trio.open_nursery() as n:
            await hold.append("feedback/record", 1)
            n.start_soon(hold.flush)
            await started(backend)
            for h in (a, b, c):
                await h.append("feedback/record", 1)
                n.start_soon(flush, h)
            await trio.testing.wait_all_tasks_blocked()
            backend.gate.set()
        assert sorted(backend.groups[-1]) == ["a", "b", "c"]  # one round
        assert outcomes == {"a": "ok", "b": "FLUSH_FAILED", "c": "ok"}
        assert on_disk(tmp_path, "b") == [0]  # rolled back by truncation
        files.failing.clear()
        await b.append("feedback/record", 2)
        await b.flush()  # the kept batch first, then the new one
        assert p._writers["b"].pending == []
    assert on_disk(tmp_path, "a") == on_disk(tmp_path, "c") == [0, 1]
    assert on_disk(tmp_path, "b") == [0, 1, 2]


async def test_a_failed_round_keeps_every_batch_and_a_retry_lands_them_in_order(tmp_path: Path) -> None:
    backend = GatedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=60) as p:
        hold, a, b = await sessions(store, "hold", "a", "b")
        backend.groups.clear()
        failed: list[str] = []

        async def flush(h: SessionHandle) -> None:
            try:
                await h.flush()
            except FlushError:
                failed.append(h.id)

        backend.gate.clear()
        async with trio.open_nursery() as n:
            await hold.append("feedback/record", 1)
            n.start_soon(flush, hold)
            await started(backend)
            backend.fail_round = True  # the held round and the next one fail as a whole
            for h in (a, b):
                await h.append("feedback/record", 1)
                await h.append("feedback/record", 2)
                n.start_soon(flush, h)
            await trio.testing.wait_all_tasks_blocked()
            backend.gate.set()
        assert sorted(failed) == ["a", "b", "hold"] and sorted(backend.groups[-1]) == ["a", "b"]
        assert [len(p._writers[s].pending) for s in "ab"] == [2, 2]  # kept, in order
        backend.fail_round = False
        for h in (a, b):
            await h.append("feedback/record", 3)
        async with trio.open_nursery() as n:
            for h in (hold, a, b):
                n.start_soon(h.flush)
    assert on_disk(tmp_path, "hold") == [0, 1]
    for sid in "ab":
        assert on_disk(tmp_path, sid) == [0, 1, 2, 3]


async def test_a_cancelled_waiter_does_not_cancel_its_round(tmp_path: Path) -> None:
    backend = GatedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=60):
        hold, a, b = await sessions(store, "hold", "a", "b")
        backend.groups.clear()
        cancelled: list[bool] = []

        async def cancelled_flush(scope: trio.CancelScope) -> None:
            with scope:
                await a.flush()
            # Returned (or saw Cancelled) only once its round was let go.
            cancelled.append(backend.gate.is_set())

        backend.gate.clear()
        scope = trio.CancelScope()
        async with trio.open_nursery() as n:
            await hold.append("feedback/record", 1)
            n.start_soon(hold.flush)
            await started(backend)
            for h in (a, b):
                await h.append("feedback/record", 1)
            n.start_soon(cancelled_flush, scope)
            n.start_soon(b.flush)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()  # a's waiter is cancelled while its batch waits for a round
            await trio.testing.wait_all_tasks_blocked()
            backend.gate.set()
        # The flush came back only after its write did: the round wrote it.
        assert scope.cancel_called and cancelled == [True]
        assert [sorted(g) for g in backend.groups] == [["hold"], ["a", "b"]]
    assert on_disk(tmp_path, "a") == on_disk(tmp_path, "b") == [0, 1]


async def test_an_overrun_wedges_the_writer_and_a_queued_batch_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    # Both clocks bound the wait: a jump of the Trio clock alone is not an overrun.
    clock = mock_clock
    wall = bounded_waits(monkeypatch, 10.0)
    backend = GatedJsonl(tmp_path)
    errors: dict[str, BaseException] = {}
    flush = wedge_collector(errors)

    try:
        async with open_store() as store:
            with pytest.raises(Exception, match="closing failed"):  # a and b fail closed
                async with open_persistence(store, backend, write_delay=60) as p:
                    a, b = await sessions(store, "a", "b")
                    backend.groups.clear()
                    backend.gate.clear()
                    async with trio.open_nursery() as n:
                        await a.append("feedback/record", 1)
                        n.start_soon(flush, a)
                        await started(backend)
                        await b.append("feedback/record", 1)
                        n.start_soon(flush, b)  # queued behind a's round
                        await trio.testing.wait_all_tasks_blocked()
                        clock.jump(11)  # the Trio clock alone passed the bound
                        await trio.testing.wait_all_tasks_blocked()
                        assert errors == {} and p._writers["a"].wedged is None
                        wall[0] = 11.0
                        clock.jump(11)  # now both clocks did
                    assert set(errors) == {"a", "b"}
                    assert p._writers["a"].wedged is not None and p._writers["b"].wedged is not None
                    backend.gate.set()
                    await trio.to_thread.run_sync(lambda: None)  # the late round comes back
                    await trio.testing.wait_all_tasks_blocked()
                    with pytest.raises(WriterWedgedError):
                        await b.flush()  # fails closed for good
    finally:
        backend.gate.set()
    assert backend.groups == [["a"]]  # b's batch was withdrawn before a round took it
    assert on_disk(tmp_path, "b") == [0]


async def test_the_writer_thread_ends_at_close(tmp_path: Path) -> None:
    async with open_store() as store:
        async with open_persistence(store, JsonlBackend(tmp_path)) as p:
            (a,) = await sessions(store, "a")
            thread = p.committer._thread._thread
            assert thread is not None and thread.is_alive()
        await trio.to_thread.run_sync(thread.join, 10)
        assert not thread.is_alive()
        assert p.committer._thread._thread is None
    assert on_disk(tmp_path, "a") == [0]


def test_many_runs_in_one_process_each_end_their_thread(tmp_path: Path) -> None:
    threads: list[threading.Thread] = []

    async def one(i: int) -> None:
        async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path / str(i))) as p:
            await sessions(store, "a")
            thread = p.committer._thread._thread
            assert thread is not None
            threads.append(thread)

    for i in range(5):
        trio.run(one, i)
    for t in threads:
        t.join(10)
    assert len(set(threads)) == 5 and not any(t.is_alive() for t in threads)


def test_the_writer_thread_runs_what_was_handed_to_it_before_and_after_a_stop() -> None:
    thread = _WriterThread("test writer")
    gate = threading.Event()
    delivered: list[str] = []
    done = threading.Event()
    thread.start_soon(lambda: gate.wait(10), lambda _: delivered.append("a"))
    thread.start_soon(lambda: None, lambda _: delivered.append("b"))
    first = thread.stop()  # ends once the inbox is empty...
    thread.start_soon(lambda: None, lambda _: (delivered.append("c"), done.set()))  # ...which it is not
    gate.set()
    assert done.wait(10)
    assert thread.stop() is first  # the same thread ran c; this stop ends it
    assert first is not None
    first.join(10)
    assert not first.is_alive() and thread._thread is None and delivered == ["a", "b", "c"]


def test_a_writer_thread_that_ended_idle_is_replaced_by_the_next_hand_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # No linger: the thread ends whenever its inbox is empty, so every hand-off races
    # an ending thread; none may be left in an inbox that no thread reads.
    monkeypatch.setattr(committer_module, "THREAD_IDLE_LINGER", 0.0)
    thread = _WriterThread("test writer")
    ran: list[int] = []
    for i in range(200):
        done = threading.Event()
        thread.start_soon(lambda i=i: ran.append(i), lambda _, done=done: done.set())
        assert done.wait(10)
    assert ran == list(range(200))
    last = thread.stop()
    if last is not None:
        last.join(10)
    assert thread._thread is None


def test_a_subclass_that_replaces_append_is_written_through_it(tmp_path: Path) -> None:
    class Replaced(JsonlBackend):
        def append(self, session_id: str, records: list[dict[str, Any]], **kw: Any) -> None:
            super().append(session_id, records, **kw)

    class Wrapped(JsonlBackend):
        def write_group(self, writes: Sequence[GroupWrite]) -> list[BaseException | None]:
            return super().write_group(writes)

    plain = JsonlBackend(tmp_path)
    assert group_writer(plain) is not None and group_writer(Wrapped(tmp_path)) is not None
    assert group_writer(Replaced(tmp_path)) is None
    plain.append = lambda *a, **k: None  # type: ignore[method-assign]
    assert group_writer(plain) is None


def test_the_cached_decision_sees_a_replacement_made_after_it(tmp_path: Path) -> None:
    # The committer keeps group_writer's decision between rounds: a method replaced on
    # the class (or one of its bases) or on the instance afterwards must still be seen.
    class Late(JsonlBackend):
        pass

    cache = GroupWriterCache()
    backend = Late(tmp_path)
    assert group_writer(backend, cache) is not None
    Late.append = lambda self, *a, **k: None  # type: ignore[method-assign]
    assert group_writer(backend, cache) is None
    del Late.append  # type: ignore[attr-defined]
    assert group_writer(backend, cache) is not None
    Late.write_group = lambda self, writes: []  # type: ignore[method-assign]  # a write_group that sees them
    Late.materialize = lambda self, *a, **k: None  # type: ignore[method-assign]
    assert group_writer(backend, cache) is not None
    del Late.write_group, Late.materialize  # type: ignore[attr-defined]
    assert group_writer(backend, cache) is not None
    backend.materialize = lambda *a, **k: None  # type: ignore[method-assign]
    assert group_writer(backend, cache) is None


async def test_an_append_replaced_on_the_instance_after_rounds_ran_is_written_through(tmp_path: Path) -> None:
    # A fault layer replaces ``append`` on a backend whose committer already decided
    # (and cached) that rounds go through ``write_group``.
    backend = JsonlBackend(tmp_path)
    calls: list[str] = []
    real = backend.append

    def append(session_id: str, records: list[dict[str, Any]], **kw: Any) -> None:
        calls.append(session_id)
        real(session_id, records, **kw)

    async with open_store() as store, open_persistence(store, backend) as p:
        (a,) = await sessions(store, "a")
        await a.append("feedback/record", 1)
        await a.flush()
        assert calls == [] and p.committer.rounds >= 2
        backend.append = append  # type: ignore[method-assign]
        await a.append("feedback/record", 2)
        await a.flush()
        assert calls == ["a"]
    assert on_disk(tmp_path, "a") == [0, 1, 2]


def test_fsync_each_reports_each_descriptor_s_own_failure(tmp_path: Path) -> None:
    class Failing(OsFiles):
        def __init__(self, bad: int) -> None:
            self.bad = bad

        def fsync(self, fd: int) -> None:
            if fd == self.bad:
                raise OSError(errno.EIO, "injected")
            super().fsync(fd)

    fds = [os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT) for i in range(20)]
    try:
        for fd in fds:
            os.write(fd, orjson.dumps({"fd": fd}))
        out = Failing(fds[7]).fsync_each(fds)
        assert [i for i, e in enumerate(out) if e is not None] == [7]
    finally:
        for fd in fds:
            os.close(fd)
