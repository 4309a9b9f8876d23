"""Issue 25 §3: a runtime on its own Trio thread, called from blocking code and asyncio.

Every hand-off is driven by events (threading/asyncio/trio), never by sleeps; the
``asyncio.wait_for`` bounds only turn a hang into a failure."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio

import harness
from harness.agent import AgentHandle, Say, ScriptedProvider, TurnResult
from harness.agent._scripted import Delay
from harness.bridge import RuntimeThread
from harness.errors import RuntimeThreadClosedError, RuntimeThreadError
from harness.providers import ModelRequest, StreamChunk

HANG = 60.0  # seconds: a hang guard, never a verdict


def says(n: int) -> ScriptedProvider:
    return ScriptedProvider([[Say(f"reply {i}")] for i in range(n)])


class SignallingProvider(ScriptedProvider):
    """Calls ``on_stream`` once a request holds its scripted reply (it is consumed)."""

    on_stream: Callable[[], None] = staticmethod(lambda: None)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        chunks = super().stream(request)
        first = await chunks.__anext__()  # the reply is popped by now
        self.on_stream()
        yield first
        async for chunk in chunks:
            yield chunk


def run_asyncio(coro_fn: object) -> None:
    asyncio.run(asyncio.wait_for(coro_fn(), HANG))  # type: ignore[operator]


def test_blocking_calls_open_an_agent_run_a_turn_and_resume_it(tmp_path: Path) -> None:
    with harness.open_runtime_in_thread(tmp_path, provider=says(2)) as portal:
        assert portal.state == "running"
        agent = portal.run(portal.runtime.open, "a")
        result = portal.run(agent.run_turn, "hi")
        assert (result.kind, result.turn) == ("completed", 1)
        assert portal.run_sync(lambda: portal.runtime.session_ids()) == ("a",)
    assert portal.state == "closed"
    with harness.open_runtime_in_thread(tmp_path, provider=says(1)) as portal:
        again = portal.run(portal.runtime.open, "a")
        assert portal.run(again.run_turn, "again").turn == 2


def test_asyncio_calls_do_not_block_the_event_loop(tmp_path: Path) -> None:
    async def main() -> None:
        async with harness.open_runtime_in_thread(tmp_path, provider=says(1)) as portal:
            gate = trio.Event()

            async def wait_for_gate() -> str:
                await gate.wait()
                return "opened"

            waiting = asyncio.create_task(portal.arun(wait_for_gate))
            # The loop is free while the Trio call waits: this second call opens the gate.
            await portal.arun_sync(gate.set)
            assert await waiting == "opened"
            agent = await portal.arun(portal.runtime.open, "b")
            result: TurnResult = await portal.arun(agent.run_turn, "hello")
            assert result.kind == "completed"

    run_asyncio(main)


def test_an_error_of_the_call_is_raised_as_it_was() -> None:
    async def boom() -> None:
        raise KeyError("x")

    with harness.open_runtime_in_thread(provider=says(1)) as portal:
        with pytest.raises(KeyError):
            portal.run(boom)
        assert portal.run_sync(lambda: 42) == 42  # the runtime survived the error


def test_cancelling_the_asyncio_task_cancels_the_trio_call_and_waits_for_it() -> None:
    events: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.create_future()
        async with harness.open_runtime_in_thread(provider=says(1)) as portal:

            async def forever() -> None:
                loop.call_soon_threadsafe(started.set_result, None)
                try:
                    await trio.sleep_forever()
                finally:
                    events.append("trio call unwound")

            task = asyncio.create_task(portal.arun(forever))
            await started
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            events.append("asyncio saw CancelledError")
            assert await portal.arun_sync(lambda: 1) == 1  # the portal still serves

    run_asyncio(main)
    assert events == ["trio call unwound", "asyncio saw CancelledError"]


def test_a_cancelled_turn_is_logged_aborted(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        running = loop.create_future()
        provider = SignallingProvider([[Say("partial"), Delay(3600.0), Say("never")], [Say("after")]])
        provider.on_stream = lambda: loop.call_soon_threadsafe(running.set_result, None)
        async with harness.open_runtime_in_thread(tmp_path, provider=provider) as portal:
            agent: AgentHandle = await portal.arun(portal.runtime.open, "t")
            turn = asyncio.create_task(portal.arun(agent.run_turn, "wait"))
            await running
            turn.cancel()
            with pytest.raises(asyncio.CancelledError):
                await turn
            ends = await portal.arun_sync(lambda: [e.data["reason"]["kind"] for e in agent.snapshot().events if e.type == "turn/end"])
            assert ends == ["aborted"]
            assert (await portal.arun(agent.run_turn, "next")).kind == "completed"

    run_asyncio(main)


def test_an_agent_called_on_the_asyncio_side_is_refused_and_left_as_it_was(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An AgentHandle (or its Agent) used directly on the asyncio side, not through the
    portal: every entry point raises RuntimeThreadError before it changes anything (a
    run_turn used to leave the agent "running" for good: the portal's turn refused
    AGENT_BUSY, the close waiting out shutdown_grace)."""
    async def main() -> None:
        async with harness.open_runtime_in_thread(tmp_path, provider=says(1)) as portal:
            agent: AgentHandle = await portal.arun(portal.runtime.open, "q")
            direct: list[Callable[[], object]] = [
                lambda: agent.run_turn("direct"),
                agent.dispose,
                lambda: agent.agent.send("direct"),
                agent.agent.run_queued,
                lambda: agent.agent.run_maintenance(trio.lowlevel.checkpoint),
                agent.agent.clear_inbox,
                agent.agent.wait_idle,
            ]
            for call in direct:
                with pytest.raises(RuntimeThreadError, match=r'agent "q": .* call it through the portal') as caught:
                    await call()  # type: ignore[misc]
                assert (caught.value.code, caught.value.session_id) == ("RUNTIME_THREAD", "q")
            for sync in (lambda: agent.agent.inject_nowait("direct"), agent.agent.cancel):
                with pytest.raises(RuntimeThreadError, match="arun_sync"):
                    sync()
            state = (agent.status, agent.agent.phase, agent.agent.busy, agent.agent.disposed, agent.disposed)
            assert state == ("idle", "idle", False, False, False)
            result = await portal.arun(agent.run_turn, "through the portal")
            assert (result.kind, result.turn) == ("completed", 1)
            texts = await portal.arun_sync(
                lambda: [e.data["content"][0]["text"] for e in agent.snapshot().events if e.type == "user/message"]
            )
            assert texts == ["through the portal"]  # nothing of the direct calls was logged
        assert portal.state == "closed" and agent.disposed

    with caplog.at_level("WARNING"):
        run_asyncio(main)
    assert not [r for r in caplog.records if "did not finish" in r.getMessage()]  # no grace waited out


