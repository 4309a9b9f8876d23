"""The call fast path of the actor kernel (issue 26, W1-actor): a reply handed to the
parked caller by a direct reschedule (no event or channel per call) and the kernel's
own mailbox. These pin its structure (how many task steps a call takes) and, by
exploration, that it keeps decision 0007's contract at every step: a call that
returns was applied, one that raises ``Cancelled`` or ``ActorStoppedError`` was not,
whatever cancels the caller, stops the actor or fills its mailbox."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from actors import Actor, ActorCrashedError, ActorRuntime, ActorStoppedError
from harness.faults import Probe
from harness.runtime import open_store
from harness.testing import ExploreCheckpoints


class Recorder(Actor[Any]):
    mailbox_size = 1  # small: the full-mailbox path (a put that waits) is explored too

    def __init__(self) -> None:
        self.name = "recorder"
        self.applied: list[Any] = []
        self.gate = trio.Event()

    async def handle(self, message: Any) -> Any:
        if message == "boom":
            raise ZeroDivisionError("bug")
        if isinstance(message, tuple) and message[0] == "slow":
            await trio.lowlevel.checkpoint()  # a handler with a checkpoint of its own
        if message == "wait":
            await self.gate.wait()
        self.applied.append(message)
        return message


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


async def test_a_call_to_a_waiting_actor_is_two_task_steps() -> None:
    # The caller parks once and the actor runs once, which reschedules the caller:
    # one step each. (The channel-and-event call took three: the caller woke once
    # after its send's checkpoint and once more for the reply.)
    async with ActorRuntime() as rt:
        ref = rt.spawn(Recorder())
        await ref.call("warm")
        await trio.testing.wait_all_tasks_blocked()
        steps = _Steps()
        trio.lowlevel.add_instrument(steps)
        try:
            for i in range(10):
                assert await ref.call(i) == i
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert steps.steps == 20


async def test_a_full_mailbox_call_that_is_answered_before_its_send_returns() -> None:
    # A call that waited for space can find its reply already there (the actor took
    # and handled it in the same batch): it returns it without waiting again.
    async with ActorRuntime() as rt:
        actor = Recorder()
        ref = rt.spawn(actor)
        results: list[Any] = []
        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(lambda i=i: _append_result(results, ref.call(("slow", i))))
        assert sorted(r[1] for r in results) == list(range(6))
        assert sorted(m[1] for m in actor.applied) == list(range(6))


async def _append_result(results: list[Any], call: Any) -> None:
    results.append(await call)


async def test_stop_fails_the_senders_waiting_for_space_and_applies_the_queued() -> None:
    async with ActorRuntime() as rt:
        actor = Recorder()
        ref = rt.spawn(actor)
        outcomes: dict[Any, object] = {}

        async def call(i: Any) -> None:
            try:
                outcomes[i] = await ref.call(i)
            except ActorStoppedError as exc:
                outcomes[i] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "wait")
            await trio.testing.wait_all_tasks_blocked()
            for i in range(4):  # one queued (a mailbox of one), three waiting for space
                nursery.start_soon(call, i)
                await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(rt.stop, ref)
            await trio.testing.wait_all_tasks_blocked()
            actor.gate.set()
        assert outcomes.pop("wait") == "wait"
        assert actor.applied == ["wait", 0]
        assert outcomes[0] == 0
        assert all(isinstance(outcomes[i], ActorStoppedError) for i in (1, 2, 3))
        with pytest.raises(ActorStoppedError):
            await ref.call("late")


async def test_a_crash_fails_the_queued_and_waiting_calls() -> None:
    async with ActorRuntime(supervisor=lambda name, exc: None) as rt:
        actor = Recorder()
        ref = rt.spawn(actor)
        outcomes: list[object] = []

        async def call(message: Any) -> None:
            try:
                outcomes.append(await ref.call(message))
            except Exception as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "boom")
            await trio.testing.wait_all_tasks_blocked()
            for i in range(3):
                nursery.start_soon(call, i)
        assert isinstance(outcomes[0], ZeroDivisionError)
        assert all(isinstance(o, (ActorCrashedError, ZeroDivisionError)) for o in outcomes)
        assert actor.applied == []


def test_kernel_calls_cancelled_or_stopped_at_every_step(explore_checkpoints: ExploreCheckpoints) -> None:
    """Three callers (one of them cancellable) and an actor with a one-message mailbox;
    cancellers: the caller, and a stop of the actor. Every call that returned was
    applied, exactly once; every call that raised was not."""

    async def body(probe: Probe) -> None:
        outcomes: dict[Any, str] = {}
        async with trio.open_nursery() as outer, ActorRuntime(stop_grace=5.0) as rt:
            actor = Recorder()
            ref = rt.spawn(actor)

            async def stop() -> None:
                await rt.stop(ref)

            async def call(message: Any) -> None:
                outcomes[message] = "sent"
                try:
                    got = await ref.call(message)
                except trio.Cancelled:
                    outcomes[message] = "cancelled"
                    raise
                except ActorStoppedError:
                    outcomes[message] = "stopped"
                    return
                probe.check(got == message, f"{message!r} answered {got!r}")
                outcomes[message] = "returned"

            async def bystander(tag: str) -> None:
                for i in range(3):
                    await call((tag, i) if i != 1 else ("slow", f"{tag}{i}"))

            async with trio.open_nursery() as nursery:
                # The stop's own task outlives the runtime (a late stop is a no-op).
                probe.canceller("actor-stop", lambda: outer.start_soon(stop))
                nursery.start_soon(bystander, "b")
                nursery.start_soon(bystander, "c")
                with trio.CancelScope() as caller:
                    probe.canceller("caller", caller.cancel)
                    probe.arm()
                    for i in range(3):
                        await call(("a", i))
            probe.disarm()
        applied = actor.applied
        probe.check(len(applied) == len(set(applied)), f"applied twice: {applied}")
        returned = {m for m, o in outcomes.items() if o == "returned"}
        probe.check(set(applied) == returned, f"applied {applied} but returned {sorted(returned)}: {outcomes}")
        probe.check("sent" not in outcomes.values(), f"a call never answered: {outcomes}")

    report = explore_checkpoints(body, name="kernel-calls", arm=False, cancellers=["caller", "actor-stop"])
    assert report.attempts > 50


def test_session_appends_cancelled_at_every_step(explore_checkpoints: ExploreCheckpoints) -> None:
    """``SessionHandle.append`` through the fast path, next to a concurrent appender and
    an event listener: an append that returned is in the log, once, at the seq it
    returned (and its listener heard it); a cancelled append is not in the log."""

    async def body(probe: Probe) -> None:
        returned: dict[int, int] = {}
        cancelled: list[int] = []
        heard: list[int] = []
        async with open_store() as store:
            store.on_event(lambda h, ev: heard.append(ev.seq))
            h = await store.create("s")

            async def other() -> None:
                for i in range(100, 103):
                    await h.append("feedback/record", {"n": i})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(other)
                with trio.CancelScope() as caller:
                    probe.canceller("caller", caller.cancel)
                    probe.arm()
                    for i in range(3):
                        try:
                            ev = await h.append("feedback/record", {"n": i})
                        except trio.Cancelled:
                            cancelled.append(i)
                            raise
                        returned[i] = ev.seq
            probe.disarm()
            logged = {e.data["n"]: e.seq for e in h.events if e.type == "feedback/record"}  # type: ignore[index]
        for i, seq in returned.items():
            probe.check(logged.get(i) == seq, f"append {i} returned seq {seq}, logged at {logged.get(i)}")
        for i in cancelled:
            probe.check(i not in logged, f"append {i} reported cancelled but logged at {logged.get(i)}")
        probe.check(sorted(heard) == sorted(logged.values()), f"listener heard {heard}, log {logged}")
        probe.check(all(i in logged for i in range(100, 103)), f"the other appender lost some: {logged}")

    report = explore_checkpoints(body, name="session-appends", arm=False)
    assert report.attempts > 20
