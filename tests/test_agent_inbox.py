"""The agent's hooks (pre-step, request-error, status), its durable inbox (follow-up,
steer, inject; the driver; cancel/park; clear; rebuild) and maintenance — the log, the
surface and the derived messages asserted, invariants enforced."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import pytest
import trio
import trio.testing

from harness.agent import (
    Agent,
    AgentBusyError,
    AgentCancelledError,
    Call,
    ContextWindowExceededError,
    Delay,
    Fail,
    Inbox,
    RateLimitedError,
    RequestErrorContext,
    Retry,
    Say,
    ScriptedProvider,
    Status,
    StepContext,
    ToolSet,
    tool,
)
from harness.errors import HarnessError
from harness.runtime import SessionHandle, open_store
from harness.session import Event, RelationalInvariants, fold_surface, thaw

SPLICED = "agent/inbox/spliced"


# -- helpers ---------------------------------------------------------------------------


def types(s: SessionHandle) -> list[str]:
    return [e.type for e in s.events]


def datas(s: SessionHandle, type_: str) -> list[Any]:
    return [thaw(e.data) for e in s.events if e.type == type_]


def last(s: SessionHandle, type_: str) -> Any:
    return datas(s, type_)[-1]


def text_of(message: Any) -> str:
    """The first text block of a (thawed) message, else its block types."""
    for block in message["content"]:
        if block["type"] == "text":
            return str(block["text"])
    return ",".join(b["type"] for b in message["content"])


def convo(messages: Iterable[Any]) -> list[tuple[str, str]]:
    """(role, text) of each derived message."""
    return [(m["role"], text_of(m)) for m in (thaw(x) for x in messages)]


def surface_types(s: SessionHandle) -> list[str]:
    by_seq = {e.seq: e for e in s.events}
    return [by_seq[n].type for n in s.surface()]


def turn_types(s: SessionHandle, turn: int) -> list[str]:
    """The types from the ``turn/start`` of ``turn`` to its ``turn/end`` (inclusive)."""
    out: list[str] = []
    inside = False
    for e in s.events:
        data: Any = thaw(e.data)
        if e.type == "turn/start" and data["turn"] == turn:
            inside = True
        if inside:
            out.append(e.type)
        if e.type == "turn/end" and data["turn"] == turn:
            break
    return out


def prompts_by_turn(s: SessionHandle) -> list[list[str]]:
    """The user/message texts logged in each turn, in turn order."""
    turns: list[list[str]] = []
    for e in s.events:
        if e.type == "turn/start":
            turns.append([])
        elif e.type == "user/message":
            turns[-1].append(text_of(thaw(e.data)))
    return turns


def check_log(s: SessionHandle) -> None:
    """The whole log replays under the invariants, balanced (no open turn or step), the
    surface folds back, and the splice records fold to the empty inbox."""
    inv = RelationalInvariants()
    state = inv.initial()
    events: list[Event] = list(s.events)
    for e in events:
        state = inv.check(state, e)
    assert state.open_turn is None and state.open_step is None
    assert tuple(s.surface()) == fold_surface(events).nodes


def queued(agent: Agent) -> dict[str, list[str]]:
    """The agent's inbox as texts per target."""
    return {target: [text_of(thaw(m)) for m in q] for target, q in agent.inbox.items()}


def rebuilt(s: SessionHandle) -> dict[str, list[str]]:
    inbox = Inbox.rebuild(s.events)
    return {target: [text_of(m) for m in q] for target, q in inbox.queues.items()}


def phase(agent: Agent) -> str:
    """The agent's phase (read through a call: no narrowing across awaits)."""
    return agent.phase


EMPTY: dict[str, list[str]] = {"next-turn": [], "next-step": []}


class HookRefusedError(HarnessError):
    code = "HOOK_REFUSED"


@tool("add", "Add a and b", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}})
async def add(args: dict[str, Any]) -> Any:
    return {"sum": args["a"] + args["b"]}


@tool("wait", "Takes one second")
async def wait(args: dict[str, Any]) -> Any:
    await trio.sleep(1)
    return "waited"


# -- 1. pre-step hooks -------------------------------------------------------------------


