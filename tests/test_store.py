"""Store and fork rules (reference §7-§8) on the actor runtime."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from harness.errors import (
    ForkError,
    InvalidBoundaryError,
    OpenTurnError,
    SessionAlreadyAnnouncedError,
    SessionAlreadyExistsError,
    SessionAttachedError,
    SessionNotFoundError,
    SessionNotLiveError,
    SurfaceChangedError,
)
from harness.runtime import SessionHandle, Store, open_store
from harness.session import EventDraft, ReplaceOp, derive_event_message
from tests.helpers import user

TURN = [
    EventDraft("turn/start", {"turn": 1}),
    EventDraft("user/message", user(), "append"),
    EventDraft("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
]


def clock() -> int:
    return 1_000


async def test_create_get_list_and_minted_ids() -> None:
    async with open_store(clock=clock) as store:
        a = await store.create()
        b = await store.create("named", cwd="/tmp", agent_preset="p")
        c = await store.create()
        assert re.fullmatch(r"session-[0-9a-f-]{36}", a.id) and a.id != c.id
        assert b.header.cwd == "/tmp" and b.header.agent_preset == "p" and b.header.created_at == 1000
        assert [h.id for h in await store.list()] == [a.id, "named", c.id]
        assert (await store.get("named")) is b
        assert await store.get("nope") is None
        with pytest.raises(SessionAlreadyExistsError) as info:
            await store.create("named")
        assert info.value.code == "SESSION_ALREADY_EXISTS" and str(info.value) == 'session "named" already exists'
        with pytest.raises(TypeError):
            await store.create(colour="red")


async def test_minted_ids_do_not_repeat_across_stores() -> None:
    # A per-store counter restarts in every process and collides with what an
    # earlier run left on disk; minted ids must not.
    seen: set[str] = set()
    for _ in range(3):
        async with open_store() as store:
            for _ in range(5):
                seen.add((await store.create()).id)
                seen.add((await store.fork(await store.create())).id)
    assert len(seen) == 30


async def test_forking_a_crashed_session_is_refused_and_the_store_goes_on() -> None:
    from harness.errors import ForkSourceNotLiveError

    async with open_store() as store:
        h = await store.create("src")
        # Crash the session actor with a bug (a message it does not know).
        assert h._entry.ref is not None
        with pytest.raises(TypeError):
            await h._entry.ref.call(object())
        with pytest.raises(ForkSourceNotLiveError):
            await store.fork(h)
        # The store actor survived: it still serves requests.
        other = await store.create("other")
        assert (await store.fork(other)).header.parent_session == "other"


async def test_stale_handles_after_detach_and_recreation() -> None:
    async with open_store() as store:
        old = await store.create("x")
        await old.append("a/b", 1)
        await store.detach(old)
        await store.detach(old)  # idempotent
        assert not old.alive
        with pytest.raises(SessionNotLiveError) as info:
            await old.append("a/b", 2)
        assert info.value.code == "SESSION_NOT_LIVE" and str(info.value) == 'session "x" is not live in this store'
        new = await store.create("x")  # the id is reusable at once
        assert new.alive and not old.alive
        with pytest.raises(SessionNotLiveError):
            await old.derive_messages()
        with pytest.raises(SessionNotLiveError):
            await store.flush(old)
        with pytest.raises(SessionNotLiveError):
            await store.announce(old)
        assert new.seq == 0 and old.seq == 1


async def test_prepare_enter_announce_rules() -> None:
    async with open_store() as store:
        created: list[str] = []
        store.on_created(lambda h: created.append(h.id))
        prepared = await store.prepare("p", seed=[])
        assert prepared.session.seq == 1 and created == []  # end-seed, nothing emitted
        handle = await store.enter(prepared)
        with pytest.raises(SessionAlreadyExistsError):  # the live id is checked first
            await store.enter(prepared)
        async with open_store() as second:
            with pytest.raises(SessionAttachedError) as attached:
                await second.enter(prepared)
            assert str(attached.value) == 'session "p" is already attached to a store'
        other = await store.prepare("q")
        await store.enter(other)
        with pytest.raises(SessionAlreadyExistsError):
            await store.prepare("p")
        await store.announce(handle)
        with pytest.raises(SessionAlreadyAnnouncedError) as info:
            await store.announce(handle)
        assert str(info.value) == 'session "p" was already announced'
        assert created == ["p"]


async def test_created_veto_detaches_and_frees_the_id() -> None:
    async with open_store() as store:
        disposed: list[str] = []

        def veto(h: SessionHandle) -> None:
            raise ValueError("no thanks")

        remove = store.on_created(veto)
        store.on_disposed(lambda h: disposed.append(h.id))
        with pytest.raises(ValueError):
            await store.create("v")
        assert disposed == ["v"] and await store.get("v") is None
        remove()
        assert (await store.create("v")).alive


async def test_event_listener_failures_are_contained(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "harness.store")
    async with open_store() as store:
        seen: list[tuple[str, int]] = []

        def bad(h: SessionHandle, ev: Any) -> None:
            raise RuntimeError("boom")

        store.on_event(bad)
        store.on_event(lambda h, ev: seen.append((h.id, ev.seq)))
        s = await store.create("s")
        ev = await s.append("a/b", 1)
        assert ev.seq == 0 and s.seq == 1 and seen == [("s", 0)]
        assert 'session "s": session/event listener threw: RuntimeError: boom' in caplog.text

        def bad_disposed(h: SessionHandle) -> None:
            raise RuntimeError("gone wrong")

        store.on_disposed(bad_disposed)
        await store.detach(s)
        assert "session/disposed listener threw: RuntimeError: gone wrong" in caplog.text


async def test_listener_failure_without_a_message_is_logged_as_its_type(caplog: pytest.LogCaptureFixture) -> None:
    # JS String(new Error()) is "Error": no ": " before an empty message.
    caplog.set_level(logging.WARNING, "harness.store")
    async with open_store() as store:

        def bad(h: SessionHandle, ev: Any) -> None:
            raise ValueError

        store.on_event(bad)
        s = await store.create("s")
        await s.append("a/b", 1)
        assert [r.getMessage() for r in caplog.records if "listener threw" in r.getMessage()] == [
            'session "s": session/event listener threw: ValueError'
        ]


async def test_pre_commit_hook_vetoes_whole_batch() -> None:
    async with open_store() as store:
        def hook(h: SessionHandle, events: tuple[Any, ...]) -> None:
            if any(e.type == "forbidden" for e in events):
                raise SurfaceChangedError("vetoed")

        store.add_pre_commit_hook(hook)
        s = await store.create()
        with pytest.raises(SurfaceChangedError):
            await s.append_batch([EventDraft("ok", 1), EventDraft("forbidden", 2)])
        assert s.seq == 0
        await s.append("ok", 1)
        assert s.seq == 1

        def plain_veto(h: SessionHandle, events: tuple[Any, ...]) -> None:
            if any(e.type == "nope" for e in events):
                raise ValueError("any exception type vetoes")

        store.add_pre_commit_hook(plain_veto)
        with pytest.raises(ValueError):
            await s.append("nope", 1)
        assert s.alive and (await s.append("ok", 2)).seq == 1  # a veto is not a crash


async def test_a_vetoed_single_append_leaves_the_validator_state_and_turn_marks_as_they_were() -> None:
    # The one-draft path plans (the validator's next state included) before the hooks
    # and applies it only after them, as a batch's plan and commit do.
    from harness.errors import InvariantError
    from harness.session import RelationalInvariants, Session

    async with open_store(clock=clock) as store:
        veto = {"on": True}

        def hook(h: SessionHandle, events: tuple[Any, ...]) -> None:
            if veto["on"]:
                raise ValueError(f'session "{h.id}": vetoed {events[0].type}')

        store.add_pre_commit_hook(hook)
        heard: list[int] = []
        store.on_event(lambda h, e: heard.append(e.seq))
        session = Session.create("v", clock=clock, validator=RelationalInvariants())
        s = await store.enter(await store.adopt(session))
        with pytest.raises(ValueError, match="vetoed turn/start"):
            await s.append("turn/start", {"turn": 1})
        assert (s.seq, s.last_turn(), heard) == (0, 0, [])
        assert session._turn_marks == []
        veto["on"] = False
        with pytest.raises(InvariantError):  # no turn is open: the vetoed start left no state
            await s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        await s.append("turn/start", {"turn": 1})
        assert (s.seq, session._turn_marks, heard) == (1, [0], [0])


async def test_flush_runs_listeners_and_reports_first_failure(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store() as store:
        s = await store.create()
        assert await store.flush(s) is False
        order: list[str] = []

        async def slow_fail(h: SessionHandle) -> None:
            await trio.sleep(0.01)
            order.append("slow")
            raise OSError("first in listener order")

        async def fast_fail(h: SessionHandle) -> None:
            order.append("fast")
            raise KeyError("second")

        store.on_flush(slow_fail)
        store.on_flush(fast_fail)
        with pytest.raises(OSError, match="first in listener order"):
            await s.flush()
        assert sorted(order) == ["fast", "slow"]


async def test_commit_replace_checks_the_surface_atomically() -> None:
    async with open_store() as store:
        s = await store.create()
        await s.append("user/message", user("a"), surface_op="append")
        await s.append("user/message", user("b"), surface_op="append")
        expected = s.surface()
        await s.append("user/message", user("c"), surface_op="append")
        with pytest.raises(SurfaceChangedError) as info:
            await s.commit_replace(expected, "user/message", user("sum"), surface_op=ReplaceOp(0, 1), source_event_seqs=[0, 1])
        assert info.value.code == "SURFACE_CHANGED" and s.seq == 3
        ev = await s.commit_replace(s.surface(), "user/message", user("sum"), surface_op=ReplaceOp(0, 1), source_event_seqs=[0, 1])
        assert s.surface() == (ev.seq, 2)


# -- fork ------------------------------------------------------------------------------


async def test_fork_shares_prefix_and_records_lineage() -> None:
    async with open_store(clock=clock) as store:
        parent = await store.create("p", cwd="/w", delegation_depth=2, origin="subagent", agent_preset="x")
        await parent.append_batch(TURN)
        await parent.append("log/only", 1)
        created: list[str] = []
        store.on_created(lambda h: created.append(h.id))
        child = await store.fork(parent, 2, "c")
        assert [e.type for e in child.events] == ["turn/start", "user/message", "turn/end", "session/end-seed"]
        assert all(child.events[i] == parent.events[i] and child.events[i]._data is parent.events[i]._data for i in range(3))
        h = child.header
        assert (h.parent_session, h.seed_length, h.cwd) == ("p", 3, "/w")
        assert (h.origin, h.delegation_depth, h.agent_preset) == (None, None, None)  # not inherited
        assert created == ["c"] and parent.seq == 4  # the parent gained nothing
        await child.append("child/only", 1)
        assert parent.seq == 4 and child.seq == 5
        whole = await parent.fork()  # boundary omitted: last seq
        assert whole.header.seed_length == 4


async def test_fork_errors_in_reference_order() -> None:
    async with open_store() as store:
        s = await store.create("s")
        await s.append_batch(TURN)
        await s.append("turn/start", {"turn": 2})
        await store.create("taken")
        cases: list[tuple[Any, Any, str | None, type[ForkError] | type[Exception], str]] = [
            ("missing", 0, "taken", SessionAlreadyExistsError, 'session "taken" already exists'),
            ("missing", 0, None, SessionNotFoundError, 'session "missing" not found'),
            (s, -1, None, InvalidBoundaryError, 'fork boundary for session "s" must be a non-negative safe integer, got -1'),
            (s, 1.5, None, InvalidBoundaryError, "must be a non-negative safe integer, got 1.5"),
            # String(boundary), as the reference interpolates it.
            (s, True, None, InvalidBoundaryError, "must be a non-negative safe integer, got true"),
            (s, 2.0, None, InvalidBoundaryError, "must be a non-negative safe integer, got 2.0"),
            (s, [1, None], None, InvalidBoundaryError, "must be a non-negative safe integer, got 1,"),
            (s, 9, None, InvalidBoundaryError, 'fork boundary 9 does not exist in session "s" (last seq: 3)'),
            (s, 1, None, OpenTurnError, 'fork boundary 1 in session "s" ends inside open turn 1'),
            (s, 3, None, OpenTurnError, "ends inside open turn 2"),
            (s, None, None, OpenTurnError, "ends inside open turn 2"),
        ]
        for source, boundary, child, exc_type, message in cases:
            with pytest.raises(exc_type) as info:
                await store.fork(source, boundary, child)
            assert message in str(info.value)
            assert isinstance(info.value, ForkError)
        assert [h.id for h in await store.list()] == ["s", "taken"]
        empty = await store.create("empty")
        with pytest.raises(InvalidBoundaryError, match=r"last seq: none"):
            await store.fork(empty, 0)
        assert (await store.fork(empty)).seq == 1  # empty seed -> just the end-seed
        await store.detach(s)
        with pytest.raises(SessionNotFoundError) as nf:
            await store.fork(s, 2)
        assert nf.value.code == "SESSION_NOT_FOUND"
        await store.create("s")
        with pytest.raises(SessionNotLiveError) as nl:
            await store.fork(s, 2)
        assert nl.value.code == "SESSION_NOT_LIVE" and str(nl.value) == 'session "s" is not the live store instance'


async def test_fork_open_turn_shows_the_turn_value_as_the_reference() -> None:
    # ``ends inside open turn ${data.turn}``: an absent turn is "undefined", a JSON
    # null "null", a boolean lower-case.
    async with open_store() as store:
        for sid, data, shown in (("a", {}, "undefined"), ("n", {"turn": None}, "null"), ("b", {"turn": True}, "true")):
            s = await store.create(sid)
            await s.append("turn/start", data)
            with pytest.raises(OpenTurnError) as info:
                await store.fork(s, 0)
            assert str(info.value) == f'fork boundary 0 in session "{sid}" ends inside open turn {shown}'
        assert [h.id for h in await store.list()] == ["a", "n", "b"]  # no child created


# -- concurrency and shutdown -----------------------------------------------------------


async def test_concurrent_appends_and_forks() -> None:
    async with open_store() as store:
        s = await store.create("hot")
        forks: list[SessionHandle] = []

        async def writer(i: int) -> None:
            for j in range(5):
                await s.append("user/message", user(f"m{i}-{j}"), surface_op="append")

        async def forker() -> None:
            for _ in range(20):
                forks.append(await store.fork(s))
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as n:
            for i in range(200):
                n.start_soon(writer, i)
            n.start_soon(forker)
        events = list(s.events)
        assert [e.seq for e in events] == list(range(1000))
        ids = [e.data["id"] for e in events]  # type: ignore[index]
        assert sorted(ids) == sorted(f"m{i}-{j}" for i in range(200) for j in range(5))
        for child in forks:
            n_seed = child.header.seed_length
            assert n_seed is not None
            assert list(child.events)[:n_seed] == events[:n_seed]
            assert child.events[n_seed].type == "session/end-seed"
        msgs = await s.derive_messages()
        assert list(msgs) == [derive_event_message(e) for e in events]


async def test_normal_exit_disposes_everything_in_order() -> None:
    disposed: list[str] = []
    async with open_store() as store:
        store.on_disposed(lambda h: disposed.append(h.id))
        handles = [await store.create(f"s{i}") for i in range(3)]
        for h in handles:
            await h.append("a/b", 1)
        runtime = store.runtime
    assert disposed == ["s2", "s1", "s0"]
    assert not any(h.alive for h in handles)
    assert runtime._nursery is None  # no actor left running
    with pytest.raises(Exception, match="closed"):
        await store.create()


@pytest.mark.parametrize("how", ["error", "cancel"])
async def test_exit_under_error_or_cancellation_leaves_nothing_running(how: str) -> None:
    store_box: list[Store] = []
    with trio.CancelScope() as scope:
        try:
            async with open_store() as store:
                store_box.append(store)
                s = await store.create()
                await s.append("a/b", 1)
                if how == "error":
                    raise LookupError("app failed")
                scope.cancel()
                await trio.sleep_forever()
        except* LookupError:
            pass
    assert store_box[0].runtime._nursery is None
    assert all(cell.stopped.is_set() for cell, _ in store_box[0].runtime._actors.values())
