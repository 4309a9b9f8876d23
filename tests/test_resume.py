"""Resume: scenarios, cancellation at every checkpoint, late preparations, lineage."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import LifetimeClosedError, Owner
from harness.agent import AgentLoop, Say, ScriptedProvider, open_agent_loop
from harness.errors import PersistedSessionNotFoundError, SessionLiveError
from harness.faults import FaultPoints
from harness.persistence import JsonlBackend, Persistence, open_persistence
from harness.runtime import Store, open_store
from harness.session import EventDraft, RelationalInvariants, thaw


@asynccontextmanager
async def stack(root: Path, script: list[Any] | None = None, faults: FaultPoints | None = None, backend: Any = None) -> AsyncIterator[tuple[Store, Persistence, AgentLoop]]:
    provider = ScriptedProvider(script or [[Say("ok")]] * 5)
    async with open_store(validator_factory=RelationalInvariants) as store, open_persistence(store, backend or JsonlBackend(root)) as p:
        async with open_agent_loop(store, provider=provider, persistence=p, faults=faults) as loop:
            yield store, p, loop


async def seed_session(root: Path, sid: str = "s1", **meta: Any) -> list[str]:
    async with stack(root) as (_store, _p, loop), Owner("seed") as owner:
        h = await loop.create(sid, owner=owner, **meta)
        await h.run_turn("first")
        types = [e.type for e in h.session.events]
        await h.dispose()
    return types


async def test_resume_preserves_header_and_appends_end_seed_once(tmp_path: Path) -> None:
    await seed_session(tmp_path, cwd="/proj", delegation_depth=3, origin="subagent", agent_preset="coder")
    async with stack(tmp_path) as (store, p, loop), Owner("app") as owner:
        started: list[tuple[str, str]] = []
        order: list[str] = []
        store.on_created(lambda h: order.append("session/created"))
        loop.created_listeners.append(lambda h: order.append("agent/created"))
        loop.session_start_listeners.append(lambda h, source: started.append((h.id, source)))
        h = await loop.resume("s1", owner=owner)
        assert order == ["session/created", "agent/created"] and started == [("s1", "resume")]
        hdr = h.session.header
        assert (hdr.cwd, hdr.delegation_depth, hdr.origin, hdr.agent_preset) == ("/proj", 3, "subagent", "coder")
        events = list(h.session.events)
        assert h.session.first_live_seq == len(events) - 1 and events[-1].type == "session/end-seed"
        await h.run_turn("second")
        reasons = [thaw(e.data)["reason"] for e in h.session.events if e.type == "request/header"]
        assert reasons == ["initial", "resume"]
        assert thaw(next(e for e in reversed(events) if e.type == "turn/start").data)["turn"] == 1
        assert [thaw(e.data)["turn"] for e in h.session.events if e.type == "turn/start"] == [1, 2]
        await h.dispose()
    async with stack(tmp_path) as (store, p, loop), Owner("app") as owner:
        h = await loop.resume("s1", owner=owner)  # a turn ran since: a new end-seed
        n = h.session.seq
        await h.dispose()
    async with stack(tmp_path) as (store, _p, loop), Owner("app") as owner:
        h = await loop.resume("s1", owner=owner)
        assert h.session.seq == n  # reopening an untouched session does not grow it
        # A fresh session has no seed, so no marker; each resume after new events adds one.
        assert sum(1 for e in h.session.events if e.type == "session/end-seed") == 2


async def test_resume_errors(tmp_path: Path) -> None:
    await seed_session(tmp_path)
    async with stack(tmp_path) as (_store, _p, loop), Owner("app") as owner:
        with pytest.raises(PersistedSessionNotFoundError):
            await loop.resume("missing", owner=owner)
        h = await loop.resume("s1", owner=owner)
        with pytest.raises(SessionLiveError):
            await loop.resume("s1", owner=owner)
        await h.dispose()
        await h.dispose()  # idempotent
        assert loop.stats == {"prepared": 1, "published": 1, "disposed": 0}


async def test_concurrent_dispose_callers_wait_for_the_same_teardown(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    from harness.agent import Delay

    await seed_session(tmp_path)
    async with stack(tmp_path, [[Delay(50), Say("slow")]]) as (store, _p, loop), Owner("app") as owner:
        h = await loop.resume("s1", owner=owner)
        done: list[int] = []
        async with trio.open_nursery() as n:
            n.start_soon(h.run_turn, "go")
            await trio.sleep(1)
            for i in range(3):
                n.start_soon(lambda i=i: _dispose_and_mark(h, done, i))
        assert sorted(done) == [0, 1, 2] and h.disposed
        ends = [thaw(e.data)["reason"] for e in h.session.events if e.type == "turn/end"]
        assert ends[-1] == {"kind": "aborted", "reason": {"kind": "disposed"}}
        assert await store.get("s1") is None and loop.get("s1") is None


async def _dispose_and_mark(h: Any, done: list[int], i: int) -> None:
    await h.dispose()
    assert h.disposed
    done.append(i)


async def test_owner_close_disposes_its_agents(tmp_path: Path) -> None:
    await seed_session(tmp_path)
    async with stack(tmp_path) as (store, _p, loop):
        async with Owner("app") as owner:
            h = await loop.resume("s1", owner=owner)
        assert h.disposed and await store.get("s1") is None


CANCELLERS = ["caller", "owner", "teardown"]


async def run_with_cancel(root: Path, point: str | None, canceller: str) -> dict[str, Any]:
    faults = FaultPoints()
    outcome: dict[str, Any] = {}
    async with stack(root, faults=faults) as (store, p, loop):
        async with Owner("app") as owner:
            with trio.CancelScope() as caller:
                if point is not None:
                    action = {
                        "caller": caller.cancel,
                        "owner": lambda: owner.close("owner disposed during setup"),
                        "teardown": lambda: loop.teardown.close("agent loop is not active"),
                    }[canceller]
                    faults.on(point, action)
                try:
                    h = await loop.resume("s1", owner=owner)
                    outcome["published"] = True
                    await h.dispose()
                except LifetimeClosedError as exc:
                    outcome["error"] = exc.reason
            outcome["caller_cancelled"] = caller.cancelled_caught
            await trio.testing.wait_all_tasks_blocked()
            # No half-published session, nothing of the loop left live.
            assert await store.list() == [] and loop.list() == []
        outcome["visited"] = list(faults.visited)
        outcome["stats"] = dict(loop.stats)
    # The loop's nursery has exited: every preparation was published or disposed.
    s = outcome["stats"]
    assert s["prepared"] == s["disposed"] + s["published"], (point, canceller, s)
    # And the writer lock was released: the session can be prepared again.
    async with stack(root) as (store, p, loop):
        prep = await p.prepare("s1")
        await prep.dispose()
    return outcome


async def test_cancellation_at_every_checkpoint(tmp_path: Path) -> None:
    await seed_session(tmp_path)
    dry = await run_with_cancel(tmp_path, None, "caller")
    points = list(dict.fromkeys(dry["visited"]))
    assert dry["published"] and len(points) >= 8, points
    explored = 0
    for point in points:
        for canceller in CANCELLERS:
            out = await run_with_cancel(tmp_path, point, canceller)
            explored += 1
            if canceller == "caller":
                assert out["caller_cancelled"] or out.get("published"), (point, out)
            elif not out.get("published"):
                assert out["error"] in ("owner disposed during setup", "agent loop is not active"), (point, out)
    print(f"explored {explored} cancellations over {len(points)} checkpoints: {points}")
    assert explored == 3 * len(points)


class BlockingBackend(JsonlBackend):
    """A backend whose load blocks in its thread, ignoring cancellation."""

    def __init__(self, root: Path, gate: threading.Event) -> None:
        super().__init__(root)
        self.gate = gate
        self.entered = threading.Event()

    def load(self, session_id: str) -> Any:
        self.entered.set()
        self.gate.wait(10)
        return super().load(session_id)

    def load_lines(self, session_id: str) -> Any:  # the resume's fast read
        self.entered.set()
        self.gate.wait(10)
        return super().load_lines(session_id)


async def test_preparation_that_finishes_late_is_disposed_at_shutdown(tmp_path: Path) -> None:
    await seed_session(tmp_path)
    gate = threading.Event()
    backend = BlockingBackend(tmp_path, gate)
    async with stack(tmp_path, backend=backend) as (store, p, loop), Owner("app") as owner:
        scope = trio.CancelScope()

        async def give_up_once_blocked() -> None:
            assert await trio.to_thread.run_sync(backend.entered.wait, 60)  # the read blocks in its thread
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(give_up_once_blocked)
            with scope:
                await loop.resume("s1", owner=owner)
        assert scope.cancelled_caught  # the caller gave up; the thread is still blocked
        assert loop.stats == {"prepared": 0, "published": 0, "disposed": 0}
        # The backend returns only later, most likely while the shutdown waits for it;
        # either order leaves the same record (the late result is disposed in prepare).
        threading.Timer(0.1, gate.set).start()
    # The abandoned preparation was cancelled; its blocking read could not be, so
    # the loop's shutdown waited for it and the late result was disposed (inside
    # prepare: it never reached the loop, so the loop counts nothing).
    assert loop.stats == {"prepared": 0, "published": 0, "disposed": 0}
    # The persistence's public record observes it: prepared late, then disposed.
    record = p.preparations
    assert (record.prepared, record.published, record.disposed, record.outstanding) == (1, 0, 1, 0)
    async with stack(tmp_path) as (_store, p, loop):
        prep = await p.prepare("s1")  # its lock was released
        await prep.dispose()


async def test_resume_of_a_fork_keeps_its_lineage(tmp_path: Path) -> None:
    async with stack(tmp_path) as (store, p, loop), Owner("app") as owner:
        h = await loop.create("parent", owner=owner, cwd="/proj", delegation_depth=2)
        await h.run_turn("hello")
        child = await store.fork(h.session, None, "child")
        fork_seed_length = child.header.seed_length
        await child.append_batch([EventDraft("feedback/record", {"text": "child only"})])
        await child.flush()
        await store.detach(child)
        await h.dispose()
    async with stack(tmp_path) as (store, _p, loop), Owner("app") as owner:
        c = await loop.resume("child", owner=owner)
        hdr = c.session.header
        assert (hdr.parent_session, hdr.cwd) == ("parent", "/proj")
        assert hdr.seed_length == fork_seed_length
        # Fork does not inherit delegationDepth (reference §8); on disk absent is 0.
        assert hdr.delegation_depth == 0
        assert c.session.first_live_seq == c.session.seq - 1
        await c.run_turn("continue the branch")
        assert [thaw(e.data)["turn"] for e in c.session.events if e.type == "turn/start"] == [1, 2]


async def test_setup_runs_before_publication_and_its_failure_unwinds(tmp_path: Path) -> None:
    await seed_session(tmp_path)
    async with stack(tmp_path) as (store, p, loop), Owner("app") as owner:
        seen: list[Any] = []

        async def setup(session: Any) -> None:
            seen.append((session.events[-1].type, await store.get("s1"), loop.get("s1")))

        h = await loop.resume("s1", owner=owner, setup=setup)
        assert seen == [("session/end-seed", None, None)]  # nothing registered yet
        await h.dispose()

        async def failing(session: Any) -> None:
            raise KeyError("setup refused")

        with pytest.raises(KeyError):
            await loop.resume("s1", owner=owner, setup=failing)
        assert await store.list() == [] and loop.list() == []
        assert loop.stats["prepared"] == loop.stats["published"] + loop.stats["disposed"]
        # The persistence's own public record agrees (issue 24 §4).
        record = p.preparations
        assert (record.prepared, record.published, record.disposed, record.outstanding) == (2, 1, 1, 0)
        prep = await p.prepare("s1")  # nothing leaked: the lock is free
        assert p.preparations.outstanding == 1
        await prep.dispose()


async def test_request_header_change_is_logged(tmp_path: Path) -> None:
    async with stack(tmp_path) as (store, p, loop), Owner("app") as owner:
        h = await loop.create("c", owner=owner)
        await h.run_turn("one")
        h.agent.system = "be brief"  # the epoch header changes
        await h.run_turn("two")
        await h.run_turn("three")
        reasons = [thaw(e.data)["reason"] for e in h.session.events if e.type == "request/header"]
        assert reasons == ["initial", "change"]