async def test_pre_step_hook_runs_after_turn_start_and_claim_before_step_start() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Call("add", {"a": 1, "b": 2})], [Say("three")], [Say("again")]])
        agent = Agent(s, provider, ToolSet([add]))
        seen: list[dict[str, Any]] = []

        async def hook(ctx: StepContext) -> None:
            seen.append(
                {
                    "at": (ctx.turn, ctx.step),
                    "agent": ctx.agent,
                    "status": ctx.agent.status,
                    "types": types(s),
                    "claimed": [thaw(m) for m in ctx.claimed],
                    "surface": s.surface(),
                    "messages": convo(await s.derive_messages()),
                }
            )

        remove = agent.hooks.on_pre_step(hook)
        result = await agent.run_turn("please add")
        assert result.reason == {"kind": "completed"}
        assert [x["at"] for x in seen] == [(1, 1), (1, 2)]
        first, second = seen
        assert first["agent"] is agent and first["status"] == "running"
        # turn/start and the claim are logged; step/start is not.
        assert first["types"] == [SPLICED, "turn/start", SPLICED]
        prompt = datas(s, "user/message")[0]
        assert first["claimed"] == [prompt] and text_of(prompt) == "please add"
        # The claimed prompt is not on the surface yet.
        assert first["surface"] == () and first["messages"] == []
        # Step 2: step 1 is closed, nothing new claimed, step 2 not started.
        assert second["types"][-1] == "step/end" and second["types"].count("step/start") == 1
        assert second["claimed"] == []
        assert [r for r, _ in second["messages"]] == ["user", "assistant", "user"]
        # Right after the hook: step/start, then the claimed prompt.
        t = types(s)
        assert t[:5] == [SPLICED, "turn/start", SPLICED, "step/start", "user/message"]
        assert convo(await s.derive_messages())[-1] == ("assistant", "three")

        remove()
        remove()  # idempotent
        await agent.run_turn("again")
        assert len(seen) == 2
        check_log(s)


async def test_pre_step_hook_error_fails_the_turn_before_step_start() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("later")]])
        agent = Agent(s, provider)

        async def refuse(ctx: StepContext) -> None:
            raise HookRefusedError("not now")

        remove = agent.hooks.on_pre_step(refuse)
        result = await agent.run_turn("hello")
        assert result.turn == 1
        assert result.reason == {"kind": "error", "error": {"message": "not now", "code": "HOOK_REFUSED"}}
        # No step was opened and no request was made.
        assert types(s) == [SPLICED, "turn/start", SPLICED, "turn/end"]
        assert provider.requests == []
        # The claim stands: the prompt left the inbox, but it never reached the surface
        # (a failed pre-step drops what it claimed; the log keeps it in the splice).
        assert datas(s, SPLICED)[1] == {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []}
        assert s.surface() == () and list(await s.derive_messages()) == []
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        assert not agent.busy and agent.status == "idle"
        check_log(s)

        remove()
        assert (await agent.run_turn("retry")).reason == {"kind": "completed"}
        assert convo(await s.derive_messages()) == [("user", "retry"), ("assistant", "later")]
        check_log(s)


async def test_pre_step_hook_error_on_a_later_step_and_a_hook_bug() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Call("add", {"a": 1, "b": 1})], [Say("unused")]])
        agent = Agent(s, provider, ToolSet([add]))

        async def refuse_step_two(ctx: StepContext) -> None:
            if ctx.step == 2:
                raise HookRefusedError("step two refused")

        remove = agent.hooks.on_pre_step(refuse_step_two)
        result = await agent.run_turn("go")
        assert result.reason["error"]["code"] == "HOOK_REFUSED"
        assert turn_types(s, 1)[-3:] == ["tool/result", "step/end", "turn/end"]
        assert types(s).count("step/start") == 1 and len(provider.requests) == 1
        check_log(s)
        remove()

        # A hook that raises something that is not a HarnessError is a bug: the turn
        # is still closed (INTERNAL_ERROR) and the exception reaches the caller.
        async def buggy(ctx: StepContext) -> None:
            raise RuntimeError("hook bug")

        agent.hooks.on_pre_step(buggy)
        with pytest.raises(RuntimeError, match="hook bug"):
            await agent.run_turn("again")
        end = last(s, "turn/end")
        assert end["turn"] == 2 and end["reason"]["kind"] == "error"
        assert end["reason"]["error"]["code"] == "INTERNAL_ERROR"
        assert turn_types(s, 2) == ["turn/start", SPLICED, "turn/end"]
        assert not agent.busy
        check_log(s)


# -- 2. request-error hooks --------------------------------------------------------------


