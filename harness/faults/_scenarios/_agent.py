"""The agent family: ``agent-turn`` (a turn with tool calls) and ``resume`` (a
persisted session resumed through ``AgentLoop.resume``)."""

from __future__ import annotations

from functools import partial

from actors import Owner
from harness.errors import HarnessError
from harness.faults._backends import close_backend, make_backend, plain_backend, track_session
from harness.faults._explore import Probe
from harness.faults._scenarios._frame import (
    TURN_SCRIPT,
    agent_run,
    flush_and_acknowledge,
    guarded,
    rig,
)
from harness.persistence import open_persistence
from harness.runtime import open_store


async def agent_turn(probe: Probe, kind: str) -> None:
    """Create an agent, run a turn with two tool calls, flush, dispose."""
    async with agent_run(probe, kind, agent_cancel=True) as run:
        with run.caller.scope():
            h = await guarded(probe, "create", lambda: run.rig.loop.create("chat", owner=run.owner, cwd="/chaos"))
            if h is not None:
                run.handles.append(h)
                track_session(probe, h.session)
                await guarded(probe, "run_turn", lambda: h.run_turn("please add 1 and 2"))
                await flush_and_acknowledge(probe, h.session, "flush")


async def _seed(probe: Probe, kind: str, sid: str) -> None:
    """A stored session with one completed turn (run disarmed)."""
    backend = make_backend(probe, kind)
    try:
        async with rig(probe, backend, script=TURN_SCRIPT) as r, Owner("seed") as owner:
            h = await r.loop.create(sid, owner=owner, cwd="/chaos")
            track_session(probe, h.session)
            await h.run_turn("seed turn")
            await flush_and_acknowledge(probe, h.session, "seed flush")
            await h.dispose()
    finally:
        close_backend(backend)


async def resume(probe: Probe, kind: str) -> None:
    """Resume a persisted session through ``AgentLoop.resume``, run a turn, dispose."""
    await _seed(probe, kind, "s1")
    async with agent_run(probe, kind) as run:
        r = run.rig
        with run.caller.scope():
            h = await guarded(probe, "resume", lambda: r.loop.resume("s1", owner=run.owner))
            if h is not None:
                run.handles.append(h)
        if not run.handles:
            # Nothing was published: nothing may be left half-published.
            live = await guarded(probe, "store.list", r.store.list)
            probe.check(not live, f"resume failed but left live sessions: {live}")
            probe.check(not r.loop.list(), f"resume failed but left agents: {r.loop.list()}")
        with run.caller.scope():
            for h in run.handles:
                await guarded(probe, "run_turn", partial(h.run_turn, "continue"))
                await flush_and_acknowledge(probe, h.session, "flush")
    await _prepare_again(probe, kind, "s1")


async def _prepare_again(probe: Probe, kind: str, sid: str) -> None:
    """The writer lock was released: the session can be prepared again (disarmed)."""
    backend = plain_backend(probe, kind)
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            try:
                prep = await p.prepare(sid)
            except HarnessError as exc:
                probe.fail(f'"{sid}" cannot be prepared again after the run: {type(exc).__name__}: {exc}')
            else:
                await prep.dispose()
    finally:
        close_backend(backend)
