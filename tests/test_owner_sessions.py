"""Owner-bound sessions and scope routing of store listeners (issue 13, reference §7)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import trio
import trio.testing

import harness
from actors import LifetimeClosedError, Owner
from harness.agent import AgentSetupAbortedError, Say, ScriptedProvider
from harness.errors import SessionOwnerClosedError
from harness.faults import Probe
from harness.runtime import SessionHandle, Store, open_store
from harness.testing import ExploreCheckpoints, assert_log_ok

# -- the kernel: Owner.defer, parents -------------------------------------------------------


async def test_owner_runs_its_cleanups_newest_first_and_waits_for_them() -> None:
    done: list[str] = []

    def cleanup(name: str) -> Any:
        async def run() -> None:
            await trio.lowlevel.checkpoint()
            done.append(name)

        return run

    async with Owner("app") as owner:
        owner.defer(cleanup("a"))
        remove_b = owner.defer(cleanup("b"))
        owner.defer(cleanup("c"))
        remove_b()
        remove_b()  # idempotent
        await owner.aclose("done")
        assert done == ["c", "a"]
        with pytest.raises(LifetimeClosedError):
            owner.defer(cleanup("late"))
    assert done == ["c", "a"]


async def test_an_unopened_owner_refuses_cleanups() -> None:
    with pytest.raises(LifetimeClosedError, match="not entered"):
        Owner("app").defer(trio.lowlevel.checkpoint)


async def test_a_failing_cleanup_is_logged_and_the_next_runs(caplog: pytest.LogCaptureFixture) -> None:
    done: list[str] = []

    async def fail() -> None:
        raise RuntimeError("cleanup broke")

    async def ok() -> None:
        done.append("ok")

    async with Owner("app") as owner:
        owner.defer(ok)
        owner.defer(fail)
    assert done == ["ok"]
    assert "cleanup" in caplog.text and "cleanup broke" in caplog.text


async def test_a_child_owner_closes_with_its_parent_and_descends_from_it() -> None:
    async with Owner("parent") as parent:
        async with Owner("child", parent=parent) as child:
            grandchild = Owner("grandchild", parent=child)
            async with grandchild:
                assert grandchild.descends_from(parent) and grandchild.descends_from(child)
                assert not parent.descends_from(child)
                await parent.aclose("bye")
                assert child.closed and grandchild.closed and child.reason == "bye"
        with pytest.raises(LifetimeClosedError):
            async with Owner("late", parent=parent):
                pass  # pragma: no cover


async def test_a_cleanup_closing_its_own_owner_does_not_deadlock() -> None:
    async with Owner("app") as owner:

        async def close_self() -> None:
            await owner.aclose("again")

        owner.defer(close_self)
    assert owner.reason == "owner exited"


async def test_an_enclosing_cancellation_still_runs_the_cleanups(autojump_clock: trio.testing.MockClock) -> None:
    done: list[str] = []

    async def cleanup() -> None:
        await trio.sleep(1)  # shielded: the enclosing scope is cancelled
        done.append("cleaned")

    with trio.CancelScope() as outer:
        async with Owner("app") as owner:
            owner.defer(cleanup)
            outer.cancel()
            await trio.sleep_forever()
    assert done == ["cleaned"] and owner.closed


# -- the store: owner-bound create and fork -------------------------------------------------


class Seen:
    def __init__(self, store: Store, scope: Owner | None = None) -> None:
        self.created: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.disposed: list[str] = []
        self.flushed: list[str] = []
        store.on_created(lambda h: self.created.append(h.id), scope=scope)
        store.on_event(lambda h, e: self.events.append((h.id, e.type)), scope=scope)
        store.on_disposed(lambda h: self.disposed.append(h.id), scope=scope)
        store.on_flush(lambda h: self.flushed.append(h.id), scope=scope)


async def test_closing_an_owner_disposes_its_sessions_newest_first_and_spares_others() -> None:
    async with open_store() as store:
        seen = Seen(store)
        async with Owner("a") as a, Owner("b") as b:
            s1 = await store.create("a1", owner=a)
            other = await store.create("b1", owner=b)
            s2 = await store.create("a2", owner=a)
            forked = await store.fork(s1, child_id="a1-fork", owner=a)
            loose = await store.create("loose")
            assert store.scope_of(s1) is a and store.scope_of(loose) is None
            await a.aclose("a is done")
            # aclose returned only once every session/disposed was dispatched
            assert seen.disposed == ["a1-fork", "a2", "a1"]
            assert not (s1.alive or s2.alive or forked.alive)
            assert other.alive and loose.alive
            assert [h.id for h in await store.list()] == ["b1", "loose"]
            assert store.scope_of(s1) is None  # the binding went with the session
        assert seen.disposed == ["a1-fork", "a2", "a1", "b1"]
        assert loose.alive
    assert seen.disposed[-1] == "loose"


async def test_a_closed_or_unopened_owner_refuses_new_sessions() -> None:
    async with open_store() as store:
        seen = Seen(store)
        async with Owner("a") as a:
            source = await store.create("src")
        with pytest.raises(SessionOwnerClosedError, match='create: cannot create session "x": owner "a" is closed') as info:
            await store.create("x", owner=a)
        assert info.value.code == "OWNER_CLOSED"
        assert (info.value.session_id, info.value.owner, info.value.reason) == ("x", "a", "owner exited")
        with pytest.raises(SessionOwnerClosedError, match='fork: cannot create session "y"'):
            await store.fork(source, child_id="y", owner=a)
        with pytest.raises(SessionOwnerClosedError, match="is not open"):
            await store.create("z", owner=Owner("never"))
        assert [h.id for h in await store.list()] == ["src"]
        assert seen.created == ["src"] and seen.disposed == []


async def test_a_session_detached_otherwise_is_forgotten_by_its_owner() -> None:
    async with open_store() as store:
        seen = Seen(store)
        async with Owner("a") as a:
            s = await store.create("s", owner=a)
            await store.detach(s)
            assert a._cleanups == {}  # nothing left for the owner to do
        assert seen.disposed == ["s"]  # once


async def test_a_vetoed_create_leaves_nothing_with_the_owner() -> None:
    async with open_store() as store:
        unsubscribe = store.on_created(_veto)
        async with Owner("a") as a:
            with pytest.raises(ValueError, match="no"):
                await store.create("s", owner=a)
            assert a._cleanups == {} and store._bindings == {}
        unsubscribe()


def _veto(handle: SessionHandle) -> None:
    raise ValueError("no")


# -- scope routing -------------------------------------------------------------------------


async def test_scoped_listeners_hear_only_their_scope_and_its_descendants() -> None:
    async with open_store() as store, Owner("a") as a, Owner("b") as b:
        async with Owner("a-child", parent=a) as child:
            everyone, of_a, of_b = Seen(store), Seen(store, a), Seen(store, b)
            of_child = Seen(store, child)
            sa = await store.create("sa", owner=a)
            sc = await store.create("sc", owner=child)
            sb = await store.create("sb", owner=b)
            su = await store.create("su")
            for s in (sa, sc, sb, su):
                await s.append("feedback/record", {"text": s.id})
                await store.flush(s)
            await child.aclose("child done")
            await store.detach(sb)
            await store.detach(su)
            assert everyone.created == ["sa", "sc", "sb", "su"]
            assert of_a.created == ["sa", "sc"] and of_b.created == ["sb"] and of_child.created == ["sc"]
            assert of_a.events == [("sa", "feedback/record"), ("sc", "feedback/record")]
            assert of_b.events == [("sb", "feedback/record")]
            assert of_a.flushed == ["sa", "sc"] and of_b.flushed == ["sb"]
            assert everyone.flushed == ["sa", "sc", "sb", "su"]
            # disposal routes by the scope captured at enter
            assert of_a.disposed == ["sc"] and of_child.disposed == ["sc"] and of_b.disposed == ["sb"]
            assert everyone.disposed == ["sc", "sb", "su"]


async def test_a_scoped_listener_is_checked_like_an_unscoped_one() -> None:
    async def async_listener(handle: SessionHandle) -> None:
        pass  # pragma: no cover

    async with open_store() as store, Owner("a") as a:
        with pytest.raises(harness.errors.AsyncListenerError):
            store.on_disposed(async_listener, scope=a)  # type: ignore[arg-type]
        with pytest.raises(harness.errors.SessionArgumentError, match=r"scope must be an actors\.Owner"):
            store.on_event(lambda h, e: None, scope="a")  # type: ignore[arg-type]


# -- agents and the front door -------------------------------------------------------------


async def test_closing_an_owner_disposes_its_agents_and_forks_and_waits() -> None:
    agent_disposed: list[str] = []
    provider = ScriptedProvider([[Say("one")], [Say("two")]])
    async with harness.open_runtime(provider=provider) as rt:
        rt.loop.disposed_listeners.append(lambda h: agent_disposed.append(h.id))
        async with Owner("user") as user:
            of_user = Seen(rt.store, user)
            agent = await rt.create("agent", owner=user)
            kept = await rt.create("kept")
            await agent.run_turn("hi")
            child = await rt.fork(agent, child_id="agent-fork", owner=user)
            mine = await rt.fork(kept, child_id="kept-fork")
            assert rt.store.scope_of(agent.session) is user and rt.store.scope_of(mine) is rt.owner
            await user.aclose("user left")
            assert agent_disposed == ["agent"] and agent.disposed and not child.alive
            assert sorted(of_user.disposed) == ["agent", "agent-fork"]
            assert ("agent", "turn/end") in of_user.events
            assert kept.session.alive and mine.alive
            with pytest.raises(AgentSetupAbortedError, match="owner disposed during setup"):
                await rt.create("late", owner=user)
            with pytest.raises(SessionOwnerClosedError):
                await rt.fork(kept, owner=user)
            assert_log_ok(agent)
    assert not mine.alive  # the runtime owner's fork went with the runtime


# -- exploration: a cancellation at every checkpoint of an owner's close --------------------


def _owner_close_body(probe: Probe) -> Any:
    async def body() -> None:
        disposed: Counter[str] = Counter()
        agent_disposed: list[str] = []
        provider = ScriptedProvider([[Say("done")]])
        handles: dict[str, Any] = {}
        async with harness.open_runtime(provider=provider) as rt:
            rt.store.on_disposed(lambda h: disposed.update([h.id]))
            rt.loop.disposed_listeners.append(lambda h: agent_disposed.append(h.id))
            async with Owner("user") as user:
                handles["agent"] = await rt.create("agent", owner=user)
                await handles["agent"].run_turn("hi")
                handles["s"] = await rt.store.create("s", owner=user)
                handles["f"] = await rt.fork(handles["s"], child_id="f", owner=user)
                handles["other"] = await rt.store.create("other")
                await handles["s"].append("feedback/record", {"text": "pending"})
                probe.arm()
                with trio.CancelScope() as close_wait:
                    probe.canceller("close-wait", close_wait.cancel)
                    await user.aclose("user left")
                if not close_wait.cancelled_caught:
                    probe.check(
                        disposed == Counter({"agent": 1, "s": 1, "f": 1}) and agent_disposed == ["agent"],
                        f"after aclose returned: disposed {dict(disposed)}, agents {agent_disposed}",
                    )
                probe.check(handles["other"].alive, "another owner's session was detached")
            # the owner's block has ended: whatever was cancelled, its close completed
            probe.check(
                disposed == Counter({"agent": 1, "s": 1, "f": 1}),
                f"after the owner's block: disposed {dict(disposed)}",
            )
            probe.check(rt.store._bindings == {} and user._cleanups == {}, "a binding leaked")
        probe.check(disposed["other"] == 1 and max(disposed.values()) == 1, f"disposed {dict(disposed)}")
        for h in handles.values():
            assert_log_ok(h)

    return body


def test_cancellation_during_an_owner_close_at_every_checkpoint(explore_checkpoints: ExploreCheckpoints) -> None:
    async def body(probe: Probe) -> None:
        await _owner_close_body(probe)()

    report = explore_checkpoints(body, arm=False, name="owner-close")
    assert set(report.steps) == {"caller", "close-wait"} and report.attempts > 20


def test_creates_and_forks_racing_an_owner_close_at_every_checkpoint(explore_checkpoints: ExploreCheckpoints) -> None:
    """Whatever step the owner closes at, each create/fork either failed (nothing live)
    or returned a session the close then detached: none outlives its closed owner."""

    async def body(probe: Probe) -> None:
        disposed: Counter[str] = Counter()
        made: list[SessionHandle] = []
        async with open_store() as store:
            store.on_disposed(lambda h: disposed.update([h.id]))
            source = await store.create("source")
            async with Owner("user") as user:
                probe.canceller("owner", lambda: user.close("closed by the test"))
                probe.arm()
                try:
                    made.append(await store.create("s1", owner=user))
                    made.append(await store.fork(source, child_id="f1", owner=user))
                    made.append(await store.create("s2", owner=user))
                except SessionOwnerClosedError as exc:
                    probe.check(user.closed and exc.owner == "user", f"refused by an open owner: {exc}")
                await user.aclose("done")
                probe.disarm()
                live = {h.id for h in await store.list()}
                probe.check(live == {"source"}, f"sessions outlived their owner: {live}")
                probe.check(store._bindings == {} and user._cleanups == {}, "a binding leaked")
                probe.check(all(disposed[h.id] == 1 for h in made), f"disposed {dict(disposed)}")

    report = explore_checkpoints(body, arm=False, name="owner-create-race")
    assert set(report.steps) == {"caller", "owner"} and report.attempts > 10