async def test_request_error_retry_runs_in_the_same_step() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider(
            [
                [Say("partial"), Fail(RateLimitedError("slow down", status=429))],
                [Fail(RateLimitedError("still slow", status=429))],
                [Say("finally")],
            ]
        )
        # chunk_batch=1: the failed attempt's chunk is logged (log-only) before it fails.
        agent = Agent(s, provider, chunk_batch=1)
        contexts: list[RequestErrorContext] = []

        async def retry(ctx: RequestErrorContext) -> Retry | None:
            contexts.append(ctx)
            assert types(s)[-1] != "step/end"  # the step is still open
            return Retry()

        agent.hooks.on_request_error(retry)
        result = await agent.run_turn("hi")
        assert result.reason == {"kind": "completed"}
        assert [(c.turn, c.step, c.attempt, c.error.code) for c in contexts] == [
            (1, 1, 1, "RATE_LIMITED"),
            (1, 1, 2, "RATE_LIMITED"),
        ]
        assert all(c.agent is agent for c in contexts)
        t = types(s)
        assert t.count("step/start") == 1 and t.count("step/end") == 1 and t.count("turn/start") == 1
        assert t.count("request/header") == 1  # the unchanged header is not logged again
        # The failed attempt committed nothing: one assistant message, the last reply.
        assert [text_of(m["message"]) for m in datas(s, "assistant/message")] == ["finally"]
        assert any(c["chunk"].get("text") == "partial" for c in datas(s, "assistant/chunk"))
        # Every request was rebuilt from the same surface.
        assert len(provider.requests) == 3
        first = thaw(provider.requests[0].messages)
        assert all(thaw(r.messages) == first for r in provider.requests[1:])
        assert convo(first) == [("user", "hi")]
        assert convo(await s.derive_messages()) == [("user", "hi"), ("assistant", "finally")]
        assert surface_types(s) == ["user/message", "assistant/message"]
        check_log(s)


async def test_request_error_without_hooks_ends_the_turn_with_the_code() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Fail(RateLimitedError("slow down", status=429))]])
        agent = Agent(s, provider)
        result = await agent.run_turn("hi")
        assert result.reason == {
            "kind": "error",
            "error": {"message": "slow down", "code": "RATE_LIMITED", "status": 429},
        }
        assert types(s)[-3:] == ["request/context", "step/end", "turn/end"]
        assert "assistant/message" not in types(s) and len(provider.requests) == 1
        check_log(s)


async def test_request_error_hook_that_raises_counts_as_no_retry(caplog: pytest.LogCaptureFixture) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Fail(ContextWindowExceededError("too long", status=400))], [Say("unused")]])
        agent = Agent(s, provider)
        later: list[int] = []

        async def broken(ctx: RequestErrorContext) -> Retry | None:
            raise RuntimeError("hook exploded")

        async def would_retry(ctx: RequestErrorContext) -> Retry | None:
            later.append(ctx.attempt)
            return Retry()

        agent.hooks.on_request_error(broken)
        agent.hooks.on_request_error(would_retry)
        with caplog.at_level(logging.WARNING, logger="harness.agent"):
            result = await agent.run_turn("hi")
        assert result.reason["kind"] == "error"
        assert result.reason["error"]["code"] == "CONTEXT_WINDOW_EXCEEDED"
        assert len(provider.requests) == 1 and later == []  # the waterfall stopped there
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "harness.agent"]
        assert len(warnings) == 1 and "request-error hook failed" in warnings[0].getMessage()
        assert warnings[0].exc_info is not None and "hook exploded" in str(warnings[0].exc_info[1])
        assert types(s)[-2:] == ["step/end", "turn/end"] and "assistant/message" not in types(s)
        check_log(s)


async def test_request_error_waterfall_first_decision_wins() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider(
            [[Fail(RateLimitedError("busy"))], [Say("ok")], [Fail(RateLimitedError("busy again"))]]
        )
        agent = Agent(s, provider)
        calls: list[str] = []

        async def undecided(ctx: RequestErrorContext) -> Retry | None:
            calls.append("undecided")
            return None

        async def retry(ctx: RequestErrorContext) -> Retry | None:
            calls.append("retry")
            return Retry()

        async def never(ctx: RequestErrorContext) -> Retry | None:
            calls.append("never")
            return None

        agent.hooks.on_request_error(undecided)
        remove_retry = agent.hooks.on_request_error(retry)
        agent.hooks.on_request_error(never)
        assert (await agent.run_turn("one")).reason == {"kind": "completed"}
        assert calls == ["undecided", "retry"]
        assert types(s).count("step/start") == 1
        assert [text_of(m["message"]) for m in datas(s, "assistant/message")] == ["ok"]

        # Without the retrying hook nobody decides: the error ends the turn.
        remove_retry()
        calls.clear()
        r2 = await agent.run_turn("two")
        assert r2.reason["error"]["code"] == "RATE_LIMITED"
        assert calls == ["undecided", "never"]
        check_log(s)


