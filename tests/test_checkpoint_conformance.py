"""Checkpoint policy and resume aborts against the reference (issue 11 §3).

Reference: shared/reference/persistence-resume.md §4 (checkpoint policy), §5.2/§5.7
(abort reasons of resume/create), §5.6/§7 (teardown and owner unload).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import Lifetime, LifetimeClosedError, Owner, run_abandonable
from harness.agent import (
    Agent,
    AgentLoop,
    Call,
    Say,
    ScriptedProvider,
    ToolSet,
    open_agent_loop,
    tool,
)
from harness.agent._loop import AgentSetupAbortedError
from harness.errors import FlushError
from harness.faults import FaultPoints
from harness.persistence import CheckpointPolicy, JsonlBackend, Persistence, open_persistence
from harness.runtime import SessionHandle, Store, open_store
from harness.session import RelationalInvariants, thaw

# -- helpers ---------------------------------------------------------------------------


@asynccontextmanager
async def stack(
    root: Path, script: list[Any], tools: ToolSet | None = None, faults: FaultPoints | None = None
) -> AsyncIterator[tuple[Store, Persistence, AgentLoop]]:
    provider = ScriptedProvider(script)
    async with open_store(validator_factory=RelationalInvariants) as store, open_persistence(store, JsonlBackend(root)) as p:
        async with open_agent_loop(store, provider=provider, tools=tools, persistence=p, faults=faults) as loop:
            yield store, p, loop


def types(s: SessionHandle) -> list[str]:
    """The log's event types, runs of ``assistant/chunk`` folded into one."""
    out: list[str] = []
    for e in s.events:
        if e.type == "assistant/chunk" and out and out[-1] == "assistant/chunk":
            continue
        out.append(e.type)
    return out


def data(s: SessionHandle, type_: str) -> list[Any]:
    return [thaw(e.data) for e in s.events if e.type == type_]


class FlushFault:
    """A flush listener that fails (or runs ``action``) on the flushes it is armed for,
    and records every flush it sees in ``order`` (shared with event listeners)."""

    def __init__(self, order: list[str]) -> None:
        self.order = order
        self.fail = 0
        self.action: Callable[[], None] | None = None
        self.checkpoint_after_action = True

    async def __call__(self, handle: SessionHandle) -> None:
        if self.action is not None:
            action, self.action = self.action, None
            self.order.append("flush:action")
            action()
            if self.checkpoint_after_action:
                await trio.lowlevel.checkpoint()  # the cancellation lands inside the flush
            return
        if self.fail:
            self.fail -= 1
            self.order.append("flush:fail")
            raise FlushError("injected flush failure", session_id=handle.id)
        self.order.append("flush")


def record_events(store: Store, order: list[str], wanted: set[str]) -> None:
    def on_event(handle: SessionHandle, ev: Any) -> None:
        if ev.type in wanted:
            order.append(ev.type)

    store.on_event(on_event)


def tool_result_of(s: SessionHandle, call_id: str) -> Any:
    return next(r for r in data(s, "tool/result") if r["message"]["source"]["callId"] == call_id)


# -- item 1: the before-tool flush ---------------------------------------------------------


