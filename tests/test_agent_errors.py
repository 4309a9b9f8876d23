"""Agent turns under runtime failures and lifecycle races (issue #9 §2.2, §2.7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import Owner
from harness.agent import Call, Fail, Say, ScriptedProvider, ToolSet, open_agent_loop, tool
from harness.faults import FailingFiles
from harness.persistence import JsonlBackend, open_persistence
from harness.providers import ProviderError
from harness.runtime import SessionHandle, open_store
from harness.session import RelationalInvariants, thaw


def ends(s: SessionHandle) -> list[Any]:
    return [thaw(e.data)["reason"] for e in s.events if e.type == "turn/end"]


def balanced(s: SessionHandle) -> None:
    types = [e.type for e in s.events]
    assert types.count("turn/start") == types.count("turn/end")
    assert types.count("step/start") == types.count("step/end")


async def test_dispose_from_inside_its_own_turn_does_not_deadlock(tmp_path: Path) -> None:
    box: list[Any] = []

    @tool("quit", "Dispose the agent that runs me")
    async def quit_tool(args: dict[str, Any]) -> Any:
        await box[0].dispose()
        await trio.sleep_forever()  # cancelled by the dispose

    provider = ScriptedProvider([[Call("quit")], [Say("never")]])
    async with open_store(validator_factory=RelationalInvariants) as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        async with open_agent_loop(store, provider=provider, tools=ToolSet([quit_tool]), persistence=p) as loop:
            async with Owner("app") as owner:
                h = await loop.create("a", owner=owner)
                box.append(h)
                with trio.fail_after(10):
                    result = await h.run_turn("go")
                    await h.dispose()  # a later caller waits for the same teardown
                assert result.reason == {"kind": "aborted", "reason": {"kind": "disposed"}}
                assert h.disposed and await store.get("a") is None
                balanced(h.session)
                tool_results = [thaw(e.data) for e in h.session.events if e.type == "tool/result"]
                assert [r["error"]["code"] for r in tool_results] == ["TOOL_ABORTED"]


async def test_dispose_refuses_turns_started_while_it_waits(tmp_path: Path) -> None:
    from harness.agent import AgentDisposedError, Delay

    # The late caller wakes in the same scheduler batch as dispose (both wait for the
    # first turn to end); Trio orders a batch at random, so try several times.
    provider = ScriptedProvider([[Delay(0.01), Say("slow")]] * 20)
    async with open_store(validator_factory=RelationalInvariants) as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        async with open_agent_loop(store, provider=provider, persistence=p) as loop, Owner("app") as owner:
            for i in range(10):
                h = await loop.create(f"a{i}", owner=owner)
                refused: list[BaseException] = []

                async def late_turn(h: Any = h, refused: list[BaseException] = refused) -> None:
                    await h.agent.wait_idle()
                    try:
                        await h.run_turn("sneaking in")
                    except AgentDisposedError as exc:
                        refused.append(exc)

                async with trio.open_nursery() as n:
                    n.start_soon(h.run_turn, "first")
                    await trio.sleep(0.001)
                    n.start_soon(late_turn)
                    await trio.testing.wait_all_tasks_blocked(0.001)
                    await h.dispose()
                assert len(refused) == 1
                assert ends(h.session) == [{"kind": "aborted", "reason": {"kind": "disposed"}}]
                balanced(h.session)


async def test_a_flush_failure_in_a_turn_is_an_error_not_a_user_abort(tmp_path: Path) -> None:
    files = FailingFiles()
    provider = ScriptedProvider([[Say("hello")], [Say("again")]])
    async with open_store(validator_factory=RelationalInvariants) as store, open_persistence(store, JsonlBackend(tmp_path, files=files)) as p:
        async with open_agent_loop(store, provider=provider, persistence=p) as loop, Owner("app") as owner:
            h = await loop.create("a", owner=owner)
            files.fail_fsyncs = 100  # every checkpoint flush fails from now on
            result = await h.run_turn("go")
            assert result.kind == "error"
            assert result.reason["error"]["code"] == "FLUSH_FAILED"
            assert ends(h.session)[-1]["kind"] == "error"
            balanced(h.session)
            files.fail_fsyncs = 0
            assert (await h.run_turn("again")).kind == "completed"  # the session goes on


async def test_a_runtime_failure_under_a_tool_is_one_typed_error(tmp_path: Path) -> None:
    files = FailingFiles()
    provider = ScriptedProvider([[Call("a"), Call("b")], [Say("done")]])

    @tool("a", "first")
    async def a(args: dict[str, Any]) -> Any:
        return "a"

    @tool("b", "second")
    async def b(args: dict[str, Any]) -> Any:
        return "b"

    async with open_store(validator_factory=RelationalInvariants) as store, open_persistence(store, JsonlBackend(tmp_path, files=files)) as p:
        async with open_agent_loop(store, provider=provider, tools=ToolSet([a, b]), persistence=p) as loop, Owner("app") as owner:
            h = await loop.create("a", owner=owner)

            def arm(handle: Any, events: Any) -> None:
                if any(e.type == "tool/call" for e in events):
                    files.fail_fsyncs = 100  # the before-tool flushes fail

            store.add_pre_commit_hook(arm)
            result = await h.run_turn("go")  # returns, no ExceptionGroup
            assert result.kind == "error" and result.reason["error"]["code"] == "FLUSH_FAILED"
            balanced(h.session)
            calls = [thaw(e.data)["callId"] for e in h.session.events if e.type == "tool/call"]
            results = [thaw(e.data)["message"]["content"][0]["toolCallId"] for e in h.session.events if e.type == "tool/result"]
            assert sorted(calls) == sorted(results) and len(results) == len(set(results))
            files.fail_fsyncs = 0


async def test_a_failed_stream_commits_no_pending_chunk() -> None:
    class Boom(ProviderError):
        code = "BOOM"

    provider = ScriptedProvider([[Say("partial answer"), Fail(Boom("stream broke"))]])
    async with open_store(validator_factory=RelationalInvariants) as store:
        from harness.agent import Agent

        s = await store.create()
        result = await Agent(s, provider).run_turn("go")
        assert result.kind == "error" and result.reason["error"]["code"] == "BOOM"
        types = [e.type for e in s.events]
        assert "assistant/chunk" not in types and "assistant/message" not in types
        balanced(s)


async def test_cancelled_turn_never_answers_a_call_twice() -> None:
    # Cancel the caller at every scheduler step of a turn with tool calls: every
    # tool call has exactly one result and the turn is closed.
    provider_script = [[Call("a"), Call("a")], [Say("ok")]]

    @tool("a", "quick")
    async def a(args: dict[str, Any]) -> Any:
        await trio.lowlevel.checkpoint()
        return "a"

    from harness.agent import Agent

    for k in range(1, 400, 3):
        async with open_store(validator_factory=RelationalInvariants) as store:
            s = await store.create()
            agent = Agent(s, ScriptedProvider(provider_script), ToolSet([a]))
            with trio.CancelScope() as scope:
                steps = 0

                class Stepper(trio.abc.Instrument):
                    def __init__(self, k: int) -> None:
                        self.k = k

                    def before_task_step(self, task: Any) -> None:
                        nonlocal steps
                        steps += 1
                        if steps == self.k:
                            scope.cancel()

                inst = Stepper(k)
                trio.lowlevel.add_instrument(inst)
                try:
                    await agent.run_turn("go")
                finally:
                    trio.lowlevel.remove_instrument(inst)
            balanced(s)
            results = [thaw(e.data)["message"]["content"][0]["toolCallId"] for e in s.events if e.type == "tool/result"]
            assert len(results) == len(set(results)), (k, results)


async def test_a_provider_that_never_closes_its_stream_is_bounded(autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    from harness.agent import Agent
    from harness.errors import SessionError
    from harness.providers import ModelRequest, TextDelta

    class Stuck:
        name = "stuck"
        model = "stuck-1"
        context_window = None

        async def stream(self, request: ModelRequest) -> Any:
            try:
                yield TextDelta(0, "hel")
                await trio.sleep_forever()
            finally:
                # A cleanup that never ends on its own (the agent runs it shielded
                # from the turn's cancellation, so only the bound can end it).
                await trio.sleep_forever()

    def veto_chunks(handle: Any, events: Any) -> None:
        if any(e.type == "assistant/chunk" for e in events):
            raise SessionError("no chunks today")

    async with open_store(validator_factory=RelationalInvariants) as store:
        store.add_pre_commit_hook(veto_chunks)
        s = await store.create()
        # One chunk per batch: the vetoed append leaves the stream suspended at its
        # yield, so the agent must close it (aclose runs the hanging cleanup).
        agent = Agent(s, Stuck(), close_grace=0.05, chunk_batch=1)  # type: ignore[arg-type]
        with trio.fail_after(5):
            result = await agent.run_turn("go")
        assert result.kind == "error" and result.reason["error"]["code"] == "SESSION_INVALID"
        balanced(s)
    assert "did not close its stream" in caplog.text


async def test_dispose_waits_for_a_wedged_turn_only_so_long(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    started = trio.Event()

    release = trio.Event()

    @tool("wedge", "Ignores cancellation")
    async def wedge(args: dict[str, Any]) -> Any:
        started.set()
        with trio.CancelScope(shield=True):
            await release.wait()  # only once the dispose has returned
        return "late"

    provider = ScriptedProvider([[Call("wedge")], [Say("never")]])
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        async with open_agent_loop(store, provider=provider, tools=ToolSet([wedge]), persistence=p) as loop, Owner("app") as owner:
            loop.dispose_grace = 0.05
            h = await loop.create("a", owner=owner)
            async with trio.open_nursery() as n:

                async def turn() -> None:
                    with pytest.raises(Exception):  # noqa: B017 - the session is gone under it
                        await h.run_turn("go")

                n.start_soon(turn)
                await started.wait()  # the body runs (a dispose before it would stop it)
                # Returns after the grace, not after the tool: the tool ends only once it
                # has returned (the bound is a hang guard, not the verdict).
                with trio.fail_after(60):
                    await h.dispose()
                release.set()
                assert h.disposed and await store.get("a") is None
    assert "did not end within" in caplog.text


async def test_a_raw_stream_failure_is_a_typed_provider_error() -> None:
    from harness.agent import Agent
    from harness.providers import ModelRequest, TextDelta

    class Flaky:
        name = "flaky"
        model = "f-1"
        context_window = None

        async def stream(self, request: ModelRequest) -> Any:
            yield TextDelta(0, "partial ")
            raise ConnectionResetError("peer reset the connection")

    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        result = await Agent(s, Flaky()).run_turn("go")  # type: ignore[arg-type]
        assert result.kind == "error"
        assert result.reason["error"]["code"] == "PROVIDER_STREAM_FAILED"
        assert "ConnectionResetError" in result.reason["error"]["message"]
        types = [e.type for e in s.events]
        assert "assistant/chunk" not in types and "assistant/message" not in types
        balanced(s)


async def test_a_bug_under_a_turn_closes_it_and_propagates() -> None:
    from harness.agent import Agent

    provider = ScriptedProvider([[Say("hello")]])
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        agent = Agent(s, provider)

        async def broken_header() -> None:
            raise ZeroDivisionError("a bug")

        agent._request_header = broken_header  # type: ignore[method-assign]
        with pytest.raises(ZeroDivisionError):
            await agent.run_turn("go")
        assert ends(s) == [{"kind": "error", "error": {"message": "ZeroDivisionError('a bug')", "code": "INTERNAL_ERROR"}}]
        balanced(s)


async def test_owner_aclose_waits_for_a_dispose_started_inside_the_turn(tmp_path: Path) -> None:
    box: list[Any] = []

    @tool("quit", "Dispose the agent that runs me, then take a while to stop")
    async def quit_tool(args: dict[str, Any]) -> Any:
        await box[0].dispose()
        box[1].set()
        with trio.CancelScope(shield=True):
            await trio.sleep(0.05)  # the turn ends only after this
        return "bye"

    provider = ScriptedProvider([[Call("quit")], [Say("never")]])
    async with open_store(validator_factory=RelationalInvariants) as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        async with open_agent_loop(store, provider=provider, tools=ToolSet([quit_tool]), persistence=p) as loop:
            owner = Owner("app")
            async with owner:
                h = await loop.create("a", owner=owner)
                box.extend([h, trio.Event()])
                async with trio.open_nursery() as n:
                    n.start_soon(h.run_turn, "go")
                    await box[1].wait()  # the tool has started the dispose
                    await owner.aclose("app closing")
                    assert h.disposed and await store.get("a") is None


@pytest.mark.parametrize("where", ["while-flushing", "inside-the-stream"])
async def test_a_stream_whose_close_fails_never_replaces_the_cancellation(autojump_clock: trio.testing.MockClock, where: str) -> None:
    from harness.agent import Agent
    from harness.providers import ModelRequest, TextDelta

    class ClosesBadly:
        name = "p"
        model = "m"
        context_window = None
        agent: Any = None

        async def stream(self, request: ModelRequest) -> Any:
            try:
                yield TextDelta(0, "hel")
                if where == "while-flushing":
                    self.agent.cancel("user")  # lands in the agent's chunk append
                    yield TextDelta(0, "lo")
                await trio.sleep_forever()
            finally:
                raise ConnectionResetError("connection reset while closing the stream")

    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        provider = ClosesBadly()
        agent = Agent(s, provider, chunk_batch=1)  # type: ignore[arg-type]
        provider.agent = agent
        async with trio.open_nursery() as n:
            results: list[Any] = []

            async def turn() -> None:
                results.append(await agent.run_turn("go"))

            n.start_soon(turn)
            if where == "inside-the-stream":
                await trio.sleep(0.01)  # the stream sleeps inside __anext__
                agent.cancel("user")
        assert results[0].reason == {"kind": "aborted", "reason": {"kind": "user"}}
        balanced(s)


async def test_a_cancelled_dispose_caller_stops_waiting_and_the_teardown_completes(tmp_path: Path) -> None:
    # Driven by events, not sleeps (issue 24 §5: on a loaded machine the tool had not
    # started after 50 ms, or had already ended).
    started, release = trio.Event(), trio.Event()

    @tool("slow", "Ignores cancellation for a while")
    async def slow(args: dict[str, Any]) -> Any:
        started.set()
        with trio.CancelScope(shield=True):
            await release.wait()
        return "done"

    provider = ScriptedProvider([[Call("slow")], [Say("ok")]])
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        async with open_agent_loop(store, provider=provider, tools=ToolSet([slow]), persistence=p) as loop, Owner("app") as owner:
            h = await loop.create("a", owner=owner)
            async with trio.open_nursery() as n:
                n.start_soon(h.run_turn, "go")
                await started.wait()  # the tool runs
                with trio.move_on_after(0.02) as scope:
                    await h.dispose()  # waits for the tool, which cannot end yet
                assert scope.cancelled_caught and not h.disposed  # the caller left at once
                release.set()
            with trio.fail_after(60):  # a hang guard, not the verdict
                await h.dispose()  # a later caller waits for the same teardown
            assert h.disposed and await store.get("a") is None


async def test_closing_an_owner_disposes_its_agents(tmp_path: Path) -> None:
    from harness.agent import AgentDisposedError

    provider = ScriptedProvider([[Say("a")], [Say("b")]])
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        async with open_agent_loop(store, provider=provider, persistence=p) as loop, Owner("app") as owner:
            h = await loop.create("a", owner=owner)
            owner.close("user logged out")  # synchronous: cancels the owner's tasks
            with trio.fail_after(5):
                await h._disposed.wait()  # the owner's watch task disposes the agent
            assert await store.get("a") is None
            with pytest.raises(AgentDisposedError):
                await h.run_turn("still works?")


async def test_tool_arguments_beyond_the_limit_end_the_turn_typed() -> None:
    # Issue 24 §2: arguments streamed in many small deltas are reassembled exactly, and
    # a call whose arguments grow past the agent's bound fails the reply typed: no
    # tool/call is logged and no tool runs.
    from harness.agent import Agent
    from harness.providers import Finish, ModelRequest, ToolCallDelta

    ran: list[Any] = []

    @tool("echo", "Echo")
    async def echo(args: dict[str, Any]) -> Any:
        ran.append(args)
        return "ok"

    arguments = '{"text": "' + "x" * 2000 + '"}'

    class Pieces:
        name = "pieces"
        model = "p-1"
        context_window = None

        def __init__(self) -> None:
            self.replies = 0

        async def stream(self, request: ModelRequest) -> Any:
            self.replies += 1
            if self.replies > 1:  # the step after the tool's result: the turn ends
                yield Finish("stop")
                return
            yield ToolCallDelta(0, "c1", arguments[:7], "echo")
            for i in range(7, len(arguments), 7):
                yield ToolCallDelta(0, "c1", arguments[i : i + 7])
            yield Finish("tool-calls")

    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create()
        agent = Agent(s, Pieces(), ToolSet([echo]), max_tool_arguments=len(arguments))  # type: ignore[arg-type]
        await agent.run_turn("go")
        assert ran == [{"text": "x" * 2000}]
        calls = [thaw(e.data) for e in s.events if e.type == "tool/call"]
        assert [c["arguments"] for c in calls] == [arguments]

        s2 = await store.create()
        agent2 = Agent(s2, Pieces(), ToolSet([echo]), max_tool_arguments=len(arguments) - 1)  # type: ignore[arg-type]
        result = await agent2.run_turn("go")
        assert result.kind == "error"
        assert result.reason["error"]["code"] == "TOOL_ARGUMENTS_TOO_LARGE"
        assert "'c1'" in result.reason["error"]["message"]
        assert len(ran) == 1  # the oversized call reached no tool
        types = [e.type for e in s2.events]
        assert "tool/call" not in types and "assistant/message" not in types
        balanced(s2)