async def test_cancel_during_request_error_recovery_commits_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("visible but failed"), Fail(RateLimitedError("busy"))], [Say("never")]])
        agent = Agent(s, provider, chunk_batch=1)

        async def slow_retry(ctx: RequestErrorContext) -> Retry | None:
            await trio.sleep(10)
            return Retry()

        agent.hooks.on_request_error(slow_retry)
        results: list[Any] = []
        async with trio.open_nursery() as n:

            async def run() -> None:
                results.append(await agent.run_turn("hi"))

            n.start_soon(run)
            await trio.sleep(1)
            agent.cancel("parent")
        assert results[0].reason == {"kind": "aborted", "reason": {"kind": "parent"}}
        assert len(provider.requests) == 1  # no retry after the cancel
        # The failed stream's text stays log-only: no interrupted message from it.
        assert "assistant/message" not in types(s)
        assert types(s)[-2:] == ["step/end", "turn/end"]
        assert convo(await s.derive_messages()) == [("user", "hi")]
        check_log(s)


# -- 3. status ---------------------------------------------------------------------------


async def test_status_listener_sees_running_then_idle(caplog: pytest.LogCaptureFixture) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        agent = Agent(s, ScriptedProvider([[Say("a")], [Say("b")], [Say("c")]]))
        seen: list[tuple[Status, str, bool]] = []

        def listener(a: Agent, status: Status) -> None:
            assert a is agent
            seen.append((status, a.status, a.busy))

        def broken(a: Agent, status: Status) -> None:
            raise RuntimeError("listener bug")

        remove = agent.hooks.on_status(listener)
        await agent.run_turn("one")
        # "running" once the turn owns the agent; "idle" once its turn/end is logged.
        assert seen == [("running", "running", True), ("idle", "idle", False)]
        assert types(s)[-1] == "turn/end"

        # A failing listener is logged and does not disturb the turn or the others.
        agent.hooks.on_status(broken)
        with caplog.at_level(logging.ERROR, logger="harness.agent"):
            assert (await agent.run_turn("two")).reason == {"kind": "completed"}
        assert [x[0] for x in seen[2:]] == ["running", "idle"]
        assert sum("status listener failed" in r.getMessage() for r in caplog.records) == 2

        remove()
        await agent.run_turn("three")
        assert len(seen) == 4
        check_log(s)


# -- 4. follow-ups and the driver --------------------------------------------------------


async def test_follow_ups_run_as_their_own_turns_in_fifo_order() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("r1")], [Say("r2")], [Say("r3")]])
        statuses: list[Status] = []
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)
            agent.hooks.on_status(lambda a, st: statuses.append(st))
            ids = [await agent.send(text) for text in ("one", "two", "three")]
            await agent.wait_idle()
            assert not agent.busy and phase(agent) == "idle"
        assert prompts_by_turn(s) == [["one"], ["two"], ["three"]]
        assert [m["id"] for m in datas(s, "user/message")] == ids
        assert [d["turn"] for d in datas(s, "turn/end")] == [1, 2, 3]
        assert all(d["reason"] == {"kind": "completed"} for d in datas(s, "turn/end"))
        assert provider.remaining == 0
        # Each turn opens with its claim, then the step, then the claimed prompt.
        for turn in (1, 2, 3):
            assert turn_types(s, turn)[:4] == ["turn/start", SPLICED, "step/start", "user/message"]
        # Each request saw the previous turns and its own prompt last.
        assert [text_of(thaw(r.messages)[-1]) for r in provider.requests] == ["one", "two", "three"]
        assert convo(await s.derive_messages()) == [
            ("user", "one"), ("assistant", "r1"),
            ("user", "two"), ("assistant", "r2"),
            ("user", "three"), ("assistant", "r3"),
        ]  # fmt: skip
        # Splices balance: three inserts into next-turn, three claims out of it.
        splices = datas(s, SPLICED)
        assert [m["id"] for d in splices for m in d["inserted"]] == ids
        assert sum(d.get("removedCount", 0) for d in splices) == 3
        assert all(d["target"] == "next-turn" for d in splices)
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        assert statuses == ["running", "idle"] * 3
        check_log(s)