async def test_a_failing_before_tool_flush_is_the_calls_error_result_and_the_turn_goes_on(tmp_path: Path) -> None:
    ran: list[str] = []

    @tool("add", "Add a and b")
    async def add(args: dict[str, Any]) -> Any:
        ran.append("add")
        return {"sum": args["a"] + args["b"]}

    script = [[Call("add", {"a": 1, "b": 2}, id="c1")], [Say("done")]]
    async with stack(tmp_path, script, ToolSet([add])) as (store, p, loop), Owner("app") as owner:
        order: list[str] = []
        fault = FlushFault(order)
        store.on_flush(fault)
        record_events(store, order, {"tool/call", "tool/result", "step/start", "step/end", "turn/end"})

        def arm(handle: Any, events: Any) -> None:
            if any(e.type == "tool/call" for e in events):
                fault.fail = 1  # exactly the before-tool flush

        store.add_pre_commit_hook(arm)
        h = await loop.create("a", owner=owner)
        statuses: list[str] = []
        h.agent.hooks.on_status(lambda agent, status: statuses.append(status))
        result = await h.run_turn("add 1 and 2")

        assert result.reason == {"kind": "completed"}  # the turn went on
        assert ran == []  # the body never ran
        assert types(h.session) == [
            "agent/inbox/spliced", "turn/start", "agent/inbox/spliced",
            "step/start", "user/message", "request/header", "request/context", "assistant/chunk",
            "assistant/message", "tool/call", "tool/result", "step/end",
            "step/start", "assistant/chunk", "assistant/message", "step/end",
            "turn/end",
        ]  # fmt: skip
        res = tool_result_of(h.session, "c1")
        assert res["error"] == {"name": "FlushError", "code": "FLUSH_FAILED"}
        assert res["message"]["content"] == [
            {
                "type": "tool-result",
                "toolCallId": "c1",
                "content": [{"type": "text", "text": "Error: injected flush failure"}],
                "isError": True,
            }
        ]
        # The model saw the error result on the next step.
        assert [m["role"] for m in loop.provider.requests[1].messages][-2:] == ["assistant", "user"]  # type: ignore[attr-defined]
        # Listener order: pre-step flush, step/start, request flush, ..., tool/call, the
        # failing before-tool flush, its error result, step/end, the next step's flushes.
        assert order == [
            "flush", "step/start", "flush", "tool/call", "flush:fail", "tool/result", "step/end",
            "flush", "step/start", "flush", "step/end", "turn/end",
        ]  # fmt: skip
        assert statuses == ["running", "idle"]
        await h.dispose()
    # The error result is durable like any other event.
    async with stack(tmp_path, [[Say("again")]]) as (_store, p, _loop):
        stored = await p.load("a")
        assert [e.type for e in stored.events if e.type in ("tool/result", "turn/end")] == ["tool/result", "turn/end"]


@pytest.mark.parametrize("inside", [True, False], ids=["cancelled-inside-flush", "cancel-pending-after-flush"])
async def test_a_turn_cancelled_during_the_before_tool_flush_never_starts_the_body(inside: bool) -> None:
    started: list[str] = []

    @tool("side", "A side effect before its first checkpoint")
    async def side(args: dict[str, Any]) -> Any:
        started.append("side")  # runs synchronously as soon as the body starts
        await trio.lowlevel.checkpoint()
        return "done"

    # No persistence: this fault is the only flush listener, so the flush returns
    # normally when the action does not checkpoint (the cancellation is then pending).
    async with open_store(validator_factory=RelationalInvariants) as store:
        order: list[str] = []
        fault = FlushFault(order)
        fault.checkpoint_after_action = inside
        store.on_flush(fault)
        record_events(store, order, {"tool/call", "tool/result", "step/end", "turn/end"})
        s = await store.create("a")
        agent = Agent(s, ScriptedProvider([[Call("side", id="c1")], [Say("never")]]), ToolSet([side]), checkpoint=CheckpointPolicy(store))

        def arm(handle: Any, events: Any) -> None:
            if any(e.type == "tool/call" for e in events):
                fault.action = lambda: agent.cancel("parent")

        store.add_pre_commit_hook(arm)
        result = await agent.run_turn("go")

        assert started == []
        assert result.reason == {"kind": "aborted", "reason": {"kind": "parent"}}
        res = tool_result_of(s, "c1")
        assert res["error"] == {"name": "AbortError", "code": "TOOL_ABORTED_BEFORE_DISPATCH"}
        assert res["message"]["content"][0]["content"] == [{"type": "text", "text": "Error: tool call aborted before dispatch"}]
        assert res["message"]["content"][0]["isError"] is True
        assert types(s)[-5:] == ["assistant/message", "tool/call", "tool/result", "step/end", "turn/end"]
        assert order[-5:] == ["tool/call", "flush:action", "tool/result", "step/end", "turn/end"]


async def test_a_call_queued_behind_the_limiter_when_the_turn_is_cancelled_is_aborted_before_dispatch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started: list[str] = []

    @tool("hang", "Never returns")
    async def hang(args: dict[str, Any]) -> Any:
        started.append(args["n"])
        await trio.sleep_forever()

    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create("a")
        agent = Agent(
            s, ScriptedProvider([[Call("hang", {"n": "c1"}, id="c1"), Call("hang", {"n": "c2"}, id="c2")]]),
            ToolSet([hang]), tool_concurrency=1,
        )  # fmt: skip
        async with trio.open_nursery() as n:
            results: list[Any] = []

            async def run() -> None:
                results.append(await agent.run_turn("go"))

            n.start_soon(run)
            await trio.sleep(5)
            agent.cancel("user")
        assert results[0].reason == {"kind": "aborted", "reason": {"kind": "user"}}
        assert len(started) == 1  # one body holds the only slot; the other never starts
        first = started[0]
        other = "c2" if first == "c1" else "c1"
        assert tool_result_of(s, first)["error"] == {"name": "AbortError", "code": "TOOL_ABORTED"}
        assert tool_result_of(s, other)["error"] == {"name": "AbortError", "code": "TOOL_ABORTED_BEFORE_DISPATCH"}


