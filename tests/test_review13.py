"""Regressions found reviewing issue 13 (embedding API): unsubscribe semantics, the scope
routing of flush, single-event surface checks, type guards and typed argument errors."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

import harness
from actors import Owner
from harness.agent import (
    Agent,
    ContextWindowExceededError,
    Fail,
    RequestErrorContext,
    Retry,
    Say,
    ScriptedProvider,
)
from harness.errors import HarnessError, SessionArgumentError, SurfaceError
from harness.runtime import SessionHandle, open_store
from harness.session import (
    Event,
    adopt_event,
    is_append_surface_event,
    is_replacement_surface_event,
    is_surface_event,
    record_to_event,
    snapshot_event,
)


def user(mid: str = "m") -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": [], "source": {"kind": "user"}}


# -- unsubscribe removes its own registration, once, by identity ---------------------------


async def test_an_unsubscribe_called_twice_removes_only_its_own_registration() -> None:
    async with open_store() as store:
        seen: list[int] = []

        def listener(handle: SessionHandle, event: Event) -> None:
            seen.append(event.seq)

        first = store.on_event(listener)
        store.on_event(listener)  # the same callable, registered a second time
        s = await store.create("s")
        await s.append("x/y", {})
        assert seen == [0, 0]
        first()
        first()  # idempotent: must not remove the second registration
        await s.append("x/y", {})
        assert seen == [0, 0, 1]


async def test_an_unsubscribe_never_removes_an_equal_but_distinct_listener() -> None:
    class Recorder:
        def __init__(self, log: list[str], name: str) -> None:
            self.log, self.name = log, name

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Recorder)

        __hash__ = object.__hash__

        def __call__(self, handle: SessionHandle, event: Event) -> None:
            self.log.append(self.name)

    async with open_store() as store:
        log: list[str] = []
        store.on_event(Recorder(log, "a"))
        unsubscribe_b = store.on_event(Recorder(log, "b"))
        unsubscribe_b()
        s = await store.create("s")
        await s.append("x/y", {})
        assert log == ["a"]


async def test_the_warnings_channel_unsubscribe_is_per_registration() -> None:
    async with harness.open_runtime(provider=ScriptedProvider([[Say("hi")]])) as rt:
        got: list[str] = []

        def note(report: Any) -> None:
            got.append(report.source)

        first = rt.warnings.subscribe(note)
        rt.warnings.subscribe(note)
        first()
        first()

        def flaky(handle: SessionHandle, event: Event) -> None:
            raise RuntimeError("bug")

        rt.store.on_event(flaky)
        s = await rt.store.create("s")
        await s.append("feedback/record", {})
        assert got == ["session/event"]


# -- flush routes by scope: a listener that does not hear the session does not count --------


async def test_flush_reports_only_the_listeners_that_hear_the_session() -> None:
    async with open_store() as store, Owner("o") as o:
        heard: list[str] = []
        store.on_flush(lambda h: heard.append(h.id), scope=o)
        mine = await store.create("mine", owner=o)
        other = await store.create("other")
        assert await other.flush() is False  # the scoped listener does not hear it
        assert await mine.flush() is True
        assert heard == ["mine"]


async def test_flush_with_out_of_scope_async_listeners_runs_only_the_ones_in_scope() -> None:
    async with open_store() as store, Owner("a") as a, Owner("b") as b:
        heard: list[str] = []

        async def slow(handle: SessionHandle) -> None:
            await trio.lowlevel.checkpoint()
            heard.append(f"a:{handle.id}")

        store.on_flush(slow, scope=a)
        store.on_flush(lambda h: heard.append(f"b:{h.id}"), scope=b)
        s = await store.create("s", owner=b)
        assert await s.flush() is True
        assert heard == ["b:s"]


# -- single events: what one event shows by itself is checked as a session checks it -------


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"type": "x/y", "seq": 0, "time": 0, "data": {}, "surfaceOp": "append"},
            'session event "x/y" is not surface-eligible and cannot carry surfaceOp',
        ),
        (
            {"type": "x/y", "seq": 2, "time": 0, "data": {}, "sourceEventSeqs": [1]},
            'session event "x/y" is not surface-eligible and cannot carry sourceEventSeqs',
        ),
        (
            {"type": "user/message", "seq": 0, "time": 0, "data": user()},
            'session event "user/message" is surface-eligible and requires a surfaceOp marker',
        ),
        (
            {"type": "user/message", "seq": 0, "time": 0, "data": user(), "surfaceOp": None},
            'session event "user/message" carries an invalid surfaceOp',
        ),
    ],
)
def test_single_event_functions_refuse_what_every_session_refuses(record: dict[str, Any], message: str) -> None:
    for decode in (adopt_event, snapshot_event, record_to_event):
        with pytest.raises(SurfaceError) as info:
            decode(dict(record))
        assert str(info.value) == message, decode
        assert info.value.code == "INVALID_SURFACE"


def test_snapshot_event_checks_a_hand_built_event_the_same_way() -> None:
    with pytest.raises(SurfaceError, match="cannot carry surfaceOp"):
        snapshot_event(Event("x/y", 0, 0, {}, "append"))
    with pytest.raises(SurfaceError, match="requires a surfaceOp marker"):
        snapshot_event(Event("user/message", 0, 0, user()))
    ok = Event("user/message", 0, 0, user(), "append")
    assert snapshot_event(ok) is ok


def test_the_valid_records_still_decode() -> None:
    append = adopt_event({"type": "user/message", "seq": 0, "time": 0, "data": user(), "surfaceOp": "append"})
    assert is_append_surface_event(append)
    replace = adopt_event(
        {
            "type": "user/message",
            "seq": 3,
            "time": 0,
            "data": user("r"),
            "surfaceOp": {"op": "replace", "start": 0, "end": 2},
            "sourceEventSeqs": [0, 2],
        }
    )
    assert is_replacement_surface_event(replace) and replace.source_event_seqs == (0, 2)
    assert adopt_event({"type": "x/y", "seq": 0, "time": 0, "data": None}).surface_op is None


@pytest.mark.parametrize("value", [None, "user/message", 3, ["user/message"]])
def test_type_guards_answer_false_for_what_is_not_an_event(value: Any) -> None:
    assert is_surface_event(value) is False
    assert is_append_surface_event(value) is False
    assert is_replacement_surface_event(value) is False


# -- wrong arguments are typed errors --------------------------------------------------------


async def test_an_agent_owner_that_is_not_an_owner_is_a_typed_error() -> None:
    async with harness.open_runtime(provider=ScriptedProvider([])) as rt:
        with pytest.raises(SessionArgumentError, match=r'create agent "a": owner must be an actors.Owner') as info:
            await rt.create("a", owner="o")  # type: ignore[arg-type]
        assert info.value.code == "INVALID_SESSION_ARGUMENT" and info.value.session_id == "a"
        assert rt.agents() == [] and rt.session_ids() == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"root": 5}, "root must be a path"),
        ({"shutdown_grace": "30"}, "shutdown_grace must be a positive number"),
        ({"shutdown_grace": True}, "shutdown_grace must be a positive number"),
        ({"shutdown_grace": float("nan")}, "shutdown_grace must be a positive number"),
    ],
)
async def test_open_runtime_refuses_wrongly_typed_options_with_its_config_error(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(harness.RuntimeConfigError, match=message) as info:
        async with harness.open_runtime(**kwargs):
            pytest.fail("opened")  # pragma: no cover
    assert isinstance(info.value, HarnessError) and info.value.code == "RUNTIME_CONFIG"


# -- a contained hook failure reaches the warnings channel, not only logging -----------------


async def test_a_failing_request_error_hook_is_reported_on_the_warnings_channel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_store() as store:
        s = await store.create("s")
        provider = ScriptedProvider([[Fail(ContextWindowExceededError("too long", status=400))]])
        agent = Agent(s, provider)
        reports: list[Any] = []
        store.warnings.subscribe(reports.append)

        async def broken(ctx: RequestErrorContext) -> Retry | None:
            raise RuntimeError("hook exploded")

        agent.hooks.on_request_error(broken)
        with caplog.at_level(logging.WARNING, logger="harness.agent"):
            result = await agent.run_turn("hi")
        assert result.reason["kind"] == "error"
        assert [(r.kind, r.source, r.session_id) for r in reports] == [
            ("listener-failed", "agent/request-error", "s")
        ]
        assert isinstance(reports[0].error, RuntimeError) and "hook exploded" in reports[0].message
        [record] = [r for r in caplog.records if r.name == "harness.agent" and "request-error" in r.getMessage()]
        assert record.exc_info is not None  # the traceback is still logged


# -- agent listeners refuse an awaitable as store listeners do -------------------------------


async def test_an_agent_listener_returning_an_awaitable_is_refused_not_left_unawaited() -> None:
    from harness.agent import AgentHandle
    from harness.errors import AsyncListenerError

    async def later() -> None:
        pass  # pragma: no cover - closed, never run

    async with harness.open_runtime(provider=ScriptedProvider([[Say("hi")]])) as rt:
        reports: list[Any] = []
        rt.warnings.subscribe(reports.append)
        rt.loop.on_status(lambda h, s: later())  # type: ignore[arg-type]
        rt.loop.on_disposed(lambda h: later())  # type: ignore[arg-type]
        agent = await rt.create("a")
        await agent.run_turn("hello")
        assert [(r.source, type(r.error)) for r in reports] == [("agent/status", AsyncListenerError)] * 2
        await agent.dispose()
        assert reports[-1].source == "agent/disposed" and isinstance(reports[-1].error, AsyncListenerError)

        def created(h: AgentHandle) -> Any:
            return later()

        unsubscribe = rt.loop.on_created(created)
        with pytest.raises(AsyncListenerError, match="agent/created listener"):
            await rt.create("b")
        assert rt.get("b") is None and "b" not in rt.session_ids()
        unsubscribe()


async def test_an_unopened_agent_owner_is_refused_before_anything_is_prepared(tmp_path: Any) -> None:
    from harness.errors import SessionOwnerClosedError

    async with harness.open_runtime(tmp_path, provider=ScriptedProvider([[Say("hi")]])) as rt:
        agent = await rt.create("a")
        await agent.run_turn("hello")
        await agent.dispose()
        never = Owner("never")
        for call, what in ((rt.create("b", owner=never), "create"), (rt.resume("a", owner=never), "resume")):
            with pytest.raises(SessionOwnerClosedError) as info:
                await call
            assert str(info.value) == f'{what} agent "{"b" if what == "create" else "a"}": owner "never" is not open (enter it with async with)'
            assert (info.value.code, info.value.owner, info.value.reason) == ("OWNER_CLOSED", "never", None)
        assert rt.loop.stats["prepared"] == 1  # only the first create prepared anything
        assert (await rt.resume("a")).session.header.id == "a"  # nothing was left claimed


async def test_scope_of_refuses_what_is_not_a_handle() -> None:
    from harness.errors import SessionNotLiveError

    async with open_store() as store:
        with pytest.raises(SessionNotLiveError, match="expected a SessionHandle of this store, got 'x'"):
            store.scope_of("x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"provider": "gpt"}, "provider must be a ModelProvider (with a stream method), got 'gpt'"),
        ({"tools": [1]}, "tools must be a ToolSet, got [1]"),
        ({"system": 5}, "system must be a str, got 5"),
    ],
)
async def test_wrong_per_agent_settings_are_refused_at_create_not_in_the_first_turn(
    kwargs: dict[str, Any], message: str
) -> None:
    from harness.agent import AgentLoopError

    async with harness.open_runtime(provider=ScriptedProvider([[Say("hi")]])) as rt:
        with pytest.raises(AgentLoopError) as info:
            await rt.create("a", **kwargs)
        assert str(info.value) == message and info.value.code == "AGENT_LOOP_ERROR"
        assert rt.agents() == [] and rt.session_ids() == ()
    async with harness.open_runtime(**kwargs) as rt:  # the runtime's defaults too
        with pytest.raises(AgentLoopError, match="must be"):
            await rt.create("a", provider=ScriptedProvider([]) if "provider" not in kwargs else None)


async def test_a_listener_unsubscribed_during_a_batch_hears_none_of_its_later_events() -> None:
    from harness.session import EventDraft

    async with open_store() as store:
        s = await store.create("s")
        once: list[int] = []
        other: list[int] = []

        def first_only(handle: SessionHandle, event: Event) -> None:
            once.append(event.seq)
            unsubscribe()

        unsubscribe = store.on_event(first_only)
        store.on_event(lambda h, e: other.append(e.seq))
        await s.append_batch([EventDraft("x/y", {}) for _ in range(3)])
        assert once == [0] and other == [0, 1, 2]
        await s.append("x/y", {})
        assert once == [0] and other == [0, 1, 2, 3]


async def test_a_listener_unsubscribed_by_another_mid_dispatch_still_hears_that_event_only() -> None:
    """Reference §7: the set is resolved before the commit. A batch counts as one
    commit for its first event; its later events are not delivered to a removed one."""
    from harness.session import EventDraft

    async with open_store() as store:
        s = await store.create("s")
        seen: list[tuple[str, int]] = []

        def a(handle: SessionHandle, event: Event) -> None:
            seen.append(("a", event.seq))
            remove_b()

        store.on_event(a)
        remove_b = store.on_event(lambda h, e: seen.append(("b", e.seq)))
        await s.append_batch([EventDraft("x/y", {}) for _ in range(2)])
        assert seen == [("a", 0), ("a", 1), ("b", 0)]


async def test_an_agent_hook_remover_called_twice_removes_only_its_own_registration() -> None:
    async with open_store() as store:
        s = await store.create("s")
        agent = Agent(s, ScriptedProvider([[Say("one")], [Say("two")]]))
        seen: list[str] = []

        def status(a: Any, st: str) -> None:
            seen.append(st)

        remove = agent.hooks.on_status(status)
        agent.hooks.on_status(status)
        remove()
        remove()
        await agent.run_turn("hi")
        assert seen == ["running", "idle"]


# -- an Owner block does not wrap its body's exception in a group ----------------------------


async def test_an_owner_block_lets_its_body_error_out_unwrapped(autojump_clock: trio.testing.MockClock) -> None:
    with pytest.raises(KeyError, match="body"):
        async with Owner("o"):
            raise KeyError("body")
    with trio.CancelScope() as outer:
        with pytest.raises(KeyError, match="while cancelled"):
            async with Owner("o"):
                outer.cancel()
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    raise KeyError("while cancelled") from None
    with trio.move_on_after(0.01) as timeout:
        async with Owner("o"):
            await trio.sleep_forever()
    assert timeout.cancelled_caught


async def test_a_typed_error_of_an_owner_block_is_catchable_by_its_type() -> None:
    from harness.errors import SessionOwnerClosedError

    async with open_store() as store:
        source = await store.create("src")
        with pytest.raises(SessionOwnerClosedError):
            async with Owner("req") as req:
                await req.aclose("client went away")
                await store.fork(source, owner=req)
        assert store.live_ids() == ("src",)


async def test_an_owned_task_failure_still_comes_out_as_a_group() -> None:
    async def boom() -> None:
        raise ValueError("task")

    with pytest.RaisesGroup(ValueError, flatten_subgroups=True):
        async with Owner("o") as o:
            o.start_soon(boom)
            await trio.sleep_forever()