async def test_follow_up_sent_during_a_direct_turn_runs_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Delay(1), Say("direct done")], [Say("follow-up done")]])
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)
            results: list[Any] = []

            async def run() -> None:
                results.append(await agent.run_turn("direct"))

            n.start_soon(run)
            await trio.sleep(0.5)
            assert agent.status == "running"
            await agent.send("later")
            assert queued(agent) == {"next-turn": ["later"], "next-step": []}
            await agent.wait_idle()
        assert results[0].reason == {"kind": "completed"}
        assert prompts_by_turn(s) == [["direct"], ["later"]]
        # The follow-up's splice landed inside turn 1; it was claimed by turn 2.
        assert SPLICED in turn_types(s, 1)[1:]
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        check_log(s)


async def test_follow_up_then_an_immediate_direct_turn() -> None:
    """A waking send schedules the driver; a direct turn started before the driver task
    runs takes the agent first, and the follow-up runs right after it."""
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("a")], [Say("b")]])
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)
            await agent.send("queued")
            result = await agent.run_turn("direct")
            await agent.wait_idle()
        assert result.reason == {"kind": "completed"}
        assert prompts_by_turn(s) == [["direct"], ["queued"]]
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        check_log(s)


async def test_follow_up_then_an_immediate_direct_turn_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("a")], [Say("b")]])
        with caplog.at_level(logging.WARNING, logger="harness.agent"):
            async with trio.open_nursery() as n:
                agent = Agent(s, provider, nursery=n)
                await agent.send("queued")
                await agent.run_turn("direct")
                await agent.wait_idle()
        assert prompts_by_turn(s) == [["direct"], ["queued"]]
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# -- 5. steer ----------------------------------------------------------------------------


async def test_steer_during_a_tool_is_delivered_at_the_next_step(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Call("wait")], [Say("ack")]])
        claims: list[tuple[int, list[str]]] = []
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, ToolSet([wait]), nursery=n)

            async def hook(ctx: StepContext) -> None:
                claims.append((ctx.step, [text_of(thaw(m)) for m in ctx.claimed]))

            agent.hooks.on_pre_step(hook)
            results: list[Any] = []

            async def run() -> None:
                results.append(await agent.run_turn("go"))

            n.start_soon(run)
            await trio.sleep(0.5)  # the tool is running
            steer_id = await agent.send("use base 10", delivery="steer")
            assert queued(agent) == {"next-turn": [], "next-step": ["use base 10"]}
            await agent.wait_idle()
        assert results[0].reason == {"kind": "completed"}
        assert claims == [(1, ["go"]), (2, ["use base 10"])]
        assert types(s).count("turn/start") == 1  # same turn
        t = turn_types(s, 1)
        # The steer's splice landed while the tool ran (step 1 still open).
        assert t.index(SPLICED, 2) < t.index("tool/result")
        i = t.index("step/end")
        assert t[i : i + 4] == ["step/end", SPLICED, "step/start", "user/message"]
        steer_msg = datas(s, "user/message")[1]
        assert steer_msg["id"] == steer_id and text_of(steer_msg) == "use base 10"
        claim = datas(s, SPLICED)[-1]
        assert claim["target"] == "next-step" and claim["removedCount"] == 1 and claim["inserted"] == []
        # The second request saw the tool result, then the steer.
        assert convo(provider.requests[1].messages)[-2:] == [("user", "tool-result"), ("user", "use base 10")]
        assert convo(await s.derive_messages()) == [
            ("user", "go"),
            ("assistant", "tool-call"),
            ("user", "tool-result"),
            ("user", "use base 10"),
            ("assistant", "ack"),
        ]
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        check_log(s)


async def test_steer_during_the_final_step_runs_one_more_step(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Delay(1), Say("first answer")], [Say("steered answer")]])
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)
            results: list[Any] = []

            async def run() -> None:
                results.append(await agent.run_turn("question"))

            n.start_soon(run)
            await trio.sleep(0.5)  # the only step is streaming
            await agent.send("shorter please", delivery="steer")
            await agent.wait_idle()
        assert results[0].reason == {"kind": "completed"}
        assert types(s).count("turn/start") == 1 and types(s).count("step/start") == 2
        steps = [d["step"] for d in datas(s, "assistant/message")]
        assert steps == [1, 2]
        t = turn_types(s, 1)
        i = t.index("step/end")
        assert t[i : i + 4] == ["step/end", SPLICED, "step/start", "user/message"]
        assert convo(await s.derive_messages()) == [
            ("user", "question"),
            ("assistant", "first answer"),
            ("user", "shorter please"),
            ("assistant", "steered answer"),
        ]
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        check_log(s)


