"""Decision 0013: a call of an inline message type to an idle actor runs the actor's
synchronous ``handle_inline`` on the caller's task, the mailbox borrowed.

These pin its contract: which path a call takes (and its cost in task steps), that a
call is still a checkpoint with decision 0007's cancellation answer, that rejections
and crashes end as on the actor's own task, that what is sent during the borrow is
served afterwards in order, and that a stopping actor runs nothing inline. First on a
small domain-free actor, then through the store's session actor."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import outcome
import pytest
import trio
import trio.testing

from actors import Actor, ActorCrashedError, ActorRef, ActorRuntime, ActorStoppedError, Rejected
from actors._actor import _Envelope
from actors._mailbox import Mailbox
from harness.errors import SessionNotLiveError
from harness.runtime import open_store
from harness.runtime._session_actor import SessionActor


@attrs.frozen
class Put:
    """The inline message type of :class:`Inline`."""

    value: Any


class Inline(Actor[Any]):
    """Put(v) is inline (records ``v``); any other message is mailed (``"wait"`` parks on
    ``gate``). ``Put("bad")`` is a rejection, ``Put("boom")`` a crash; ``during`` runs
    inside the inline handler (a synchronous listener, as the session actor's)."""

    inline_messages = frozenset({Put})
    rejections = (ValueError,)
    mailbox_size = 8

    def __init__(self) -> None:
        self.name = "inline"
        self.applied: list[Any] = []
        self.tasks: list[trio.lowlevel.Task] = []  # the task each Put ran on
        self.gate = trio.Event()
        self.during: Callable[[Any], None] | None = None
        self.crash: BaseException | None = None
        self.exited = False

    def handle_inline(self, message: Put) -> Any:
        self.tasks.append(trio.lowlevel.current_task())
        if self.during is not None:
            self.during(message.value)
        if message.value == "bad":
            raise ValueError("refused")
        if message.value == "wrapped":
            raise Rejected(KeyError("wrapped refusal"))
        if message.value == "boom":
            self.crash = ZeroDivisionError("bug")
            raise self.crash
        self.applied.append(message.value)
        return message.value

    async def handle(self, message: Any) -> Any:
        if message == "wait":
            await self.gate.wait()
        self.applied.append(message)
        return message

    def on_exit(self) -> None:
        self.exited = True


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


class _TaskSteps(trio.abc.Instrument):
    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


async def _spawn(rt: ActorRuntime) -> tuple[Inline, ActorRef[Any]]:
    actor = Inline()
    ref = rt.spawn(actor)
    await trio.testing.wait_all_tasks_blocked()  # parked on its empty mailbox: idle
    assert ref.idle
    return actor, ref


# -- 1. which path a call takes ------------------------------------------------------------


async def test_an_idle_actors_inline_call_runs_on_the_callers_task_in_one_step() -> None:
    # Inline: the caller's one shielded schedule point is the only task step (the
    # mailed call of test_actor_calls takes two: the actor's and the caller's).
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        steps = _Steps()
        trio.lowlevel.add_instrument(steps)
        try:
            for i in range(10):
                assert await ref.call(Put(i)) == i
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert steps.steps == 10
        assert actor.applied == list(range(10))
        me = trio.lowlevel.current_task()
        assert all(task is me for task in actor.tasks)
        assert ref.idle


async def test_a_cast_of_an_inline_type_is_mailed_and_runs_on_the_actor_task() -> None:
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        ref.cast_nowait(Put("cast"))
        await trio.testing.wait_all_tasks_blocked()
        assert actor.applied == ["cast"]
        assert actor.tasks[0] is not trio.lowlevel.current_task()


async def test_a_busy_actor_gets_the_inline_type_mailed_in_order() -> None:
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        got: list[Any] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ref.call, "wait")
            await trio.testing.wait_all_tasks_blocked()
            assert not ref.idle

            async def caller() -> None:
                actor_tasks_before = len(actor.tasks)
                got.append(await ref.call(Put(1)))
                assert actor.tasks[actor_tasks_before] is not trio.lowlevel.current_task()

            nursery.start_soon(caller)
            await trio.testing.wait_all_tasks_blocked()
            assert actor.applied == [] and got == []  # not run inline past the busy actor
            actor.gate.set()
        assert actor.applied == ["wait", 1] and got == [1]


async def test_a_message_sent_just_before_is_applied_before_the_inline_type() -> None:
    # The cast is handed to the parked actor (which has not run yet): the actor is no
    # longer idle, so the call is mailed behind it instead of overtaking it.
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        ref.cast_nowait("first")
        assert not ref.idle
        assert await ref.call(Put("second")) == "second"
        assert actor.applied == ["first", "second"]
        assert actor.tasks[0] is not trio.lowlevel.current_task()


# -- 2. a checkpoint, with decision 0007's cancellation answer -----------------------------