def test_shutdown_while_a_call_is_in_flight_cancels_it_and_closes_cleanly(tmp_path: Path) -> None:
    unwound = threading.Event()
    started = threading.Event()
    outcome: list[BaseException] = []

    async def forever() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            unwound.set()

    portal = harness.open_runtime_in_thread(tmp_path, provider=says(1))
    portal.start()
    agent = portal.run(portal.runtime.open, "s")

    def caller() -> None:
        try:
            portal.run(forever)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    started.wait()
    portal.close()
    thread.join()
    assert unwound.is_set() and portal.state == "closed"
    assert [type(e) for e in outcome] == [RuntimeThreadClosedError]
    assert outcome[0].code == "RUNTIME_THREAD_CLOSED"  # type: ignore[attr-defined]
    assert agent.disposed  # the runtime's orderly teardown ran
    with pytest.raises(RuntimeThreadClosedError):
        portal.run_sync(lambda: None)


def test_refusals_before_start_from_the_trio_thread_and_twice_started() -> None:
    portal = RuntimeThread(provider=says(1))
    with pytest.raises(RuntimeThreadError, match="has not started"):
        portal.run_sync(lambda: None)
    with pytest.raises(RuntimeThreadError):
        _ = portal.runtime
    with portal:
        with pytest.raises(RuntimeThreadError, match="wait for itself"):
            portal.run_sync(lambda: portal.run_sync(lambda: None))
        with pytest.raises(RuntimeThreadError, match="starts once"):
            portal.start()
        with pytest.raises(RuntimeThreadError, match="close from its own Trio thread"):
            portal.run_sync(portal.close)
        assert portal.state == "running"
    portal.close()  # idempotent
    never = RuntimeThread()
    never.close()
    assert never.state == "closed"