async def test_steer_wakes_an_idle_agent() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        async with trio.open_nursery() as n:
            agent = Agent(s, ScriptedProvider([[Say("steered")]]), nursery=n)
            await agent.send("steer while idle", delivery="steer")
            await agent.wait_idle()
        assert types(s)[:5] == [SPLICED, "turn/start", SPLICED, "step/start", "user/message"]
        claim = datas(s, SPLICED)[1]
        assert claim["target"] == "next-step" and claim["removedCount"] == 1
        assert convo(await s.derive_messages()) == [("user", "steer while idle"), ("assistant", "steered")]
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        check_log(s)


# -- 6. inject ---------------------------------------------------------------------------


async def test_inject_while_idle_does_not_wake_and_joins_the_next_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("both seen")]])
        claimed: list[list[str]] = []
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)

            async def hook(ctx: StepContext) -> None:
                claimed.append([text_of(thaw(m)) for m in ctx.claimed])

            agent.hooks.on_pre_step(hook)
            inject_id = await agent.send("context note", delivery="inject")
            await trio.sleep(5)
            await agent.wait_idle()
            # Only the splice: no turn, no surface message.
            assert types(s) == [SPLICED]
            assert datas(s, SPLICED)[0]["target"] == "next-step"
            assert s.surface() == () and not agent.busy and provider.requests == []
            assert queued(agent) == {"next-turn": [], "next-step": ["context note"]}
            assert rebuilt(s) == queued(agent)

            result = await agent.run_turn("the prompt")
            await agent.wait_idle()
        assert result.reason == {"kind": "completed"}
        assert claimed == [["the prompt", "context note"]]
        # One claim batch: the prompt's splice pair around turn/start, then next-step.
        assert types(s)[:8] == [
            SPLICED, SPLICED, "turn/start", SPLICED, SPLICED, "step/start", "user/message", "user/message",
        ]  # fmt: skip
        assert datas(s, "user/message")[1]["id"] == inject_id
        assert convo(provider.requests[0].messages) == [("user", "the prompt"), ("user", "context note")]
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        check_log(s)


async def test_inject_during_the_final_step_waits_for_the_next_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Delay(1), Say("one")], [Say("two")]])
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)
            n.start_soon(agent.run_turn, "first")
            await trio.sleep(0.5)
            await agent.send("side note", delivery="inject")
            await agent.wait_idle()
            # No extra step and no new turn for an inject.
            assert types(s).count("step/start") == 1 and types(s).count("turn/start") == 1
            assert queued(agent) == {"next-turn": [], "next-step": ["side note"]}
            await agent.run_turn("second")
        assert prompts_by_turn(s) == [["first"], ["second", "side note"]]
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        check_log(s)


# -- 7. cancel parks, clear_inbox drops ------------------------------------------------