async def test_an_inline_call_is_a_checkpoint_and_a_schedule_point() -> None:
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        with trio.testing.assert_checkpoints():
            await ref.call(Put(1))
        # A schedule point: the caller's task is suspended and resumed once (a new
        # task step), so other tasks get to run during the call.
        me = trio.lowlevel.current_task()
        steps = _TaskSteps(me)
        trio.lowlevel.add_instrument(steps)
        try:
            await ref.call(Put(2))
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert steps.steps == 1
        assert actor.applied == [1, 2]


async def test_an_inline_call_in_a_cancelled_scope_is_not_applied() -> None:
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        reached = False
        with trio.CancelScope() as scope:
            scope.cancel()
            await ref.call(Put(1))
            reached = True
        assert scope.cancelled_caught and not reached
        assert actor.applied == [] and actor.tasks == []
        assert ref.idle  # no borrow left behind
        assert await ref.call(Put(2)) == 2


async def test_a_cancellation_during_the_inline_handler_lands_at_the_next_checkpoint() -> None:
    # The handler cancels the caller's own scope: the message is applied, so the call
    # returns its answer; Cancelled comes at the caller's next checkpoint.
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        got: list[Any] = []
        with trio.CancelScope() as scope:
            actor.during = lambda value: scope.cancel()
            got.append(await ref.call(Put(1)))
            got.append("after the call")
            await trio.lowlevel.checkpoint()
            got.append("unreachable")
        actor.during = None
        assert scope.cancelled_caught
        assert got == [1, "after the call"] and actor.applied == [1]
        assert ref.idle


# -- 3. rejections ---------------------------------------------------------------------


async def test_an_inline_rejection_is_the_callers_reply_and_the_actor_goes_on() -> None:
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        with pytest.raises(ValueError, match="refused"):
            await ref.call(Put("bad"))
        assert ref.alive and ref.idle
        with pytest.raises(KeyError, match="wrapped refusal"):
            await ref.call(Put("wrapped"))
        assert ref.alive and ref.idle
        assert await ref.call(Put(2)) == 2
        assert actor.tasks[-1] is trio.lowlevel.current_task()  # still inline
        assert await ref.call("mailed") == "mailed"
        assert actor.applied == [2, "mailed"] and not rt.crashes


# -- 4. crashes ------------------------------------------------------------------------


async def test_an_inline_crash_crashes_the_actor_as_its_own_task_would() -> None:
    told: list[tuple[str, BaseException]] = []
    async with ActorRuntime(supervisor=lambda name, exc: told.append((name, exc))) as rt:
        actor, ref = await _spawn(rt)
        queued_call = _Envelope("queued call", reply=True)

        def send_behind(value: Any) -> None:
            # Sent during the crashing handler: queued behind it, never handled.
            ref.cast_nowait("queued cast")
            ref._mailbox.put_nowait(queued_call)  # a call's envelope, as ActorRef.call queues it

        actor.during = send_behind
        with pytest.raises(ZeroDivisionError) as info:
            await ref.call(Put("boom"))
        assert info.value is actor.crash  # the original exception
        assert info.value.__context__ is None
        assert not ref.alive
        await trio.testing.wait_all_tasks_blocked()
        assert actor.exited  # the parked actor task was woken into its crash path
        assert told == [("inline", actor.crash)] and rt.crashes == told
        assert isinstance(queued_call.result, outcome.Error)
        assert isinstance(queued_call.result.error, ActorCrashedError)
        assert actor.applied == []  # the queued cast was never handled
        for message in (Put(1), "mailed"):
            with pytest.raises(ActorCrashedError):
                await ref.call(message)
        assert actor.tasks == [trio.lowlevel.current_task()]


# -- 6. what is sent during the borrow ---------------------------------------------------


async def test_messages_sent_during_an_inline_handler_are_served_after_it_in_order() -> None:
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        seen_idle: list[bool] = []

        def send(value: Any) -> None:
            if value != 1:
                return
            seen_idle.append(ref.idle)
            ref.cast_nowait(Put(2))
            ref.cast_nowait("three")
            ref.cast_nowait(Put(4))
            seen_idle.append(ref.idle)

        actor.during = send
        assert await ref.call(Put(1)) == 1
        assert seen_idle == [False, False]  # busy to everyone while borrowed
        await trio.testing.wait_all_tasks_blocked()
        assert actor.applied == [1, 2, "three", 4]
        me = trio.lowlevel.current_task()
        assert [task is me for task in actor.tasks] == [True, False, False]
        assert ref.idle


async def test_a_mailbox_closed_while_borrowed_ends_its_receiver_at_end_borrow() -> None:
    box: Mailbox[str] = Mailbox(4)
    got: list[object] = []

    async def receiver() -> None:
        try:
            got.append(await box.take())
        except trio.EndOfChannel:
            got.append("end")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        await trio.testing.wait_all_tasks_blocked()
        assert box.borrow() and not box.idle and not box.borrow()
        box.close()
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # the borrower tells it, not close
        box.end_borrow()
    assert got == ["end"]


