"""``ActorRef.call_nowait``: the inline call without its checkpoint (Trio's ``*_nowait``
rule), for a caller whose own next wait is the schedule point (``append(...,
durable=True)``). It runs the handler on the caller's task when the actor is idle and
the type is inline, raises ``trio.WouldBlock`` with nothing sent otherwise, and ends a
rejection or a crash exactly as the inline :meth:`ActorRef.call` does."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from actors import ActorCrashedError, ActorRuntime, ActorStoppedError
from tests.test_inline_calls import Put, _spawn, _Steps, stopping


async def test_it_runs_the_handler_on_the_callers_task_with_no_task_step() -> None:
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        steps = _Steps()
        trio.lowlevel.add_instrument(steps)
        try:
            results = [ref.call_nowait(Put(i)) for i in range(5)]
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert results == list(range(5)) and actor.applied == list(range(5))
        assert steps.steps == 0  # synchronous: no schedule point at all
        assert actor.tasks == [trio.lowlevel.current_task()] * 5
        assert ref.idle  # the borrow ended


async def test_it_runs_even_in_a_cancelled_scope() -> None:
    # Not a checkpoint, so no cancellation is seen: the caller checks first if it
    # wants call's answer ("Cancelled: not applied").
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        with trio.CancelScope() as scope:  # noqa: ASYNC100 (the point: no checkpoint inside)
            scope.cancel()
            assert ref.call_nowait(Put(1)) == 1
        assert scope.cancelled_caught is False and actor.applied == [1]


async def test_a_busy_actor_or_a_mailed_type_would_block_and_nothing_is_sent() -> None:
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        with pytest.raises(trio.WouldBlock):
            ref.call_nowait("mailed")  # not an inline type
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ref.call, "wait")
            await trio.testing.wait_all_tasks_blocked()
            assert not ref.idle
            with pytest.raises(trio.WouldBlock):
                ref.call_nowait(Put("while busy"))
            actor.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert actor.applied == ["wait"]
        assert ref.call_nowait(Put(2)) == 2


async def test_a_rejection_is_raised_and_the_actor_goes_on() -> None:
    async with ActorRuntime() as rt:
        actor, ref = await _spawn(rt)
        with pytest.raises(ValueError, match="refused") as info:
            ref.call_nowait(Put("bad"))
        assert info.value.__context__ is None
        with pytest.raises(KeyError, match="wrapped refusal"):
            ref.call_nowait(Put("wrapped"))
        assert ref.alive and ref.idle and ref.call_nowait(Put(3)) == 3
        assert actor.applied == [3] and not rt.crashes


async def test_a_crash_crashes_the_actor_and_later_calls_say_so() -> None:
    told: list[tuple[str, BaseException]] = []
    async with ActorRuntime(supervisor=lambda name, exc: told.append((name, exc))) as rt:
        actor, ref = await _spawn(rt)
        with pytest.raises(ZeroDivisionError) as info:
            ref.call_nowait(Put("boom"))
        assert info.value is actor.crash and info.value.__context__ is None
        assert not ref.alive
        await trio.testing.wait_all_tasks_blocked()
        assert actor.exited and told == [("inline", actor.crash)]
        with pytest.raises(ActorCrashedError):
            ref.call_nowait(Put(1))


async def test_a_stopping_actor_refuses_it() -> None:
    async with ActorRuntime() as rt:
        async with stopping(rt) as (actor, ref):
            with pytest.raises(ActorStoppedError):
                ref.call_nowait(Put("while stopping"))
        with pytest.raises(ActorStoppedError):
            ref.call_nowait(Put("after the stop"))
        assert actor.applied == ["wait"] and actor.tasks == []