# -- item 2: the pre-step flush -----------------------------------------------------------


@pytest.mark.parametrize("failing_step", [1, 2])
async def test_a_failing_pre_step_flush_ends_the_turn_with_an_error(tmp_path: Path, failing_step: int) -> None:
    @tool("echo", "Echo")
    async def echo(args: dict[str, Any]) -> Any:
        return "echoed"

    script = [[Call("echo", id="c1")], [Say("done")]]
    async with stack(tmp_path, script, ToolSet([echo])) as (store, _p, loop), Owner("app") as owner:
        order: list[str] = []
        fault = FlushFault(order)
        store.on_flush(fault)
        record_events(store, order, {"step/start", "step/end", "turn/end"})
        h = await loop.create("a", owner=owner)

        async def pre_step(ctx: Any) -> None:
            order.append(f"pre-step {ctx.step}")
            if ctx.step == failing_step:
                fault.fail = 1  # the next flush is the step boundary's

        h.agent.hooks.on_pre_step(pre_step)
        result = await h.run_turn("go")

        error = {"kind": "error", "error": {"message": "injected flush failure", "code": "FLUSH_FAILED"}}
        assert result.reason == error
        assert data(h.session, "turn/end")[-1] == {"turn": 1, "reason": error}
        requests = len(loop.provider.requests)  # type: ignore[attr-defined]
        assert requests == failing_step - 1  # no request after the failed flush
        if failing_step == 1:
            assert types(h.session) == ["agent/inbox/spliced", "turn/start", "agent/inbox/spliced", "turn/end"]
            assert order == ["pre-step 1", "flush:fail", "turn/end"]
        else:
            assert types(h.session)[-4:] == ["tool/call", "tool/result", "step/end", "turn/end"]
            assert order[-4:] == ["step/end", "pre-step 2", "flush:fail", "turn/end"]
        # The claimed prompt is consumed; the agent takes the next turn normally.
        assert h.agent.inbox == {"next-step": (), "next-turn": ()}
        await h.dispose()


# -- item 3: the first canceller wins, in the reference's wording ----------------------------

OWNER_WORDING = 'agent "s1" setup aborted: owner disposed during setup'
TEARDOWN_WORDING = "agent loop is not active"


async def seed(root: Path) -> None:
    async with stack(root, [[Say("ok")]]) as (_store, _p, loop), Owner("seed") as owner:
        h = await loop.create("s1", owner=owner)
        await h.run_turn("first")
        await h.dispose()


async def open_with_both_closing(root: Path, point: str | None, first: str, verb: str) -> AgentSetupAbortedError:
    faults = FaultPoints()
    notified: list[str] = []
    async with stack(root, [[Say("ok")]], faults=faults) as (store, _p, loop), Owner("app") as owner:
        store.on_created(lambda h: notified.append("session/created"))
        store.on_disposed(lambda h: notified.append("session/disposed"))
        loop.created_listeners.append(lambda h: notified.append("agent/created"))
        loop.disposed_listeners.append(lambda h: notified.append("agent/disposed"))

        def close_both() -> None:
            closers = {"owner": lambda: owner.close("owner closed"), "teardown": lambda: loop.teardown.close(TEARDOWN_WORDING)}
            closers[first]()
            closers["teardown" if first == "owner" else "owner"]()

        if point is None:
            close_both()
        else:
            faults.on(point, close_both)
        with pytest.raises(AgentSetupAbortedError) as info:
            if verb == "resume":
                await loop.resume("s1", owner=owner)
            else:
                await loop.create("s1", owner=owner)
        assert await store.list() == [] and loop.list() == []
        # Published steps were unwound in reverse, each notification paired.
        assert notified in ([], ["session/created", "session/disposed"], ["session/created", "agent/created", "agent/disposed", "session/disposed"])
    stats = loop.stats
    assert stats["prepared"] == stats["published"] + stats["disposed"]
    return info.value


