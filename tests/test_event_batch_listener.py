"""The batch form of ``session/event`` (``Store.on_event_batch``, issue 26): one call per
commit with its events, at its place in the event listeners' registration order, scoped
like ``on_event``, its failures contained once per batch; per-event listeners are still
called once per event. The persistence writer listens this way."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import pytest

from actors import Owner
from harness.errors import AsyncListenerError
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import SessionHandle, WarningReport, open_store
from harness.session import Event, EventDraft

BATCH = [EventDraft("feedback/record", {"i": i}) for i in range(3)]


async def test_order_with_per_event_listeners_and_one_call_per_commit() -> None:
    calls: list[tuple[str, Any]] = []
    async with open_store() as store:
        store.on_event(lambda h, e: calls.append(("a", e.seq)))
        store.on_event_batch(lambda h, evs: calls.append(("batch", tuple(e.seq for e in evs))))
        store.on_event(lambda h, e: calls.append(("b", e.seq)))
        s = await store.create("s")
        calls.clear()
        events = await s.append_batch(BATCH)
        seqs = tuple(e.seq for e in events)
        # Listener-major, registration order: every event to "a", then the batch at
        # once, then every event to "b" (one call per event for the per-event form).
        assert calls == [("a", seqs[0]), ("a", seqs[1]), ("a", seqs[2]), ("batch", seqs)] + [
            ("b", q) for q in seqs
        ]
        calls.clear()
        one = await s.append("feedback/record", {"x": 1})
        assert calls == [("a", one.seq), ("batch", (one.seq,)), ("b", one.seq)]


async def test_the_batch_is_the_committed_events() -> None:
    got: list[tuple[Event, ...]] = []
    async with open_store() as store:
        store.on_event_batch(lambda h, evs: got.append(evs))
        s = await store.create("s")
        got.clear()
        events = await s.append_batch(BATCH)
        assert len(got) == 1 and type(got[0]) is tuple
        assert list(got[0]) == list(events) and [e.data["i"] for e in got[0]] == [0, 1, 2]


async def test_scoped_batch_listener_hears_only_its_scope() -> None:
    heard: list[tuple[str, int]] = []
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store())
        mine = await stack.enter_async_context(Owner("mine"))
        child = await stack.enter_async_context(Owner("child", parent=mine))
        other = await stack.enter_async_context(Owner("other"))
        store.on_event_batch(lambda h, evs: heard.append((h.id, len(evs))), scope=mine)
        a = await store.create("a", owner=child)  # a descendant's session: heard
        b = await store.create("b", owner=other)
        c = await store.create("c")  # no scope: unscoped listeners only
        heard.clear()
        for s in (a, b, c):
            await s.append_batch(BATCH)
        assert heard == [("a", 3)]


async def test_a_failing_batch_listener_is_contained_and_reported_once() -> None:
    reports: list[WarningReport] = []
    after: list[int] = []

    def boom(handle: SessionHandle, events: tuple[Event, ...]) -> None:
        raise RuntimeError("batch bug")

    async with open_store() as store:
        store.warnings.subscribe(reports.append)
        store.on_event_batch(boom)
        store.on_event(lambda h, e: after.append(e.seq))
        s = await store.create("s")
        after.clear()
        events = await s.append_batch(BATCH)  # the append itself succeeds
        assert s.seq == events[-1].seq + 1
        assert after == [e.seq for e in events]  # later listeners still run, per event
        failed = [r for r in reports if r.kind == "listener-failed"]
        assert len(failed) == 1  # once for the batch, not once per event
        assert failed[0].source == "session/event" and "RuntimeError: batch bug" in failed[0].message


async def test_unsubscribed_before_its_turn_it_hears_the_first_event_only() -> None:
    # As a per-event listener unsubscribed by an earlier one during the dispatch: it
    # still hears the event being dispatched, none of the batch's later ones.
    batch_heard: list[tuple[int, ...]] = []
    per_event_heard: list[int] = []
    removers: list[Any] = []
    armed = False

    def first(handle: SessionHandle, event: Event) -> None:
        if armed:
            for remove in removers:
                remove()

    async with open_store() as store:
        store.on_event(first)
        removers.append(store.on_event_batch(lambda h, evs: batch_heard.append(tuple(e.seq for e in evs))))
        removers.append(store.on_event(lambda h, e: per_event_heard.append(e.seq)))
        s = await store.create("s")
        batch_heard.clear()
        per_event_heard.clear()
        armed = True
        events = await s.append_batch(BATCH)
        assert per_event_heard == [events[0].seq]
        assert batch_heard == [(events[0].seq,)]
        await s.append_batch(BATCH)  # gone for good
        assert per_event_heard == [events[0].seq] and len(batch_heard) == 1


async def test_an_async_batch_listener_is_refused() -> None:
    async def listener(handle: SessionHandle, events: tuple[Event, ...]) -> None:
        pass

    async with open_store() as store:
        with pytest.raises(AsyncListenerError):
            store.on_event_batch(listener)
        s = await store.create("s")
        await s.append("feedback/record", {})  # nothing registered, nothing called


async def test_persistence_writes_every_event_of_each_batch(tmp_path: Any) -> None:
    # The persistence listener takes each commit whole: what flushes made durable reads
    # back event for event, after single appends and batches.
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)):
        s = await store.create("s")
        await s.append("feedback/record", {"one": 1})
        await s.append_batch(BATCH)
        await s.flush()
        await s.append_batch(BATCH[:2])
        await s.flush()
        live = [(e.type, e.seq, e.data) for e in s.events]
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        prep = await p.prepare("s")
        stored = [(e.type, e.seq, e.data) for e in prep.session.events]
        await prep.dispose()
    assert stored[: len(live)] == live  # (a load adds its own session/end-seed after them)
    assert all(t != "feedback/record" for t, _, _ in stored[len(live) :])
    assert [d for t, _, d in stored if t == "feedback/record"] == [{"one": 1}, *({"i": i} for i in (0, 1, 2, 0, 1))]


async def test_enqueue_batch_skips_what_a_catch_up_buffered(tmp_path: Any) -> None:
    # A batch that starts before the writer's cursor (a catch-up took part of it) is
    # buffered from the cursor on: nothing twice, nothing missing.
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        s = await store.create("s")
        await s.flush()
        writer = p._writers["s"]
        events = await s.append_batch(BATCH)
        before = len(writer.pending)
        writer.enqueue_batch(events)  # all buffered already: nothing added
        writer.enqueue_batch(events[1:])
        assert len(writer.pending) == before
        await s.flush()
        assert writer.durable == s.seq