async def test_cancel_parks_queued_work_until_the_next_waking_send(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Delay(10), Say("never")], [Say("r2")], [Say("r3")]])
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)
            await agent.send("one")
            await agent.send("two")
            await trio.sleep(1)  # the driver runs "one"
            assert agent.status == "running"
            agent.cancel()
            await agent.wait_idle()
            await trio.sleep(5)
            assert types(s).count("turn/start") == 1  # "two" is parked, not started
            assert last(s, "turn/end")["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
            assert queued(agent) == {"next-turn": ["two"], "next-step": []}
            assert rebuilt(s) == queued(agent)

            await agent.send("three")  # a waking send resumes the parked work
            await agent.wait_idle()
        assert prompts_by_turn(s) == [["one"], ["two"], ["three"]]
        assert [d["reason"]["kind"] for d in datas(s, "turn/end")] == ["aborted", "completed", "completed"]
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        check_log(s)


async def test_clear_inbox_drops_everything_with_canceled_records() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        agent = Agent(s, ScriptedProvider([[Say("fresh")]]))  # no nursery: nothing runs
        await agent.send("f1")
        await agent.send("f2")
        await agent.send("steer", delivery="steer")
        await agent.send("note", delivery="inject")
        assert queued(agent) == {"next-turn": ["f1", "f2"], "next-step": ["steer", "note"]}
        assert types(s) == [SPLICED] * 4
        assert [d["start"] for d in datas(s, SPLICED)] == [0, 1, 0, 1]

        assert await agent.clear_inbox() == 4
        assert datas(s, SPLICED)[4:] == [  # next-step first, as the reference clears them
            {"target": "next-step", "start": 0, "removedCount": 2, "inserted": [], "outcome": "canceled"},
            {"target": "next-turn", "start": 0, "removedCount": 2, "inserted": [], "outcome": "canceled"},
        ]
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        assert await agent.run_queued() == []  # nothing wakes any more

        n_events = len(s.events)
        assert await agent.clear_inbox() == 0 and len(s.events) == n_events  # empty: no record

        # A cleared message never reaches a later turn.
        await agent.run_turn("fresh prompt")
        assert prompts_by_turn(s) == [["fresh prompt"]]
        check_log(s)


# -- 8. rebuild (resume-like) ------------------------------------------------------------


async def test_a_new_agent_on_the_session_rebuilds_the_inbox_and_runs_it() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("r0")], [Say("r1")], [Say("r2")]])
        first = Agent(s, provider)  # no nursery: sends stay queued
        await first.run_turn("zero")
        await first.send("one")
        await first.send("two")
        await first.send("note", delivery="inject")
        assert queued(first) == {"next-turn": ["one", "two"], "next-step": ["note"]}
        assert types(s).count("turn/start") == 1  # nothing ran them

        second = Agent(s, provider)
        assert second.inbox == first.inbox
        assert queued(second) == {"next-turn": ["one", "two"], "next-step": ["note"]}
        results = await second.run_queued()
        assert [(r.turn, r.kind) for r in results] == [(2, "completed"), (3, "completed")]
        # The inject joins the first queued turn's first step, after its prompt.
        assert prompts_by_turn(s) == [["zero"], ["one", "note"], ["two"]]
        assert queued(second) == EMPTY and rebuilt(s) == EMPTY
        assert [d["reason"] for d in datas(s, "request/header")] == ["initial", "resume"]
        check_log(s)


# -- 9. maintenance ----------------------------------------------------------------------


async def test_run_maintenance_refuses_while_busy(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Delay(5), Say("done")], [Say("queued done")]])
        ran: list[str] = []

        async def task() -> str:
            ran.append("task")
            await trio.sleep(1)
            return "maintained"

        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)
            n.start_soon(agent.run_turn, "busy")
            await trio.sleep(1)
            before = len(s.events)
            with pytest.raises(AgentBusyError):
                await agent.run_maintenance(task)
            assert ran == [] and len(s.events) == before and phase(agent) == "turn"
            await agent.wait_idle()

            # A waking send schedules the driver: maintenance is refused at once too.
            await agent.send("queued")
            with pytest.raises(AgentBusyError):
                await agent.run_maintenance(task)
            assert ran == []
            await agent.wait_idle()

            # Maintenance inside maintenance is refused; a turn too.
            async def nested() -> str:
                with pytest.raises(AgentBusyError):
                    await agent.run_maintenance(task)
                with pytest.raises(AgentBusyError):
                    await agent.run_turn("not now")
                assert phase(agent) == "maintenance" and agent.status == "idle" and agent.busy
                return "outer"

            assert await agent.run_maintenance(nested) == "outer"
            assert ran == [] and phase(agent) == "idle" and not agent.busy
        assert prompts_by_turn(s) == [["busy"], ["queued"]]
        check_log(s)


async def test_sends_during_maintenance_run_after_it(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("after")]])
        marks: dict[str, int] = {}
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)

            async def task() -> str:
                await agent.send("follow", delivery="follow-up")
                await agent.send("note", delivery="inject")
                await trio.sleep(2)
                # Still maintaining: the send waits (its splice is all there is).
                assert "turn/start" not in types(s) and agent.status == "idle"
                assert phase(agent) == "maintenance"
                marks["task-end"] = len(s.events)
                return "compacted"

            assert await agent.run_maintenance(task) == "compacted"
            await agent.wait_idle()
        t = types(s)
        assert t[: marks["task-end"]] == [SPLICED, SPLICED]
        assert t.index("turn/start") >= marks["task-end"]
        assert prompts_by_turn(s) == [["follow", "note"]]
        assert queued(agent) == EMPTY and rebuilt(s) == EMPTY
        check_log(s)


