"""The agent loop: vocabulary, end reasons, cancellation, tools — invariants enforced."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio
import trio.testing

from harness.agent import (
    Agent,
    AgentArgumentError,
    AgentBusyError,
    Call,
    ContextWindowExceededError,
    Delay,
    Fail,
    Say,
    ScriptedProvider,
    Think,
    ToolSet,
    Truncated,
    tool,
)
from harness.runtime import SessionHandle, open_store
from harness.session import RelationalInvariants, fold_surface, thaw


def types(s: SessionHandle) -> list[str]:
    return [e.type for e in s.events]


def last(s: SessionHandle, type_: str) -> Any:
    return thaw(next(e for e in reversed(list(s.events)) if e.type == type_).data)


@tool("add", "Add a and b", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}})
async def add(args: dict[str, Any]) -> Any:
    await trio.sleep(0.01)
    return {"sum": args["a"] + args["b"]}


@tool("boom", "Always fails")
async def boom(args: dict[str, Any]) -> Any:
    raise RuntimeError("tool exploded")


hang_started = trio.Event


@tool("hang", "Never returns")
async def hang(args: dict[str, Any]) -> Any:
    await trio.sleep_forever()


async def test_turn_with_tool_calls_completes() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Think("plan"), Say("adding"), Call("add", {"a": 1, "b": 2}), Call("boom")], [Say("done: 3")]])
        agent = Agent(s, provider, ToolSet([add, boom]))
        result = await agent.run_turn("please add")
        assert result.kind == "completed" and result.turn == 1
        t = types(s)
        # The reference's exact opening (persistence §6): the prompt is recorded by the
        # inbox, claimed after turn/start, and reaches the surface after step/start.
        assert t[:7] == [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "request/header",
            "request/context",
        ]
        assert t.count("tool/call") == 2 and t.count("tool/result") == 2 and t[-1] == "turn/end"
        results = [thaw(e.data) for e in s.events if e.type == "tool/result"]
        by_call = {r["message"]["source"]["callId"]: r for r in results}
        assert any(r.get("error", {}).get("name") == "RuntimeError" for r in by_call.values())
        assert any("sum" in r["message"]["content"][0]["content"][0]["text"] for r in by_call.values())
        assert last(s, "request/header")["reason"] == "initial"
        assert tuple(s.surface()) == fold_surface(list(s.events)).nodes
        roles = [m["role"] for m in await s.derive_messages()]
        assert roles == ["user", "assistant", "user", "user", "assistant"]
        messages = await s.derive_messages()
        assert [b["type"] for b in messages[1]["content"]] == ["reasoning", "text", "tool-call", "tool-call"]  # type: ignore[index, union-attr]
        assert provider.requests[1].messages[-1]["role"] == "user"  # the second request saw the results


async def test_max_tokens_and_provider_errors() -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ScriptedProvider([[Say("cut"), Truncated()], [Say("partial"), Fail(ContextWindowExceededError("too long", status=400))]])
        agent = Agent(s, provider)
        assert (await agent.run_turn("1")).reason == {"kind": "max-tokens"}
        r = await agent.run_turn("2")
        assert r.reason == {"kind": "error", "error": {"message": "too long", "code": "CONTEXT_WINDOW_EXCEEDED", "status": 400}}
        assert types(s)[-2:] == ["step/end", "turn/end"]
        assert "assistant/message" not in types(s)[types(s).index("turn/start", 5):]  # nothing committed from the failed stream
        r3 = await agent.run_turn("3")  # the script is exhausted: a typed error ends the turn
        assert r3.reason["error"]["code"] == "SCRIPT_EXHAUSTED"


async def test_cancel_mid_stream_keeps_the_visible_prefix(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        agent = Agent(s, ScriptedProvider([[Say("visible text"), Delay(10), Call("add", {"a": 1, "b": 1}), Say("never")]]), ToolSet([add]))
        async with trio.open_nursery() as n:
            results: list[Any] = []

            async def run() -> None:
                results.append(await agent.run_turn("go"))

            n.start_soon(run)
            await trio.sleep(1)
            agent.cancel("user")
            agent.cancel("parent")  # the first cause wins
        assert results[0].reason == {"kind": "aborted", "reason": {"kind": "user"}}
        msg = last(s, "assistant/message")
        assert msg["interrupted"] is True and [b["type"] for b in msg["message"]["content"]] == ["text"]
        assert msg["message"]["content"][0]["text"] == "visible text"
        interrupted = next(e for e in reversed(list(s.events)) if e.type == "assistant/message")
        chunk_seqs = [e.seq for e in s.events if e.type == "assistant/chunk"]
        assert list(interrupted.source_event_seqs or ()) == chunk_seqs
        assert "tool/call" not in types(s)  # the half-streamed call is dropped
        assert types(s)[-2:] == ["step/end", "turn/end"]


async def test_cancel_during_tools_answers_every_call(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        agent = Agent(s, ScriptedProvider([[Call("hang"), Call("add", {"a": 2, "b": 2})]]), ToolSet([hang, add]))
        async with trio.open_nursery() as n:
            n.start_soon(agent.run_turn, "go")
            await trio.sleep(5)
            agent.cancel("parent")
        results = {r["message"]["source"]["callId"]: r for r in (thaw(e.data) for e in s.events if e.type == "tool/result")}
        assert len(results) == 2
        codes = sorted(r.get("error", {}).get("code", "ok") for r in results.values())
        assert codes == ["TOOL_ABORTED", "ok"]
        assert last(s, "turn/end")["reason"] == {"kind": "aborted", "reason": {"kind": "parent"}}


async def test_caller_cancellation_still_logs_turn_end(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        agent = Agent(s, ScriptedProvider([[Delay(100), Say("late")], [Say("next")]]))
        with trio.move_on_after(1) as scope:
            await agent.run_turn("go")
        assert scope.cancelled_caught
        assert last(s, "turn/end")["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
        assert not agent.busy
        assert (await agent.run_turn("again")).turn == 2  # numbering continues


@pytest.mark.parametrize("bad", [5, None, {"type": "text", "text": "hi"}, [{"type": "text", "text": "hi"}], b"hi"])
async def test_a_prompt_that_is_not_a_str_is_refused_before_anything_is_logged(bad: Any) -> None:
    # It used to be logged as a user/message {"type": "text", "text": <bad>}, which
    # `harness sessions verify` then called ok.
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create("p")
        agent = Agent(s, ScriptedProvider([[Say("ok")]]))
        before = len(s.events)
        for method, call in [
            ("run_turn", lambda: agent.run_turn(bad)),
            ("send", lambda: agent.send(bad)),
            ("send", lambda: agent.send(bad, delivery="inject")),
        ]:
            with pytest.raises(AgentArgumentError, match=rf'agent "p": {method} text must be a str, got .*{re.escape(repr(bad))}') as info:
                await call()
            assert (info.value.code, info.value.session_id) == ("INVALID_AGENT_ARGUMENT", "p")
        with pytest.raises(AgentArgumentError, match=re.escape(repr(bad))):
            agent.inject_nowait(bad)
        await s.barrier()
        assert len(s.events) == before and agent.inbox == {"next-step": (), "next-turn": ()}
        assert (agent.status, agent.busy) == ("idle", False)
        result = await agent.run_turn("a str still works")
        assert (result.kind, result.turn) == ("completed", 1)
        assert last(s, "user/message")["content"] == [{"type": "text", "text": "a str still works"}]


async def test_one_turn_at_a_time_and_tool_concurrency_limit(autojump_clock: trio.testing.MockClock) -> None:
    running = 0
    peak = 0

    @tool("slow", "Slow")
    async def slow(args: dict[str, Any]) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(1)
        running -= 1
        return "ok"

    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        agent = Agent(s, ScriptedProvider([[Call("slow")] * 5, [Say("done")]]), ToolSet([slow]), tool_concurrency=2)
        async with trio.open_nursery() as n:
            n.start_soon(agent.run_turn, "go")
            await trio.sleep(0.1)
            with pytest.raises(AgentBusyError):
                await agent.run_turn("second")
        assert peak == 2 and types(s).count("tool/result") == 5
