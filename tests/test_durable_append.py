"""``append(..., durable=True)`` and ``append_batch(..., durable=True)``: the append and
its flush as one call (issue 26).

Pinned here: it returns once the event is on disk; it yields once (the flush's wait),
not twice; it is a checkpoint; ``Cancelled`` means not applied, and once applied the
flush is not cancelled (the events are returned, the cancellation lands at the next
checkpoint), on the direct path, on the busy-actor path and through the general
listener path; a refusal and a flush failure raise what ``append`` and ``flush`` raise."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from harness.errors import EventError, FlushError, SessionNotLiveError
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import SessionHandle, open_store
from harness.session import EventDraft
from tests.test_flush_steps import _Steps
from tests.test_group_commit import GatedJsonl, on_disk, sessions, started


async def _steps(fn: Any) -> int:
    steps = _Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        await fn()
    finally:
        trio.lowlevel.remove_instrument(steps)
    return steps.steps


async def test_it_returns_once_the_event_is_on_disk(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000) as p:
        (h,) = await sessions(store, "s")
        for i in range(1, 4):
            ev = await h.append("feedback/record", i, durable=True)
            assert ev.seq == h.seq - 1 and ev.data == i
            assert on_disk(tmp_path, "s")[-1] == i  # durable when it returned
        batch = await h.append_batch(
            [EventDraft("feedback/record", 4), EventDraft("feedback/record", 5)], durable=True
        )
        assert [e.data for e in batch] == [4, 5]
        assert on_disk(tmp_path, "s") == [0, 1, 2, 3, 4, 5]
        assert p.committer.rounds >= 4


async def test_it_yields_once_where_append_then_flush_yields_twice(tmp_path: Path) -> None:
    # Task steps, counted: the round's completion callback and the caller's
    # resumption; append + flush adds the append's own schedule point.
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000):
        (h,) = await sessions(store, "s")
        await trio.testing.wait_all_tasks_blocked()

        async def durable() -> None:
            for i in range(10):
                await h.append("feedback/record", i, durable=True)

        async def two_calls() -> None:
            for i in range(10):
                await h.append("feedback/record", i)
                await h.flush()

        assert await _steps(durable) == 20
        assert await _steps(two_calls) == 30
    assert on_disk(tmp_path, "s")[1:] == list(range(10)) * 2


async def test_it_is_a_checkpoint_with_and_without_persistence(tmp_path: Path) -> None:
    async with open_store() as store:
        bare = await store.create("bare", cwd="/w")
        with trio.testing.assert_checkpoints():
            await bare.append("feedback/record", 1, durable=True)  # no flush listener
        assert [e.data for e in bare.events][-1] == 1
        async with open_persistence(store, JsonlBackend(tmp_path), write_delay=1000):
            (h,) = await sessions(store, "s")
            with trio.testing.assert_checkpoints():
                await h.append("feedback/record", 1, durable=True)
            with trio.testing.assert_checkpoints(), pytest.raises(EventError):
                await h.append(7, 1, durable=True)  # type: ignore[arg-type]  # refused
    assert on_disk(tmp_path, "s") == [0, 1]


async def test_cancelled_before_it_is_not_applied(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000) as p:
        (h,) = await sessions(store, "s")
        seq, rounds = h.seq, p.committer.rounds
        with trio.CancelScope() as scope:
            scope.cancel()
            await h.append("feedback/record", 1, durable=True)
            pytest.fail("not cancelled")
        assert scope.cancelled_caught
        assert h.seq == seq and p.committer.rounds == rounds
    assert on_disk(tmp_path, "s") == [0]


async def _cancel_while_waiting(call: Any, parked: Any, release: Any) -> list[Any]:
    """Run ``call``; once ``await parked()`` says it waits, cancel its scope, check it
    is still waiting, then ``release()``: what it returned, then ``"cancelled"`` if
    the next checkpoint raised."""
    seen: list[Any] = []
    scopes: list[trio.CancelScope] = []

    async def run() -> None:
        with trio.CancelScope() as scope:
            scopes.append(scope)
            seen.append(await call())
            await trio.lowlevel.checkpoint()
            seen.append("not cancelled")
        if scope.cancelled_caught:
            seen.append("cancelled")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await parked()
        scopes[0].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert seen == []  # still waiting, not cancelled out of it
        release()
    return seen


async def _cancel_while_held(backend: GatedJsonl, call: Any) -> list[Any]:
    """:func:`_cancel_while_waiting` with the backend's rounds held until released."""
    backend.gate.clear()
    return await _cancel_while_waiting(call, partial(started, backend), backend.gate.set)


async def test_once_applied_its_flush_is_not_cancelled(tmp_path: Path) -> None:
    backend = GatedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=1000):
        (h,) = await sessions(store, "s")
        seen = await _cancel_while_held(backend, lambda: h.append("feedback/record", 1, durable=True))
        assert [type(seen[0]).__name__, seen[0].data, seen[1]] == ["Event", 1, "cancelled"]
    assert on_disk(tmp_path, "s") == [0, 1]


async def test_a_busy_actor_queues_it_in_order_and_its_flush_is_not_cancelled(tmp_path: Path) -> None:
    # The actor is not idle (a cast is queued): the append is mailed behind the cast,
    # then flushed through the store's general flush, shielded.
    backend = GatedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=1000):
        (h,) = await sessions(store, "s")

        async def behind_a_cast() -> Any:
            h.append_nowait("feedback/record", 1)
            assert not h._ref().idle
            return await h.append("feedback/record", 2, durable=True)

        seen = await _cancel_while_held(backend, behind_a_cast)
        assert [seen[0].data, seen[1]] == [2, "cancelled"]
    assert on_disk(tmp_path, "s") == [0, 1, 2]