async def test_cancel_during_maintenance_raises_with_the_cause(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("r1")], [Say("r2")]])
        saw_cancel: list[bool] = []
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)

            async def task() -> None:
                await agent.send("during")
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    saw_cancel.append(True)
                    raise

            async def canceller() -> None:
                await trio.sleep(1)
                agent.cancel("parent")
                agent.cancel("user")  # the first cause wins

            n.start_soon(canceller)
            with pytest.raises(AgentCancelledError) as info:
                await agent.run_maintenance(task)
            assert info.value.cause == {"kind": "parent"} and info.value.code == "AGENT_CANCELLED"
            assert saw_cancel == [True] and phase(agent) == "idle" and not agent.busy
            # The cancel parked the send made during maintenance.
            await agent.wait_idle()
            await trio.sleep(5)
            assert "turn/start" not in types(s)
            assert queued(agent) == {"next-turn": ["during"], "next-step": []}

            await agent.send("resume")
            await agent.wait_idle()
        assert prompts_by_turn(s) == [["during"], ["resume"]]
        check_log(s)


# -- 10. cancellation during pre-step ------------------------------------------------------


async def test_cancel_during_pre_step_leaves_a_balanced_log(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("r1")], [Say("r2")]])
        statuses: list[Status] = []
        async with trio.open_nursery() as n:
            agent = Agent(s, provider, nursery=n)
            agent.hooks.on_status(lambda a, st: statuses.append(st))

            async def sleepy(ctx: StepContext) -> None:
                await trio.sleep(100)

            remove = agent.hooks.on_pre_step(sleepy)
            results: list[Any] = []

            async def run() -> None:
                results.append(await agent.run_turn("hello"))

            n.start_soon(run)
            await agent.send("queued")
            await trio.sleep(1)
            agent.cancel()
            await agent.wait_idle()  # settles after a pre-step cancellation
        assert results[0].reason == {"kind": "aborted", "reason": {"kind": "user"}}
        assert types(s) == [SPLICED, SPLICED, "turn/start", SPLICED, "turn/end"]
        assert provider.requests == [] and s.surface() == ()
        assert statuses == ["running", "idle"]
        # The queued follow-up is parked, not lost.
        assert queued(agent) == {"next-turn": ["queued"], "next-step": []}
        assert rebuilt(s) == queued(agent)
        check_log(s)

        remove()
        results2 = await agent.run_queued()
        assert [(r.turn, r.kind) for r in results2] == [(2, "completed")]
        assert prompts_by_turn(s) == [[], ["queued"]]
        check_log(s)


async def test_cancel_from_a_running_status_listener_stops_the_turn() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("should not run")]])
        agent = Agent(s, provider)

        def cancel_on_running(a: Agent, status: Status) -> None:
            if status == "running":
                assert a.busy and a.status == "running"
                a.cancel("user")

        agent.hooks.on_status(cancel_on_running)
        await agent.run_turn("hi")
        assert provider.requests == [] and "step/start" not in types(s)
        check_log(s)


async def test_caller_cancelled_during_pre_step_still_logs_turn_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        agent = Agent(s, ScriptedProvider([[Say("ok")]]))

        async def sleepy(ctx: StepContext) -> None:
            await trio.sleep(100)

        remove = agent.hooks.on_pre_step(sleepy)
        with trio.move_on_after(1) as scope:
            await agent.run_turn("go")
        assert scope.cancelled_caught
        assert types(s) == [SPLICED, "turn/start", SPLICED, "turn/end"]
        assert last(s, "turn/end")["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
        assert not agent.busy
        check_log(s)
        remove()
        assert (await agent.run_turn("again")).turn == 2
        check_log(s)


async def test_cancel_right_after_a_waking_send_parks_it() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store, trio.open_nursery() as nursery:
        s = await store.create()
        agent = Agent(s, ScriptedProvider([[Say("one")], [Say("two")]]), nursery=nursery)
        await agent.send("follow-up")
        agent.cancel()  # the driver is scheduled, its turn not started yet
        await agent.wait_idle()
        assert types(s).count("turn/start") == 0
        assert [m["content"][0]["text"] for m in agent.inbox["next-turn"]] == ["follow-up"]  # type: ignore[index]
        nursery.cancel_scope.cancel()


async def test_clearing_under_a_scheduled_driver_starts_no_empty_turn() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store, trio.open_nursery() as nursery:
        s = await store.create()
        provider = ScriptedProvider([[Say("one")], [Say("two")]])
        agent = Agent(s, provider, nursery=nursery)
        await agent.send("hello")
        assert await agent.clear_inbox() == 1
        await agent.wait_idle()
        assert "turn/start" not in types(s) and provider.requests == []
        assert await agent.run_turn("next") is not None and agent.session.last_turn() == 1
        nursery.cancel_scope.cancel()
