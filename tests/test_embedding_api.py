"""What an embedding application reads and hears: snapshots, listeners, warnings."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

import harness
from harness.agent import AgentHandle, Say, ScriptedProvider, Status
from harness.errors import (
    AsyncListenerError,
    EventError,
    SessionArgumentError,
    StorageRowError,
    SurfaceError,
)
from harness.persistence import JsonlBackend
from harness.runtime import SessionHandle, WarningReport, open_store
from harness.session import (
    Event,
    ReplaceOp,
    adopt_event,
    event_to_record,
    is_append_surface_event,
    is_replacement_surface_event,
    is_surface_eligible_type,
    is_surface_event,
    pack_chunk_runs,
    raw_of,
    record_to_event,
    snapshot_event,
    storage_record_to_events,
    thaw,
)
from tests.helpers import user

# -- 1. reads from immutable snapshots ---------------------------------------------------


async def test_a_held_snapshot_never_changes_after_appends_and_a_replace() -> None:
    async with open_store() as store:
        s = await store.create("s", cwd="/w")
        await s.append("user/message", user("a", "one"), surface_op="append")
        await s.append("user/message", user("b", "two"), surface_op="append")
        held = s.snapshot()
        assert (held.seq, tuple(held.surface), held.generation) == (2, (0, 1), 0)
        assert [m["id"] for m in held.messages] == ["a", "b"]
        assert held.header.cwd == "/w" and held.session_id == "s"

        await s.append("feedback/record", {"text": "x"})
        await s.commit_replace(
            s.surface(), "user/message", user("sum", "summary"), surface_op=ReplaceOp(0, 1), source_event_seqs=[0, 1]
        )

        # The held snapshot is as it was ...
        assert (held.seq, len(held.events), tuple(held.surface), held.generation) == (2, 2, (0, 1), 0)
        assert [m["id"] for m in held.messages] == ["a", "b"]
        assert [e.type for e in held.events] == ["user/message", "user/message"]
        # ... and a new one sees both commits.
        now = s.snapshot()
        assert (now.seq, tuple(now.surface), now.generation) == (4, (3,), 1)
        assert [m["id"] for m in now.messages] == ["sum"]
        assert now.messages == await s.derive_messages()  # the actor's own answer


async def test_a_read_after_an_append_returned_sees_it() -> None:
    async with open_store() as store:
        s = await store.create()
        before = s.snapshot()
        assert s.snapshot() is before  # nothing committed: the same snapshot
        ev = await s.append("user/message", user("m1"), surface_op="append")
        after = s.snapshot()
        assert after is not before and after.events[-1] == ev and after.seq == ev.seq + 1
        assert [m["id"] for m in s.messages] == ["m1"] and s.generation == 0
        batch = await s.append_batch(
            [harness.session.EventDraft("feedback/record", {"i": i}) for i in range(3)]
        )
        assert s.snapshot().events[-3:] == batch
        assert before.seq == 0 and len(before.messages) == 0


async def test_a_session_event_listener_reads_the_commit_it_hears() -> None:
    seen: list[tuple[int, int]] = []
    async with open_store() as store:

        def on_event(handle: SessionHandle, event: Event) -> None:
            seen.append((event.seq, handle.snapshot().seq))

        store.on_event(on_event)
        s = await store.create()
        await s.append_batch(
            [harness.session.EventDraft("feedback/record", {"i": i}) for i in range(2)]
        )
    # A listener runs after the whole batch committed: it sees the batch whole.
    assert seen == [(0, 2), (1, 2)]


async def test_events_until_is_a_prefix_view_and_checks_its_bound() -> None:
    async with open_store() as store:
        s = await store.create("s")
        for i in range(4):
            await s.append("feedback/record", {"i": i})
        prefix = s.events_until(2)
        assert [e.seq for e in prefix] == [0, 1] and len(prefix) == 2
        assert s.events_until(4) is s.snapshot().events and len(s.events_until(0)) == 0
        await s.append("feedback/record", {"i": 4})
        assert len(prefix) == 2  # a held prefix never grows
        for bad in (-1, 6, "2", True):
            with pytest.raises(SessionArgumentError, match=r'session "s": events_until takes an end in 0\.\.5') as info:
                s.events_until(bad)  # type: ignore[arg-type]
            assert info.value.session_id == "s"


async def test_live_ids_and_get_nowait_read_the_store_without_a_round_trip() -> None:
    async with open_store() as store:
        assert store.live_ids() == ()
        a = await store.create("a")
        b = await store.create("b")
        assert store.live_ids() == ("a", "b")
        assert store.get_nowait("a") is a and store.get_nowait("zz") is None
        assert store.get_nowait(3) is None  # type: ignore[arg-type]
        ids = store.live_ids()
        await store.detach(a)
        assert ids == ("a", "b")  # a held snapshot of the ids
        assert store.live_ids() == ("b",) and store.get_nowait("a") is None
        # A stale handle still reads the session as it was when it was detached.
        assert a.snapshot().seq == 0 and not a.alive
        assert b.store is store


async def test_runtime_and_agent_handle_reads() -> None:
    statuses: list[tuple[Status, Status]] = []
    async with harness.open_runtime(provider=ScriptedProvider([[Say("hello")]])) as rt:
        h = await rt.create("a1")
        assert rt.session_ids() == ("a1",) and rt.session("a1") is h.session and rt.session("x") is None
        assert (h.session_id, h.status, len(h.messages)) == ("a1", "idle", 0)
        # The status a listener hears is the one the handle reads.
        h.agent.hooks.on_status(lambda agent, status: statuses.append((status, h.status)))
        await h.run_turn("hi")
        assert statuses == [("running", "running"), ("idle", "idle")]
        roles = [m["role"] for m in h.messages]
        assert roles == ["user", "assistant"] and h.snapshot() is h.session.snapshot()


async def test_the_agent_handle_has_the_hooks_docs_agent_md_registers_on(tmp_path: Path) -> None:
    # docs/agent.md says agent.hooks.on_checkpoint(listener); the AgentHandle rt.create
    # returns had no .hooks (only handle.agent.hooks).
    points: list[tuple[str, int]] = []
    statuses: list[Status] = []
    async with harness.open_runtime(tmp_path, provider=ScriptedProvider([[Say("one")], [Say("two")]])) as rt:
        h = await rt.create("a")
        assert h.hooks is h.agent.hooks
        remove = h.hooks.on_checkpoint(lambda c: points.append((c.point, c.turn)))
        h.hooks.on_status(lambda agent, status: statuses.append(status))
        await h.run_turn("hi")
        assert points == [("step", 1), ("model-request", 1)] and statuses == ["running", "idle"]
        remove()
        await h.run_turn("again")
        assert points == [("step", 1), ("model-request", 1)]  # unsubscribed


# -- 2. registration APIs ----------------------------------------------------------------


async def test_store_listeners_each_return_an_unsubscribe() -> None:
    calls: list[str] = []
    async with open_store() as store:
        removers = [
            store.on_created(lambda h: calls.append(f"created {h.id}")),
            store.on_event(lambda h, e: calls.append(f"event {h.id} {e.seq}")),
            store.on_disposed(lambda h: calls.append(f"disposed {h.id}")),
            store.add_pre_commit_hook(lambda h, evs: calls.append(f"pre {h.id} {len(evs)}")),
            store.on_flush(lambda h: calls.append(f"flush {h.id}")),
        ]
        s = await store.create("s")
        await s.append("feedback/record", {})
        assert await s.flush() is True
        await store.detach(s)
        assert calls == ["created s", "pre s 1", "event s 0", "flush s", "disposed s"]
        for remove in removers:
            remove()
            remove()  # idempotent
        calls.clear()
        t = await store.create("t")
        await t.append("feedback/record", {})
        assert await t.flush() is False
        await store.detach(t)
        assert calls == []


async def test_agent_listeners_each_return_an_unsubscribe() -> None:
    calls: list[str] = []
    provider = ScriptedProvider([[Say("one")], [Say("two")]])
    async with harness.open_runtime(provider=provider) as rt:
        loop = rt.loop
        removers = [
            loop.on_created(lambda h: calls.append(f"created {h.id}")),
            loop.on_session_start(lambda h, source: calls.append(f"start {h.id} {source}")),
            loop.on_status(lambda h, status: calls.append(f"status {h.id} {status}")),
            loop.on_disposed(lambda h: calls.append(f"disposed {h.id}")),
        ]
        a = await rt.create("a")
        await a.run_turn("hi")
        await a.dispose()
        assert calls == ["created a", "start a startup", "status a running", "status a idle", "disposed a"]
        for remove in removers:
            remove()
        calls.clear()
        b = await rt.create("b")
        await b.run_turn("hi")
        await b.dispose()
        assert calls == []


async def test_async_listeners_are_refused_at_registration() -> None:
    async def listener(*args: Any) -> None:
        raise AssertionError("never called")

    async with harness.open_runtime(provider=ScriptedProvider([])) as rt:
        registrations: tuple[Any, ...] = (
            rt.loop.on_created,
            rt.loop.on_disposed,
            rt.loop.on_session_start,
            rt.loop.on_status,
            rt.warnings.subscribe,
        )
        for register in registrations:
            with pytest.raises(AsyncListenerError) as info:
                register(listener)
            assert info.value.code == "ASYNC_LISTENER"


async def test_an_agent_created_listener_vetoes_the_publication() -> None:
    async with harness.open_runtime(provider=ScriptedProvider([])) as rt:

        def veto(handle: AgentHandle) -> None:
            raise RuntimeError("no agents today")

        remove = rt.loop.on_created(veto)
        with pytest.raises(RuntimeError, match="no agents today"):
            await rt.create("a")
        assert rt.agents() == [] and rt.session_ids() == ()
        remove()
        assert (await rt.create("a")).id == "a"


# -- 2. the warnings channel -------------------------------------------------------------


async def test_contained_listener_failures_reach_the_warnings_channel_and_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reports: list[WarningReport] = []
    provider = ScriptedProvider([[Say("ok")]])
    async with harness.open_runtime(provider=provider) as rt:
        unsubscribe = rt.warnings.subscribe(reports.append)
        assert rt.warnings is rt.store.warnings

        def boom(*args: Any) -> None:
            raise RuntimeError("boom")

        rt.store.on_event(boom)
        rt.store.on_disposed(boom)
        rt.loop.on_disposed(boom)
        rt.loop.on_status(boom)
        h = await rt.create("a")
        with caplog.at_level(logging.WARNING):
            await h.run_turn("hi")
            n = len(reports)
            await h.dispose()
        by_source = {r.source for r in reports}
        assert by_source == {"session/event", "session/disposed", "agent/disposed", "agent/status"}
        assert all(r.kind == "listener-failed" and r.session_id == "a" for r in reports)
        assert all(isinstance(r.error, RuntimeError) and str(r.error) == "boom" for r in reports)
        event_report = next(r for r in reports if r.source == "session/event")
        assert event_report.message == 'session "a": session/event listener threw: RuntimeError: boom'
        logged = {r.getMessage() for r in caplog.records}
        assert {r.message for r in reports} <= logged  # every report was logged too

        unsubscribe()
        unsubscribe()
        reports.clear()
        h2 = await rt.create("b")
        await h2.session.append("feedback/record", {})
        assert reports == [] and n > 0


async def test_a_failing_warnings_subscriber_is_logged_and_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reports: list[str] = []
    async with open_store() as store:

        def broken(report: WarningReport) -> None:
            raise RuntimeError("subscriber bug")

        store.warnings.subscribe(broken)
        store.warnings.subscribe(lambda r: reports.append(r.source))

        def failing(handle: SessionHandle, event: Event) -> None:
            raise ZeroDivisionError("listener bug")

        store.on_event(failing)
        s = await store.create("s")
        with caplog.at_level(logging.WARNING):
            await s.append("feedback/record", {})
    assert reports == ["session/event"]
    assert any("a runtime warnings subscriber failed" in r.getMessage() for r in caplog.records)


class _FailingJsonl(JsonlBackend):
    """A JSONL backend whose writes fail while ``failing`` is set."""

    failing = False

    def materialize(self, *args: Any, **kwargs: Any) -> Any:
        if self.failing:
            raise OSError(28, "No space left on device")
        return super().materialize(*args, **kwargs)

    def append(self, *args: Any, **kwargs: Any) -> Any:
        if self.failing:
            raise OSError(28, "No space left on device")
        return super().append(*args, **kwargs)


async def test_a_background_write_failure_reaches_the_warnings_channel(tmp_path: Path) -> None:
    backend = _FailingJsonl(tmp_path / "sessions")
    reports: list[WarningReport] = []
    arrived = trio.Event()

    def on_warning(report: WarningReport) -> None:
        reports.append(report)
        arrived.set()

    async with harness.open_runtime(backend=backend, write_delay=0.001) as rt:
        rt.warnings.subscribe(on_warning)
        s = await rt.store.create("s")
        backend.failing = True
        await s.append("feedback/record", {"i": 0})
        await arrived.wait()  # the write-behind window fails in the background
        report = reports[0]
        assert (report.kind, report.source, report.session_id) == ("write-failed", "background-write", "s")
        assert "background write for session \"s\" failed" in report.message
        backend.failing = False
        await s.flush()  # the retained events land
    assert [r["data"]["i"] for r in JsonlBackend(tmp_path / "sessions").load("s").records] == [0]


async def test_a_snapshot_is_frozen() -> None:
    async with open_store() as store:
        snap = (await store.create()).snapshot()
        with pytest.raises(AttributeError):
            snap.generation = 3  # type: ignore[misc]


async def test_a_failed_retirement_reaches_the_warnings_channel(tmp_path: Path) -> None:
    backend = _FailingJsonl(tmp_path / "sessions")
    reports: list[WarningReport] = []
    retired = trio.Event()

    def on_warning(report: WarningReport) -> None:
        reports.append(report)
        if report.source == "retirement":
            retired.set()

    async with harness.open_runtime(backend=backend, write_delay=60) as rt:
        rt.warnings.subscribe(on_warning)
        s = await rt.store.create("s")
        await s.append("feedback/record", {"i": 0})
        backend.failing = True
        await rt.store.detach(s)  # the writer retires in the background, and fails
        await retired.wait()
        report = next(r for r in reports if r.source == "retirement")
        assert (report.kind, report.session_id) == ("write-failed", "s")
        assert 'session "s" retirement failed' in report.message and report.error is not None
        backend.failing = False  # leaving the block retries the retained events
    assert [r["data"]["i"] for r in JsonlBackend(tmp_path / "sessions").load("s").records] == [0]


# -- 3. single events: type guards, snapshot/adopt, the stored-record decoder -----------


def _chunk(seq: int, text: str) -> dict[str, Any]:
    return {
        "type": "assistant/chunk",
        "seq": seq,
        "time": 100 + seq,
        "data": {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": text}},
    }


async def test_the_type_guards_of_the_reference() -> None:
    async with open_store() as store:
        s = await store.create()
        a = await s.append("user/message", user("a"), surface_op="append")
        log_only = await s.append("feedback/record", {})
        r = await s.commit_replace(s.surface(), "user/message", user("r"), surface_op=ReplaceOp(0, 0), source_event_seqs=[0])
    assert [is_surface_eligible_type(t) for t in ("user/message", "assistant/message", "tool/result")] == [True] * 3
    assert not is_surface_eligible_type("turn/start") and not is_surface_eligible_type(["user/message"])
    for ev in (a, event_to_record(a)):
        assert is_surface_event(ev) and is_append_surface_event(ev) and not is_replacement_surface_event(ev)
    for ev in (r, event_to_record(r)):
        assert is_surface_event(ev) and is_replacement_surface_event(ev) and not is_append_surface_event(ev)
    for ev in (log_only, event_to_record(log_only), {"type": "user/message", "seq": 0, "time": 0, "data": {}}):
        assert not (is_surface_event(ev) or is_append_surface_event(ev) or is_replacement_surface_event(ev))


def test_adopt_event_takes_the_record_without_a_copy() -> None:
    record = {"type": "user/message", "seq": 3, "time": 7, "data": user("m"), "surfaceOp": "append"}
    ev = adopt_event(record)
    assert (ev.type, ev.seq, ev.time, ev.surface_op, ev.source_event_seqs) == ("user/message", 3, 7, "append", None)
    assert raw_of(ev.data) is record["data"]  # ownership transferred, not copied
    with pytest.raises(EventError, match="session event at seq 3 lacks an identified message"):
        adopt_event({"type": "user/message", "seq": 3, "time": 7, "data": {"role": "user"}, "surfaceOp": "append"})
    with pytest.raises(EventError, match="invalid event envelope"):
        adopt_event({"type": "x", "seq": -1, "time": 0, "data": None})
    with pytest.raises(EventError, match="invalid event envelope"):
        adopt_event({"type": "x", "seq": 0, "time": 0, "data": None, "extra": 1})
    with pytest.raises(SurfaceError, match="invalid replace surfaceOp"):
        adopt_event({"type": "user/message", "seq": 4, "time": 0, "data": user(), "surfaceOp": {"op": "replace"}})
    with pytest.raises(SurfaceError, match="must reference earlier events: 4 >= current seq 4"):
        adopt_event(
            {"type": "user/message", "seq": 4, "time": 0, "data": user(), "surfaceOp": "append", "sourceEventSeqs": [4]}
        )
    ignorable = adopt_event({"type": "plugin/thing", "seq": 0, "time": 0, "data": None, "ignorable": True})
    assert ignorable.ignorable and ignorable.data is None


def test_snapshot_event_copies_what_it_borrows() -> None:
    record: dict[str, Any] = {"type": "user/message", "seq": 0, "time": 1, "data": user("m", "before")}
    record["surfaceOp"] = "append"
    ev = snapshot_event(record)
    record["data"]["content"][0]["text"] = "after"
    record["data"]["id"] = "changed"
    data = thaw(ev.data)
    assert data["id"] == "m" and data["content"][0]["text"] == "before"
    assert snapshot_event(ev) is ev  # an Event is immutable already
    with pytest.raises(EventError, match="not losslessly JSON-serializable"):
        snapshot_event({"type": "x", "seq": 0, "time": 0, "data": {"n": float("nan")}})
    with pytest.raises(EventError, match="not losslessly JSON-serializable"):
        snapshot_event({"type": "x", "seq": 0, "time": 0, "data": {1, 2}})
    with pytest.raises(EventError, match="takes an Event or a record"):
        snapshot_event(["user/message"])  # type: ignore[arg-type]
    bad = Event("assistant/message", 0, 0, {"message": {"id": "a", "role": "user"}}, "append")
    with pytest.raises(EventError, match='session event at seq 0 message must have role "assistant"'):
        snapshot_event(bad)


async def test_record_to_event_inverts_event_to_record() -> None:
    async with open_store() as store:
        s = await store.create()
        await s.append("user/message", user("a"), surface_op="append")
        await s.append("turn/start", {"turn": 1})
        await s.commit_replace(s.surface(), "user/message", user("r"), surface_op=ReplaceOp(0, 0), source_event_seqs=[0])
        events = list(s.snapshot().events)
    for ev in events:
        line = orjson.dumps(event_to_record(ev))
        assert record_to_event(line) == ev
        assert record_to_event(line.decode()) == ev
        assert record_to_event(orjson.loads(line)) == ev
    for bad, match in (
        (b"{", "not valid JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"type": "x"}', "invalid event envelope"),
    ):
        with pytest.raises(EventError, match=match):
            record_to_event(bad)


def test_storage_records_decode_to_events_and_chunk_rows_expand() -> None:
    chunks = [_chunk(i, t) for i, t in enumerate(("a", "b", "c", "d"))]
    (row,) = pack_chunk_runs(chunks)
    assert row["type"] == "text-chunks"
    with pytest.raises(EventError, match="packed chunk row"):
        record_to_event(orjson.dumps(row))
    expanded = storage_record_to_events(orjson.dumps(row))
    assert expanded == [adopt_event(orjson.loads(orjson.dumps(c))) for c in chunks]
    assert storage_record_to_events(chunks[0]) == [adopt_event(_chunk(0, "a"))]
    with pytest.raises(StorageRowError) as info:
        storage_record_to_events({**row, "seq0": -1})
    assert info.value.code == "MALFORMED_STORAGE_ROW"


# -- a cancellation at every step: snapshots agree with what the caller was told ----------


def test_snapshots_agree_with_the_append_outcome_under_cancellation_at_every_step() -> None:
    """Cancelled means not applied, returned means applied (decision 0007): the snapshot
    taken after the call agrees, a held snapshot never moves, and a listener always reads
    a snapshot that holds the event it hears."""
    from harness.faults import Probe, explore

    async def scenario(probe: Probe) -> None:
        async with open_store() as store:
            s = await store.create("s")
            await s.append("user/message", user("m0"), surface_op="append")
            held = s.snapshot()

            def on_event(handle: SessionHandle, event: Event) -> None:
                snap = handle.snapshot()
                probe.check(snap.seq > event.seq and snap.events[event.seq] == event, "a listener's snapshot lacks its event")
                probe.check(len(snap.messages) == len(snap.surface), "a listener's snapshot mixes two states")

            store.on_event(on_event)
            returned: list[Event] = []
            with trio.CancelScope() as caller:
                probe.canceller("caller", caller.cancel)
                probe.arm()
                returned.append(await s.append("user/message", user("m1"), surface_op="append"))
                returned.append(
                    await s.commit_replace(
                        s.surface(), "user/message", user("sum"), surface_op=ReplaceOp(0, 1), source_event_seqs=[0, 1]
                    )
                )
            probe.disarm()
            await s.barrier()  # anything the actor took is committed now
            now = s.snapshot()
            probe.check(now.seq == held.seq + len(returned), f"{len(returned)} returned, snapshot at {now.seq}")
            probe.check(list(now.events[held.seq :]) == returned, "the snapshot disagrees with the returned events")
            probe.check((held.seq, held.generation, tuple(held.surface)) == (1, 0, (0,)), "a held snapshot moved")
            probe.check(now.generation == (1 if len(returned) == 2 else 0), "generation disagrees with the replace")

    report = explore(scenario, name="snapshot-append")
    assert report.ok, report.distinct()
    assert report.steps["caller"] >= 4, report.steps