async def test_through_the_general_listener_path_its_flush_is_not_cancelled(tmp_path: Path) -> None:
    # Another flush listener turns the direct form off: the listeners run in a
    # shielded scope, so a listener's own wait is not cancelled either.
    release = trio.Event()
    heard: list[str] = []

    async def slow_listener(handle: SessionHandle) -> None:
        heard.append("waiting")
        await release.wait()
        heard.append("done")

    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000):
        (h,) = await sessions(store, "s")
        store.on_flush(slow_listener)
        assert store.listeners.flush.direct is None

        async def parked() -> None:
            await trio.testing.wait_all_tasks_blocked()
            assert heard == ["waiting"]

        seen = await _cancel_while_waiting(
            lambda: h.append("feedback/record", 1, durable=True), parked, release.set
        )
        assert heard == ["waiting", "done"] and seen[0].data == 1 and seen[1] == "cancelled"
    assert on_disk(tmp_path, "s") == [0, 1]


async def test_a_flush_failure_is_raised_with_the_event_appended(tmp_path: Path) -> None:
    # As a flush after the append would: FlushError, the event in the live log and
    # kept by the writer, written by the next flush.
    backend = GatedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=1000):
        (h,) = await sessions(store, "s")
        backend.fail_round = True
        with trio.testing.assert_checkpoints(), pytest.raises(FlushError) as info:
            await h.append("feedback/record", 1, durable=True)
        assert info.value.code == "FLUSH_FAILED" and '"s"' in str(info.value)
        assert [e.data for e in h.events][-1] == 1 and on_disk(tmp_path, "s") == [0]
        backend.fail_round = False
        await h.append("feedback/record", 2, durable=True)
    assert on_disk(tmp_path, "s") == [0, 1, 2]


async def test_a_refusal_writes_nothing_and_a_stale_handle_is_not_live(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000) as p:
        (h,) = await sessions(store, "s")
        rounds = p.committer.rounds
        with pytest.raises(EventError):
            await h.append_batch([EventDraft("feedback/record", 1), "not a draft"], durable=True)  # type: ignore[list-item]
        with pytest.raises(EventError):
            await h.append("", 1, durable=True)
        assert p.committer.rounds == rounds
        await store.detach(h)
        with pytest.raises(SessionNotLiveError) as info:
            await h.append("feedback/record", 1, durable=True)
        assert info.value.code == "SESSION_NOT_LIVE"
    assert on_disk(tmp_path, "s") == [0]


async def test_behind_a_flush_in_flight_its_wait_for_the_writer_is_not_cancelled(tmp_path: Path) -> None:
    # Another flush of the session holds the writer's lock (its round is held): the
    # durable append's flush waits for the lock, a cancellable wait made shielded.
    backend = GatedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=1000):
        (h,) = await sessions(store, "s")
        await h.append("feedback/record", 1)
        backend.gate.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.flush)
            await started(backend)
            seen = await _cancel_while_waiting(
                lambda: h.append("feedback/record", 2, durable=True),
                trio.testing.wait_all_tasks_blocked,
                backend.gate.set,
            )
        assert seen[0].data == 2 and seen[1] == "cancelled"
    assert on_disk(tmp_path, "s") == [0, 1, 2]


# -- review: the busy-actor path ---------------------------------------------------------


async def test_a_hooks_would_block_veto_is_its_answer_not_a_busy_actor(tmp_path: Path) -> None:
    # A pre-commit hook's trio.WouldBlock (e.g. a full channel's send_nowait) is a
    # veto raised through call_nowait: it was taken for "the actor is busy" and the
    # append sent again, the hook run twice and the vetoed event applied.
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000):
        (h,) = await sessions(store, "s")
        calls: list[int] = []

        def hook(handle: SessionHandle, events: Any) -> None:
            calls.append(len(events))
            if len(calls) == 1:
                raise trio.WouldBlock

        store.add_pre_commit_hook(hook)
        seq = h.seq
        with pytest.raises(trio.WouldBlock) as info:
            await h.append("feedback/record", 1, durable=True)
        assert info.value.__context__ is None
        assert calls == [1] and h.seq == seq
    assert on_disk(tmp_path, "s") == [0]


async def test_a_busy_actors_refusal_has_no_context(tmp_path: Path) -> None:
    # As a plain append's: not raised "during handling of" the WouldBlock that sent
    # the append to the mailbox.
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000):
        (h,) = await sessions(store, "s")
        for durable in (False, True):
            h.append_nowait("feedback/record", 1)
            with pytest.raises(EventError) as info:
                await h.append("", 1, durable=durable)
            assert info.value.__context__ is None, durable


async def test_queued_before_a_detach_it_is_applied_and_flushed_not_refused(tmp_path: Path) -> None:
    # The append waits in the mailbox (behind a cast) when the session is detached:
    # the detach's drain applies it, so "not live" would tell the caller "not applied"
    # about an event in the log. Its flush goes through the session's writer instead.
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path), write_delay=1000):
        (h,) = await sessions(store, "s")
        seen: list[Any] = []

        async def durable() -> None:
            h.append_nowait("feedback/record", 1)
            ev = await h.append("feedback/record", 2, durable=True)
            seen.extend([ev.data, on_disk(tmp_path, "s")])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(durable)
            nursery.start_soon(store.detach, h)
        assert seen == [2, [0, 1, 2]]