@pytest.mark.parametrize("first", ["owner", "teardown"])
async def test_the_canceller_that_fired_first_is_the_abort_reason(tmp_path: Path, first: str) -> None:
    await seed(tmp_path)
    async with stack(tmp_path, [[Say("ok")]], faults=(dry := FaultPoints())) as (_s, _p, loop), Owner("app") as owner:
        h = await loop.resume("s1", owner=owner)
        await h.dispose()
    points: list[str | None] = [None, *dict.fromkeys(dry.visited)]
    assert len(points) >= 9, points
    for point in points:
        exc = await open_with_both_closing(tmp_path, point, first, "resume")
        assert isinstance(exc, LifetimeClosedError)
        if first == "owner":
            assert (str(exc), exc.lifetime, exc.reason) == (OWNER_WORDING, "app", "owner closed"), point
        else:
            assert (str(exc), exc.lifetime, exc.reason) == (TEARDOWN_WORDING, "agent loop", TEARDOWN_WORDING), point


async def test_create_reports_the_first_canceller_too(tmp_path: Path) -> None:
    for first, wording in (("owner", OWNER_WORDING), ("teardown", TEARDOWN_WORDING)):
        for point in (None, "open.prepared", "publish.session-announced"):
            exc = await open_with_both_closing(tmp_path / f"{first}-{point}", point, first, "create")
            assert str(exc) == wording, (first, point)


async def test_run_abandonable_reports_the_lifetime_that_closed_first() -> None:
    a, b = Lifetime("a"), Lifetime("b")
    assert Lifetime.first_closed([a, b]) is None
    async with trio.open_nursery() as nursery:

        async def op() -> int:
            b.close("b first")
            a.close("a second")
            await trio.sleep_forever()
            return 1  # pragma: no cover

        async def dispose(value: int) -> None:
            pass  # pragma: no cover

        with pytest.raises(LifetimeClosedError) as info:
            await run_abandonable(nursery, op, dispose=dispose, lifetimes=[a, b])
        assert (info.value.lifetime, info.value.reason) == ("b", "b first")
        assert Lifetime.first_closed([a, b]) is b and a.closed_order is not None and b.closed_order is not None
        with pytest.raises(LifetimeClosedError) as again:  # already closed: never started
            await run_abandonable(nursery, op, dispose=dispose, lifetimes=[a, b])
        assert again.value.lifetime == "b"


# -- item 4: closing an owner waits for the disposal --------------------------------------


def watch_disposal(store: Store, loop: AgentLoop, order: list[str]) -> None:
    loop.disposed_listeners.append(lambda h: order.append("agent/disposed"))
    store.on_disposed(lambda h: order.append("session/disposed"))


@pytest.mark.parametrize("close", ["close", "aclose"])
async def test_owner_close_waits_when_the_dispose_began_inside_the_turn(tmp_path: Path, close: str) -> None:
    box: list[Any] = []

    @tool("quit", "Dispose my agent, then close its owner")
    async def quit_tool(args: dict[str, Any]) -> Any:
        h, owner = box
        await h.dispose()  # inside the turn: returns at once, the teardown is under way
        if close == "close":
            owner.close("app quits")
        else:
            await owner.aclose("app quits")  # cancelled with the turn: no deadlock
        await trio.sleep_forever()

    async with stack(tmp_path, [[Call("quit")], [Say("never")]], ToolSet([quit_tool])) as (store, _p, loop):
        order: list[str] = []
        watch_disposal(store, loop, order)
        # The owner is opened by the task that runs the turn: its watch task descends
        # from the turn's task, and must still wait for the teardown.
        async with Owner("app") as owner:
            h = await loop.create("a", owner=owner)
            box[:] = [h, owner]
            with trio.fail_after(10):
                result = await h.run_turn("go")
                await owner.aclose("app quits")
            order.append("owner closed")
            assert result.reason == {"kind": "aborted", "reason": {"kind": "disposed"}}
        assert order == ["agent/disposed", "session/disposed", "owner closed"]
        assert h.disposed and await store.get("a") is None


async def test_owner_close_waits_when_an_abandoned_dispose_is_under_way(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from harness.agent import Delay

    async with stack(tmp_path, [[Delay(10), Say("slow")]]) as (store, _p, loop):
        order: list[str] = []
        watch_disposal(store, loop, order)
        async with Owner("app") as owner, trio.open_nursery() as n:
            h = await loop.create("a", owner=owner)
            n.start_soon(h.run_turn, "go")
            await trio.sleep(1)
            with trio.CancelScope() as caller:
                caller.cancel()
                await h.dispose()  # the caller gives up at once; the teardown goes on
            assert not h.disposed
            await owner.aclose("done")
            order.append("owner closed")
        assert order == ["agent/disposed", "session/disposed", "owner closed"]
        assert data(h.session, "turn/end")[-1]["reason"] == {"kind": "aborted", "reason": {"kind": "disposed"}}
