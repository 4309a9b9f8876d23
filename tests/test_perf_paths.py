"""Fast paths added for issue 15 give the same answers as the plain ones."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from actors import Actor, ActorRuntime
from harness.agent._inbox import SPLICED, Inbox
from harness.runtime import open_store
from harness.session import EventDraft, Session


def _clock() -> int:
    return 1


def test_seqs_of_type_matches_a_walk_of_the_events() -> None:
    s = Session.create("a", clock=_clock)
    for i in range(30):
        s.append("feedback/record" if i % 3 else SPLICED, {"i": i})
    view = s.events  # a snapshot: later appends are not in it
    s.append(SPLICED, {"i": 99})
    expected = [e.seq for e in view if e.type == SPLICED]
    assert view.seqs_of_type(SPLICED) == expected and len(expected) == 10
    assert s.events.seqs_of_type(SPLICED) == [*expected, 30]
    assert view.seqs_of_type("nothing/here") == []
    # A fork shares its parent's columns: the shared prefix and its own part both count.
    child = Session.fork_of(s, 20, "b", {"version": 0, "id": "b", "createdAt": 1, "seedLength": 21}, clock=_clock)
    child.append_batch([EventDraft(SPLICED, {"i": 100})])
    walked = [e.seq for e in child.events if e.type == SPLICED]
    assert child.events.seqs_of_type(SPLICED) == walked and walked[-1] == len(child.events) - 1


def test_seqs_outside_matches_a_walk_of_the_events() -> None:
    known = frozenset({"feedback/record"})
    s = Session.create("a", clock=_clock)
    assert s.events.seqs_outside(known) == []
    for i in range(30):
        s.append("feedback/record" if i % 4 else SPLICED, {"i": i})
    view = s.events
    s.append(SPLICED, {"i": 99})
    expected = [e.seq for e in view if e.type not in known]
    assert view.seqs_outside(known) == expected and len(expected) == 8
    assert s.events.seqs_outside(known) == [*expected, 30]
    assert s.events.seqs_outside(known | {SPLICED}) == []
    child = Session.fork_of(s, 20, "b", {"version": 0, "id": "b", "createdAt": 1, "seedLength": 21}, clock=_clock)
    child.append_batch([EventDraft(SPLICED, {"i": 100}), EventDraft("feedback/record", {"i": 101})])
    walked = [e.seq for e in child.events if e.type not in known]
    assert child.events.seqs_outside(known) == walked and walked[-1] == len(child.events) - 2
    assert list(child.events)[walked[0]].type == SPLICED


def test_inbox_rebuild_from_a_log_and_from_a_list_agree() -> None:
    s = Session.create("a", clock=_clock)
    s.append("feedback/record", {"i": 0})
    s.append(SPLICED, {"target": "next-turn", "start": 0, "inserted": [{"id": "m1"}, {"id": "m2"}]})
    s.append(SPLICED, {"target": "next-step", "start": 0, "inserted": [{"id": "m3"}]})
    s.append(SPLICED, {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []})
    s.append(SPLICED, "malformed")
    from_log = Inbox.rebuild(s.events)
    from_list = Inbox.rebuild(list(s.events))
    assert from_log.queues == from_list.queues == {"next-turn": [{"id": "m2"}], "next-step": [{"id": "m3"}]}


class Gated(Actor[Any]):
    def __init__(self) -> None:
        self.name = "gated"
        self.gate = trio.Event()
        self.applied: list[Any] = []

    async def handle(self, message: Any) -> Any:
        if message == "wait":
            await self.gate.wait()
        self.applied.append(message)
        return len(self.applied)


async def test_an_actor_is_idle_only_when_parked_with_nothing_queued() -> None:
    async with ActorRuntime() as rt:
        actor = Gated()
        ref = rt.spawn(actor)
        await trio.testing.wait_all_tasks_blocked()
        assert ref.idle
        assert await ref.call("x") == 1
        await trio.testing.wait_all_tasks_blocked()
        assert ref.idle
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ref.call, "wait")
            await trio.testing.wait_all_tasks_blocked()
            assert not ref.idle  # taken, being handled
            nursery.start_soon(ref.call, "y")
            await trio.testing.wait_all_tasks_blocked()
            assert not ref.idle  # queued behind it
            actor.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert ref.idle and actor.applied == ["x", "wait", "y"]
    assert not ref.idle  # stopped


async def test_a_message_sent_is_never_missed_by_idle() -> None:
    async with ActorRuntime() as rt:
        actor = Gated()
        ref = rt.spawn(actor)
        await trio.testing.wait_all_tasks_blocked()
        assert ref.idle
        ref.cast_nowait("z")  # handed to the waiting actor, synchronously
        assert not ref.idle
        await trio.testing.wait_all_tasks_blocked()
        assert ref.idle and actor.applied == ["z"]


async def test_an_idle_session_barrier_is_still_a_checkpoint() -> None:
    async with open_store() as store:
        h = await store.create("a")
        await h.append("feedback/record", {"i": 0})
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            await h.barrier()
        assert scope.cancelled_caught
        await h.barrier()