async def test_an_actor_cancelled_during_an_inline_handler_unwinds_after_it() -> None:
    # Cancelling the actor's own scope delivers the cancellation to the parked actor
    # task at once (its receive is aborted) while the borrow still runs: the message is
    # applied and answered, end_borrow finds no receiver, and the actor task unwinds on
    # its own, failing what queued meanwhile.
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        queued_call = _Envelope("queued call", reply=True)

        def cancel_actor(value: Any) -> None:
            ref._mailbox.put_nowait(queued_call)
            ref._cell.scope.cancel()

        actor.during = cancel_actor
        assert await ref.call(Put(1)) == 1
        await trio.testing.wait_all_tasks_blocked()
        assert actor.exited and not ref.alive
        assert isinstance(queued_call.result, outcome.Error)
        assert isinstance(queued_call.result.error, ActorStoppedError)
        with pytest.raises(ActorStoppedError):
            await ref.call(Put(2))
        assert actor.applied == [1]


# -- 7. a stopping actor runs nothing inline --------------------------------------------


@asynccontextmanager
async def stopping(rt: ActorRuntime) -> AsyncIterator[tuple[Inline, ActorRef[Any]]]:
    """An actor being stopped for the block (busy with a mailed call, a stop asked);
    leaving the block lets the call end, so the actor is stopped after it."""
    actor, ref = await _spawn(rt)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ref.call, "wait")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(rt.stop, ref)
        await trio.testing.wait_all_tasks_blocked()
        yield actor, ref
        actor.gate.set()


async def test_a_stopping_or_stopped_actor_runs_no_inline_call() -> None:
    async with ActorRuntime() as rt:
        async with stopping(rt) as (actor, ref):
            with pytest.raises(ActorStoppedError):
                await ref.call(Put("while stopping"))
        with pytest.raises(ActorStoppedError):
            await ref.call(Put("after the stop"))
        assert actor.applied == ["wait"] and actor.tasks == []


# -- through the store: the session actor's inline Append -------------------------------


async def test_an_inline_append_runs_its_listener_on_the_callers_task_and_a_nested_cast_queues() -> None:
    async with open_store() as store:
        h = await store.create("s")
        await trio.testing.wait_all_tasks_blocked()
        seen: list[tuple[str, bool, bool]] = []
        me = trio.lowlevel.current_task()

        def listener(handle: Any, ev: Any) -> None:
            seen.append((ev.type, trio.lowlevel.current_task() is me, handle._ref().idle))
            if ev.type == "test/outer":
                handle.append_nowait("test/nested", {"n": 2})

        store.on_event(listener)
        outer = await h.append("test/outer", {"n": 1})
        await h.barrier()
        types = [e.type for e in h.events]
        assert types[-2:] == ["test/outer", "test/nested"]
        assert h.events[-1].seq == outer.seq + 1
        # The outer listener ran inline on this task, the actor busy; the nested one on
        # the actor task (a cast is mailed).
        assert seen == [("test/outer", True, False), ("test/nested", False, False)]


async def test_a_cancelled_inline_append_is_not_in_the_log() -> None:
    async with open_store() as store:
        h = await store.create("s")
        await trio.testing.wait_all_tasks_blocked()
        before = len(h.events)
        with trio.CancelScope() as scope:
            scope.cancel()
            await h.append("test/x", {})
        assert scope.cancelled_caught and len(h.events) == before
        assert (await h.append("test/y", {})).seq == h.events[-1].seq


async def test_an_inline_append_crash_ends_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    original = SessionActor._append
    bug = RuntimeError("session actor bug")

    def buggy(self: SessionActor, drafts: tuple[Any, ...]) -> Any:
        events = original(self, drafts)
        if drafts[0].type == "test/boom":
            raise bug
        return events

    monkeypatch.setattr(SessionActor, "_append", buggy)
    told: list[tuple[str, BaseException]] = []
    async with open_store(supervisor=lambda name, exc: told.append((name, exc))) as store:
        h = await store.create("s")
        await trio.testing.wait_all_tasks_blocked()

        def listener(handle: Any, ev: Any) -> None:
            if ev.type == "test/boom":
                handle.append_nowait("test/behind", {})  # queued behind the crash

        store.on_event(listener)
        with pytest.raises(RuntimeError) as info:
            await h.append("test/boom", {})
        assert info.value is bug
        await trio.testing.wait_all_tasks_blocked()
        assert told == [("session:s", bug)]
        assert "test/behind" not in [e.type for e in h.events]
        with pytest.raises(SessionNotLiveError) as nl:
            await h.append("test/later", {})
        assert nl.value.code == "SESSION_NOT_LIVE"


async def test_a_detached_or_closed_session_runs_no_inline_append() -> None:
    async with open_store() as store:
        h = await store.create("s")
        h2 = await store.create("t")
        await store.detach(h)
        with pytest.raises(SessionNotLiveError):
            await h.append("test/x", {})
        with pytest.raises(SessionNotLiveError):
            await h.measure()
    assert not any(e.type == "test/x" for e in h.events)
    with pytest.raises(SessionNotLiveError):
        await h2.append("test/x", {})
    with pytest.raises(SessionNotLiveError):
        await h2.derive_messages()
