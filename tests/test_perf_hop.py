"""The lean thread hop of ``run_storage_call`` (issue 15): a storage call with a free
limiter token runs on a cached worker thread without ``trio.to_thread``'s per-call
machinery. These pin what it must keep from ``to_thread.run_sync(...,
abandon_on_cancel=True)``: the token is held for the whole thread and returned when
it ends (also when the wait was abandoned), the limiter's queue order is respected,
and a durable flush cancelled at any step loses nothing and writes nothing twice."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import orjson
import pytest
import trio
import trio.testing

from harness.faults import Probe
from harness.persistence import JsonlBackend, open_persistence
from harness.persistence import _writer as writer_module
from harness.persistence._writer import WaitOverrun, run_storage_call
from harness.runtime import open_store
from harness.session import EventDraft, event_to_record
from harness.testing import ExploreCheckpoints


async def test_the_token_is_held_while_the_thread_runs_and_returned_after() -> None:
    limiter = trio.CapacityLimiter(2)
    seen: list[float] = []

    def work() -> str:
        seen.append(limiter.borrowed_tokens)
        return "ok"

    assert await run_storage_call(work, limiter=limiter) == "ok"
    assert seen == [1]
    assert limiter.borrowed_tokens == 0


async def test_an_exception_comes_back_and_the_token_too() -> None:
    limiter = trio.CapacityLimiter(1)

    def boom() -> None:
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        await run_storage_call(boom, limiter=limiter)
    assert limiter.borrowed_tokens == 0


async def test_an_abandoned_call_keeps_its_token_until_its_thread_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "WRITE_WAIT_LIMIT", 0.1)
    limiter = trio.CapacityLimiter(1)
    gate = threading.Event()
    finished: list[int] = []

    def stuck() -> None:
        gate.wait(5)
        finished.append(1)

    with pytest.raises(WaitOverrun):
        await run_storage_call(stuck, limiter=limiter)
    assert limiter.borrowed_tokens == 1  # the abandoned thread still holds it
    gate.set()
    # The next call needs that token: it waits in the limiter's queue until the
    # abandoned thread ends and gives it back, then runs.
    with trio.fail_after(5):
        assert await run_storage_call(lambda: "next", limiter=limiter) == "next"
    assert finished == [1]
    assert limiter.borrowed_tokens == 0


async def test_a_call_waits_behind_callers_queued_before_it() -> None:
    # A free token does not let a call jump the limiter's queue: with a waiter queued,
    # it queues too (to_thread's path) and runs after the waiter.
    limiter = trio.CapacityLimiter(1)
    order: list[str] = []
    gate = threading.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: trio.to_thread.run_sync(gate.wait, 5, limiter=limiter))
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(lambda: trio.to_thread.run_sync(lambda: order.append("queued first"), limiter=limiter))
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await run_storage_call(lambda: order.append("storage call"), limiter=limiter)
    assert order == ["queued first", "storage call"]


async def test_a_cancelled_caller_still_waits_for_the_write_then_sees_cancelled() -> None:
    done: list[int] = []

    def work() -> None:
        time.sleep(0.02)
        done.append(1)

    with trio.CancelScope() as scope:
        scope.cancel()
        await run_storage_call(work)
        assert done == [1]  # shielded: the call ran to its end before the return
        await trio.lowlevel.checkpoint()
        pytest.fail("not cancelled")
    assert done == [1]


def _on_disk(root: Path) -> list[dict[str, object]]:
    (path,) = root.rglob("session.jsonl")
    return [orjson.loads(line) for line in path.read_bytes().splitlines()[1:]]


def test_durable_appends_cancelled_at_every_checkpoint(explore_checkpoints: ExploreCheckpoints, tmp_path: Path) -> None:
    """Appends and flushes (the W9/W10 path) cancelled at any step: once the store is
    closed, the file holds exactly the session's events, in order, each once."""
    counter = iter(range(1_000_000))

    async def body(probe: Probe) -> None:
        root = tmp_path / f"run-{next(counter)}"
        events: list[dict[str, object]] = []
        try:
            async with open_store() as store, open_persistence(store, JsonlBackend(root), write_delay=60):
                h = await store.create("s", cwd="/w")
                try:
                    await h.append("feedback/record", {"n": 0})
                    await h.flush()
                    await h.append_batch([EventDraft("feedback/record", {"n": i}) for i in (1, 2, 3)])
                    await h.flush()
                    await h.append("feedback/record", {"n": 4})
                    await h.flush()
                finally:
                    events = [event_to_record(e) for e in h.events]
        except trio.Cancelled:  # pragma: no cover - the caller scope catches it
            raise
        stored = _on_disk(root)
        probe.check(stored == orjson.loads(orjson.dumps(events)), f"on disk {stored} != live {events}")

    report = explore_checkpoints(body, name="durable-appends")
    assert report.attempts > 10
