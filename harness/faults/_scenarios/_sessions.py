"""The store family: ``fork`` (a live session forked while it is appended to) and
``lifecycle`` (create/append/flush/detach concurrency, re-open while retiring)."""

from __future__ import annotations

import trio

from actors import ActorError
from harness.errors import HarnessError, OpenTurnError
from harness.faults._backends import track_session
from harness.faults._explore import Probe
from harness.faults._scenarios._frame import (
    append_turns,
    check_live,
    flush_and_acknowledge,
    guarded,
    note_errors,
    store_run,
)
from harness.runtime import SessionHandle
from harness.session import event_to_record


async def fork(probe: Probe, kind: str) -> None:
    """Fork a live session at its last turn boundary (a closed prefix), then at its last
    seq (refused while a turn is open), while turns are being appended to it."""
    children: list[SessionHandle] = []
    async with store_run(probe, kind) as run:
        r, caller = run.rig, run.caller
        parent = await r.store.create("parent", cwd="/chaos")
        track_session(probe, parent)
        await append_turns(parent, [1])
        probe.arm()

        async def writer() -> None:
            await guarded(probe, "append", lambda: append_turns(parent, [2, 3]))

        async def fork_one(child_id: str, boundary: int | None) -> None:
            child: SessionHandle | None = None
            try:
                child = await r.store.fork(parent, boundary, child_id)
            except* OpenTurnError:
                pass  # the prefix ends mid-turn: refused, nothing created
            except* (HarnessError, ActorError) as group:
                note_errors(probe, group, f"fork {child_id}")
            if child is None:
                return
            children.append(child)
            track_session(probe, child)
            await guarded(probe, f"append to {child_id}", lambda: child.append("feedback/record", {"text": "branch"}))

        async def forker() -> None:
            with caller.scope():
                for _ in range(3):
                    await trio.lowlevel.checkpoint()
                # At the last turn boundary (always a closed prefix) while the
                # writer appends; then at the last seq (refused mid-turn).
                ends = [e.seq for e in parent.events if e.type == "turn/end"]
                await fork_one("child", ends[-1])
                await fork_one("child2", None)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            nursery.start_soon(forker)
        with caller.scope():
            for h in [parent, *children]:
                if h.alive:
                    await flush_and_acknowledge(probe, h, f'flush "{h.id}"')
        if not run.interrupted:
            check_live(probe, parent, idle=True)
        for child in children:
            check_live(probe, child, idle=True)
            _check_fork_prefix(probe, parent, child)
        # A child the store created for a cancelled caller is live too: track it.
        for h in await guarded(probe, "store.list", r.store.list) or []:
            track_session(probe, h)


def _check_fork_prefix(probe: Probe, parent: SessionHandle, child: SessionHandle) -> None:
    header = child.header
    probe.check(header.parent_session == parent.id, f"fork child names parent {header.parent_session!r}")
    seed = header.seed_length
    if seed is None:
        probe.fail("fork child has no seedLength")
        return
    mine = [event_to_record(e) for e in list(child.events)[:seed]]
    theirs = [event_to_record(e) for e in list(parent.events)[:seed]]
    probe.check(mine == theirs, f"fork child's first {seed} events differ from the parent's")


async def lifecycle(probe: Probe, kind: str) -> None:
    """Create, append, flush and detach sessions concurrently; re-open a detached one
    while it retires."""
    async with store_run(probe, kind) as run:
        r, caller = run.rig, run.caller
        store, p = r.store, r.persistence
        probe.arm()
        detached = trio.Event()

        async def first() -> None:
            try:
                a = await guarded(probe, "create a", lambda: store.create("a", cwd="/chaos"))
                if a is None:
                    return
                track_session(probe, a)
                await guarded(probe, "append a", lambda: append_turns(a, [1]))
                await flush_and_acknowledge(probe, a, "flush a")
                await guarded(probe, "detach a", lambda: store.detach(a))
            finally:
                detached.set()

        async def second() -> None:
            b = await guarded(probe, "create b", lambda: store.create("b", cwd="/chaos"))
            if b is None:
                return
            track_session(probe, b)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(guarded, probe, "append b", lambda: append_turns(b, [1, 2]))
                nursery.start_soon(flush_and_acknowledge, probe, b, "flush b (concurrent)")
            await flush_and_acknowledge(probe, b, "flush b")

        async def reopen() -> None:
            await detached.wait()
            if probe.acknowledged.get("a", -1) < 0:
                return  # "a" never became durable: nothing to re-open
            prep = await guarded(probe, "prepare a", lambda: p.prepare("a"))
            if prep is None:
                return
            a2 = await guarded(probe, "publish a", lambda: p.publish(prep))
            if a2 is not None:
                await guarded(probe, "append a again", lambda: append_turns(a2, [2]))
                await flush_and_acknowledge(probe, a2, "flush a again")

        with caller.scope():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(first)
                nursery.start_soon(second)
                nursery.start_soon(reopen)
        live = await guarded(probe, "store.list", store.list) or []
        # Plain appends stop wherever the caller was cancelled (the turn stays
        # open, as after a crash); uninterrupted, every turn was closed.
        for h in live:
            probe.check(h.alive, f'store.list() returned a handle that is not live: "{h.id}"')
            check_live(probe, h, idle=not run.interrupted)