def test_an_entry_error_of_open_runtime_is_raised_by_the_start() -> None:
    with pytest.raises(harness.RuntimeConfigError, match="backend must be"):
        with harness.open_runtime_in_thread("x", backend="bogus"):  # type: ignore[arg-type]
            pass

    async def main() -> None:
        with pytest.raises(harness.RuntimeConfigError):
            async with harness.open_runtime_in_thread(shutdown_grace=-1):
                pass

    run_asyncio(main)


@pytest.mark.slow
def test_the_call_path_under_cancellation_at_every_step_by_every_canceller() -> None:
    """The Trio side of the bridge, explored: the portal serves in the explored run and
    the caller is a task there (submitting as a foreign thread does, waiting on the
    call's future). Cancellers: the caller's cancel (what an asyncio cancellation
    delivers), the shutdown, and the agent's own cancel (the Trio side). Every call is
    answered, only with what its canceller allows, and the log is balanced after."""
    from harness.bridge._thread import _Call, _CallCancelled
    from harness.faults import Probe, explore

    async def scenario(probe: Probe) -> None:
        portal = RuntimeThread(probe.tmp_path, provider=says(2))
        portal._state = "starting"
        outcomes: list[object] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(portal._serve)

            def cancel_calls() -> None:
                for call in list(portal._calls):
                    call.cancel_on_trio(closing=False)

            def cancel_agents() -> None:
                for handle in portal.runtime.agents():
                    handle.agent.cancel()

            probe.canceller("caller", cancel_calls)
            probe.canceller("shutdown", portal._close)
            probe.canceller("agent", cancel_agents)

            async def work() -> TurnResult:
                agent = await portal.runtime.open("s")
                return await agent.run_turn("hi")

            async def call_and_wait() -> None:
                try:
                    call: _Call[TurnResult] = portal._submit(work)
                except RuntimeThreadClosedError as exc:
                    outcomes.append(exc)
                    return
                answered = trio.Event()
                call.future.add_done_callback(lambda _: answered.set())  # set on the Trio thread
                await answered.wait()
                error = call.future.exception()
                outcomes.append(call.future.result() if error is None else error)

            probe.arm()
            await call_and_wait()
            await call_and_wait()
            probe.disarm()
            portal._close()
        fired = probe.canceller_name if probe.fired else None
        for outcome in outcomes:
            if isinstance(outcome, TurnResult):
                probe.check(outcome.kind == "completed" or fired == "agent", f"{outcome.kind} with {fired}")
            elif isinstance(outcome, _CallCancelled):
                probe.check(fired == "caller", f"cancelled with {fired}")
            elif isinstance(outcome, RuntimeThreadClosedError):
                probe.check(fired == "shutdown", f"closed with {fired}")
            else:
                probe.fail(f"unexpected outcome {outcome!r}")
        probe.check(len(outcomes) == 2, f"outcomes {outcomes}")
        async with harness.open_runtime(probe.tmp_path, provider=says(1)) as rt:
            stored = await rt.open("s")
            types = [e.type for e in stored.snapshot().events]
            probe.check(types.count("turn/start") == types.count("turn/end"), f"unbalanced: {types}")

    report = explore(scenario, name="bridge-call", seeds=2, stride=2)
    assert report.ok, [(v.key, v.message, n) for v, n in report.distinct()]
    assert min(report.steps.values()) >= 20, report.steps
