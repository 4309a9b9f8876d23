"""Review of the direct flush (decision 0020) under the fault explorer: a scenario of
its races -- two flushers of one session, a flush racing that session's appends, a
second session detached while it flushes, a flush listener registered and removed
while flushes are in flight (the store flips between the direct and the general path)
-- explored under cancellation at every step, an I/O failure at every write and a
crash at every write, on JSONL and SQLite. Every flush that returned is acknowledged;
nothing acknowledged may be lost."""

from __future__ import annotations

from functools import partial

import attrs
import pytest
import trio

from harness.faults import Probe, Scenario, explore, explore_crash, explore_io
from harness.faults._backends import track_session
from harness.faults._scenarios._frame import (
    SETTINGS,
    append_turns,
    check_live,
    flush_and_acknowledge,
    guarded,
    store_run,
)
from harness.faults._scratch import scratch_dir
from harness.runtime import SessionHandle


async def _flush_and_acknowledge(probe: Probe, handle: SessionHandle, what: str) -> None:
    if not handle.alive:
        return  # detached already: nothing to acknowledge
    await flush_and_acknowledge(probe, handle, what)


async def direct_flush_races(probe: Probe, kind: str) -> None:
    async with store_run(probe, kind, write_delay=60) as run:
        r, caller = run.rig, run.caller
        probe.arm()
        with caller.scope():
            s = await guarded(probe, "create s", partial(r.store.create, "s", cwd="/chaos"))
            t = await guarded(probe, "create t", partial(r.store.create, "t", cwd="/chaos"))
            if s is None or t is None:
                return
            track_session(probe, s)
            track_session(probe, t)
            await guarded(probe, "append s", partial(append_turns, s, [1]))
            await _flush_and_acknowledge(probe, s, "first flush s")
            # Left unflushed: the two flushers below both find a batch to write.
            await guarded(probe, "append s", partial(append_turns, s, [2]))

            async def s_writer() -> None:
                await guarded(probe, "append s", partial(append_turns, s, [3]))
                await _flush_and_acknowledge(probe, s, "flush s after 3")

            async def t_writer() -> None:
                await guarded(probe, "append t", partial(append_turns, t, [1]))
                await _flush_and_acknowledge(probe, t, "flush t")

            async def detach_t() -> None:
                for _ in range(3):
                    await trio.lowlevel.checkpoint()
                await guarded(probe, "detach t", partial(r.store.detach, t))

            async def listener_churn() -> None:
                await trio.lowlevel.checkpoint()
                unsubscribe = r.store.on_flush(lambda handle: None)
                try:
                    await trio.lowlevel.checkpoint()
                    await _flush_and_acknowledge(probe, s, "flush s (general path)")
                finally:
                    unsubscribe()

            async with trio.open_nursery() as n:
                n.start_soon(_flush_and_acknowledge, probe, s, "flush s A")
                n.start_soon(_flush_and_acknowledge, probe, s, "flush s B")
                n.start_soon(s_writer)
                n.start_soon(t_writer)
                n.start_soon(detach_t)
                n.start_soon(listener_churn)
            await _flush_and_acknowledge(probe, s, "last flush s")
        for h in await guarded(probe, "store.list", r.store.list) or []:
            check_live(probe, h, idle=not run.interrupted)


def scenario(kind: str) -> Scenario:
    async def run(probe: Probe) -> None:
        await direct_flush_races(probe, kind)

    return Scenario(
        name=f"direct-flush-races/{kind}",
        run=run,
        cancellers=("caller", "teardown"),
        backend=kind,
        modes=("checkpoints", "io", "crash"),
        settings=attrs.evolve(SETTINGS, scratch=scratch_dir(kind)),  # as the built-in scenarios
    )


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_the_direct_flush_races_explored_under_cancellation(kind: str) -> None:
    report = explore(scenario(kind), seeds=[0, 1, 2], confirm=False)
    assert report.violations == (), report.distinct()
    assert report.attempts > 50


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_the_direct_flush_races_explored_under_io_failures_and_crashes(kind: str) -> None:
    for report in (explore_io(scenario(kind)), explore_crash(scenario(kind))):
        assert report.violations == (), report.distinct()
        assert report.attempts > 10
