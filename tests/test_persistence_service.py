"""The persistence service without a live session (reference §2.1, §2.3, §2.8):
create/append with adoption, inspect, read_from, list_snapshots, locate, read_raw."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from harness.errors import (
    FlushError,
    PersistedSessionNotFoundError,
    PersistenceArgumentError,
    PersistenceError,
    RawArtifactsUnsupportedError,
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    SessionLiveError,
    SessionLogExistsError,
    SessionTrackedError,
)
from harness.persistence import JsonlBackend, SqliteBackend, open_persistence
from harness.runtime import open_store
from harness.session import thaw
from tests.helpers import assistant, tool_call_block, user


def meta(sid: str = "s", **extra: Any) -> dict[str, Any]:
    return {"version": 0, "id": sid, "createdAt": 5, **extra}


def ev(seq: int, type_: str = "user/message", data: Any = None, **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"type": type_, "seq": seq, "time": 100 + seq, "data": user(f"m{seq}") if data is None else data}
    if type_ == "user/message" and "surfaceOp" not in extra:
        rec["surfaceOp"] = "append"
    rec.update(extra)
    return rec


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_create_is_lazy_and_append_writes(tmp_path: Path, kind: str) -> None:
    backend = JsonlBackend(tmp_path) if kind == "jsonl" else SqliteBackend(tmp_path / "db.sqlite")
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            await p.create(meta(cwd="/w"))
            assert await p.list() == []  # nothing on disk yet
            await p.append("s", [])  # an empty batch keeps it lazy
            assert await p.list() == []
            await p.append("s", [ev(0), ev(1)])
            await p.append("s", [ev(2)])
            assert [h["id"] for h in await p.list()] == ["s"]
            seen = await p.inspect("s")
            assert seen.meta["createdAt"] == 5 and seen.meta["cwd"] == "/w"
            assert [e["seq"] for e in seen.events] == [0, 1, 2]
            assert [e["seq"] for e in await p.read_from("s", 1)] == [1, 2]
            assert await p.read_from("s", 3) == ()
            with pytest.raises(PersistenceError, match=r'^append seq mismatch for "s": expected 3 at index 0, got 4$'):
                await p.append("s", [ev(4)])
            snapshots = await p.list_snapshots()
            assert [len(x.events) for x in snapshots] == [3]
    finally:
        if isinstance(backend, SqliteBackend):
            backend.close()


async def test_create_refusals(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        with pytest.raises(PersistenceArgumentError, match=r"^session metadata must be losslessly JSON-serializable$"):
            await p.create({"version": 0, "id": "x", "createdAt": 1, "bad": object()})
        with pytest.raises(
            PersistenceArgumentError, match=r"^session metadata createdAt must be a non-negative safe integer$"
        ):
            await p.create({"version": 0, "id": "x", "createdAt": -1})
        await p.create(meta("a"))
        with pytest.raises(SessionTrackedError, match=r'^session "a" already exists in this backend$') as info:
            await p.create(meta("a"))
        assert info.value.code == "SESSION_ALREADY_EXISTS"
        live = await store.create("b")
        with pytest.raises(SessionTrackedError):
            await p.create(meta("b"))
        await live.append("user/message", user(), surface_op="append")
        await live.flush()
        await store.detach(live)
        await p.wait_retired("b")
        with pytest.raises(
            SessionLogExistsError,
            match=r'^session "b" already has a persisted log on disk; load/resume it instead of creating$',
        ):
            await p.create(meta("b"))


async def test_append_refusals_and_adoption_with_durable_repair(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        with pytest.raises(PersistenceArgumentError, match=r"not losslessly JSON-serializable"):
            await p.append("s", [{"type": "user/message", "seq": 0, "time": 1, "data": {1, 2}}])
        with pytest.raises(PersistedSessionNotFoundError):
            await p.append("nobody", [ev(0)])
        with pytest.raises(SessionFormatUnsupportedError, match=r"unsupported legacy request/header-delta format at seq 0"):
            await p.append("s", [ev(0, "request/header-delta", {})])
        # A stored session left with an open turn (a crash): adoption repairs it durably first.
        live = await store.create("c")
        await live.append("turn/start", {"turn": 1})
        await live.flush()
        await store.detach(live)
        await p.wait_retired("c")
        stored = await p.inspect("c")
        assert [e["type"] for e in stored.events][-1] == "turn/end"  # the closer, not written
        n = len(stored.events)
        await p.append("c", [ev(n)])
        again = await p.read_from("c", 0)
        assert [e["type"] for e in again] == [e["type"] for e in stored.events] + ["user/message"]
        live2 = await store.create("d")
        with pytest.raises(SessionLiveError, match=r'^cannot append session "d" while it is live'):
            await p.append("d", [ev(0)])
        del live2


async def test_inspect_never_changes_storage(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        live = await store.create("t", cwd="/w")
        await live.append("turn/start", {"turn": 1})
        await live.flush()
        seen_live = await p.inspect("t")
        assert [e["type"] for e in seen_live.events] == ["turn/start"]
        await store.detach(live)
        await p.wait_retired("t")
        path = p.backend.locate("t")  # type: ignore[attr-defined]
        before = Path(path).read_bytes()
        seen = await p.inspect("t")
        assert [e["type"] for e in seen.events] == ["turn/start", "turn/end"]
        assert thaw(seen.events[-1]["data"])["reason"] == {"kind": "interrupted"}
        assert Path(path).read_bytes() == before  # no repair written
        assert await p.read_raw("t") == before
        assert p.supports_raw_artifacts
        assert p.locate(meta("t", cwd="/w")) == str(path)
        with pytest.raises(PersistenceArgumentError, match=r"^readFrom fromSeq must be a non-negative safe integer, got -1$"):
            await p.read_from("t", -1)
        with pytest.raises(PersistedSessionNotFoundError):
            await p.read_raw("nobody")


async def test_sqlite_has_no_raw_artifacts(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "db.sqlite")
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            assert not p.supports_raw_artifacts
            with pytest.raises(RawArtifactsUnsupportedError, match=r"^this session persistence backend does not expose raw artifacts$"):
                await p.read_raw("x")
            assert p.locate(meta("x")) == str((tmp_path / "db.sqlite").resolve())
    finally:
        backend.close()


async def test_a_second_prepare_waits_for_the_first(tmp_path: Path) -> None:
    import trio.testing

    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        live = await store.create("w")
        await live.append("user/message", user(), surface_op="append")
        await live.flush()
        await store.detach(live)
        await p.wait_retired("w")
        first = await p.prepare("w")
        got: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def second() -> None:
                got.append(await p.prepare("w"))

            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # waiting, not refused
            await first.dispose()
        assert got[0].session.id == "w"
        await got[0].dispose()
        # A waiter is cancellable; a published first makes it "live".
        first = await p.prepare("w")
        with trio.move_on_after(0.05) as scope:
            await p.prepare("w")
        assert scope.cancelled_caught
        handle = await p.publish(first)
        with pytest.raises(SessionLiveError, match=r'^cannot prepare session "w" while it is live$'):
            await p.prepare("w")
        await store.detach(handle)


async def test_flush_drains_events_enqueued_while_it_runs(tmp_path: Path) -> None:
    import threading

    import trio

    backend = JsonlBackend(tmp_path)
    writing, release = threading.Event(), threading.Event()
    materialize = backend.materialize

    def slow_materialize(*args: Any, **kwargs: Any) -> None:
        writing.set()
        release.wait(5)
        materialize(*args, **kwargs)

    backend.materialize = slow_materialize  # type: ignore[method-assign]
    async with open_store() as store, open_persistence(store, backend, write_delay=10) as p:
        s = await store.create("f")
        await s.append("user/message", user("a"), surface_op="append")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.flush)
            nursery.start_soon(s.flush)  # a second caller shares the barrier
            await trio.to_thread.run_sync(writing.wait)
            await s.append("user/message", user("b"), surface_op="append")  # lands during the write
            release.set()
        # Both flushes returned: the event enqueued during the write is durable too.
        assert [e["seq"] for e in await p.read_from("f", 0)] == [0, 1]
        await store.detach(s)


async def test_a_live_session_claims_an_envelope_session_whose_log_it_reproduces(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        await p.create(meta("k", cwd="/w"))
        records = [ev(0), ev(1)]
        await p.append("k", records)
        # A fresh empty session with that id is refused at its creation (publication vetoed).
        with pytest.raises(
            SessionLogExistsError,
            match=r'^session "k" is already persisted with 2 event\(s\) that do not match this live session \(id collision\)$',
        ):
            await store.create("k", cwd="/w")
        assert await store.get("k") is None
        with pytest.raises(SessionLogExistsError, match=r"at a different cwd \(persisted: /w, live: /x\) \(id collision\)$"):
            await store.create("k", cwd="/x", seed=records)
        # A seed that reproduces the stored log claims it: only the rest is written.
        live = await store.create("k", cwd="/w", seed=records)
        await live.append("user/message", user("more"), surface_op="append")
        await live.flush()
        stored = await p.read_from("k", 0)
        assert [e["seq"] for e in stored] == [0, 1, 2, 3]
        assert [e["type"] for e in stored][2:] == ["session/end-seed", "user/message"]
        await store.detach(live)
        await p.wait_retired("k")
        assert (await p.inspect("k")).meta["createdAt"] == 5  # the stored header wins


async def test_inspect_shows_the_closers_of_an_unanswered_call(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        live = await store.create("u")
        await live.append("turn/start", {"turn": 1})
        await live.append("step/start", {"turn": 1, "step": 1})
        await live.append("assistant/message", assistant(1, 1, "a1", [tool_call_block("c1")]), surface_op="append")
        await live.append("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "read", "arguments": "{}"})
        await live.flush()
        await store.detach(live)
        await p.wait_retired("u")
        seen = await p.inspect("u")
        closer = seen.events[4]
        assert closer["type"] == "tool/result" and list(closer["sourceEventSeqs"]) == [3]
        assert [s.events[-1]["type"] for s in await p.list_snapshots()] == ["turn/end"]


async def test_a_log_that_does_not_read_can_be_deleted(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        live = await store.create("bad")
        await live.append("turn/start", {"turn": 1})
        await live.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        await live.flush()
        await store.detach(live)
        await p.wait_retired("bad")
        path = Path(p.backend.locate("bad"))  # type: ignore[attr-defined]
        lines = path.read_bytes().splitlines(keepends=True)
        path.write_bytes(lines[0] + b"{not json\n" + b"".join(lines[1:]))  # corrupt before a turn/end
        with pytest.raises(SessionCorruptionError):
            await p.inspect("bad")
        await p.delete("bad")
        assert not path.exists() and await p.list() == []


async def test_cold_inspections_share_one_read_and_an_lru(tmp_path: Path) -> None:
    import trio.testing

    backend = JsonlBackend(tmp_path)
    loads: list[str] = []
    load = backend.load

    def counted(session_id: str) -> Any:
        loads.append(session_id)
        return load(session_id)

    backend.load = counted  # type: ignore[method-assign]
    with pytest.raises(ExceptionGroup) as bad:  # raised inside the store's block
        async with open_store() as store, open_persistence(store, backend, prepared_session_cache_size=0):
            pass
    assert bad.group_contains(
        PersistenceArgumentError, match=r"^prepared_session_cache_size must be a positive integer, got 0$"
    )
    async with open_store() as store, open_persistence(store, backend, prepared_session_cache_size=2) as p:
        for sid in ("a", "b", "c"):
            await p.create(meta(sid))
            await p.append(sid, [ev(0)])
        loads.clear()
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(p.inspect, "a")
        assert loads == ["a"]  # three concurrent inspections, one backend read
        await p.inspect("a")
        assert loads == ["a"]  # reused: the stored revision did not move
        await p.append("a", [ev(1)])
        assert [e["seq"] for e in (await p.inspect("a")).events] == [0, 1]
        assert loads == ["a", "a"]  # a durable append moved the revision: read again
        await p.inspect("b")
        await p.inspect("c")  # the LRU holds two: "a" is evicted
        loads.clear()
        await p.inspect("a")
        assert loads == ["a"]
        # A cancelled observer stops waiting; the read still completes and fills the cache.
        await p.append("b", [ev(1)])
        loads.clear()
        with trio.move_on_after(0) as scope:
            await p.inspect("b")
        assert scope.cancelled_caught
        await trio.testing.wait_all_tasks_blocked()
        await p.inspect("b")
        assert loads == ["b"]


async def test_a_live_session_adopts_a_stored_log_its_seed_continues(tmp_path: Path) -> None:
    # Reference §2.4 case 3 (HMR adoption): a stored id not tracked by this persistence.
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        first = await store.create("h", cwd="/w")
        await first.append("turn/start", {"turn": 1})  # left open: adoption adds no closers
        await first.flush()
        records = [dict(r) for r in await p.read_from("h", 0)]
        await store.detach(first)
        await p.wait_retired("h")
    path = Path(JsonlBackend(tmp_path).locate("h") or "")
    with path.open("ab") as f:
        f.write(b'{"type":"user/mess')  # a torn tail
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        live = await store.create("h", cwd="/w", seed=[thaw(r) for r in records])
        await live.append("user/message", user("next"), surface_op="append")
        await live.flush()
        stored = await p.read_from("h", 0)
        assert [e["type"] for e in stored] == ["turn/start", "session/end-seed", "user/message"]
        await store.detach(live)
        await p.wait_retired("h")
    # A live log that does not continue the stored one is refused at its first write
    # (and its events are reported again when the persistence closes).
    async with open_store() as store:
        with pytest.raises(PersistenceError, match="closing failed"):
            async with open_persistence(store, JsonlBackend(tmp_path)):
                other = await store.create("h", cwd="/w")
                await other.append("user/message", user("unrelated"), surface_op="append")
                with pytest.raises(FlushError) as info:
                    await other.flush()
                assert isinstance(info.value.__cause__, SessionLogExistsError)
                assert str(info.value.__cause__) == (
                    'session "h" already has a persisted log on disk that does not match this live '
                    "session (id collision)"
                )


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_a_stale_append_gets_the_stale_writer_refusal_not_a_seq_mismatch(tmp_path: Path, kind: str) -> None:
    # Issue 24 §4: another process appended since this persistence's last append;
    # a batch continuing the stored log (seq 3) must be refused as stale, with the
    # storage-level refusal, not the generic PERSISTENCE_ERROR of a caller's mismatch.
    def backend() -> Any:
        return JsonlBackend(tmp_path) if kind == "jsonl" else SqliteBackend(tmp_path / "db.sqlite")

    a, b = backend(), backend()
    try:
        async with open_store() as store, open_persistence(store, a) as pa:
            await pa.create(meta())
            await pa.append("s", [ev(0), ev(1)])
            async with open_store() as other, open_persistence(other, b) as pb:
                await pb.append("s", [ev(2)])  # adopted from storage, continued
            with pytest.raises(SessionLogExistsError, match="another process wrote it") as info:
                await pa.append("s", [ev(3)])
            assert info.value.code == "SESSION_LOG_EXISTS"
            assert [e["seq"] for e in await pa.read_from("s", 0)] == [0, 1, 2]
    finally:
        for x in (a, b):
            if isinstance(x, SqliteBackend):
                x.close()


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_list_snapshots_carry_the_revision_and_read_from_can_return_the_meta(tmp_path: Path, kind: str) -> None:
    # Reference §2.7/§2.8: every stored read carries the revision of exactly those
    # bytes; readFrom's caller may want the header too (issue 24 §4).
    backend = JsonlBackend(tmp_path) if kind == "jsonl" else SqliteBackend(tmp_path / "db.sqlite")
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            await p.create(meta(cwd="/w"))
            await p.append("s", [ev(0), ev(1)])
            (snap,) = await p.list_snapshots()
            assert snap.revision is not None and snap.revision == backend.revision("s")
            view = await p.read_from("s", 1, with_meta=True)
            assert view.meta["id"] == "s" and view.meta["cwd"] == "/w" and view.meta["createdAt"] == 5
            assert [e["seq"] for e in view.events] == [1] and view.revision == snap.revision
            assert [e["seq"] for e in await p.read_from("s", 1)] == [1]  # the plain form is unchanged
            await p.append("s", [ev(2)])
            (moved,) = await p.list_snapshots()
            assert moved.revision == backend.revision("s") != snap.revision
    finally:
        if isinstance(backend, SqliteBackend):
            backend.close()


async def test_an_absent_cwd_in_the_cwd_collision_reads_undefined(tmp_path: Path) -> None:
    # The reference's template writes an absent cwd as "undefined" (not Python's None).
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        await p.create(meta("k", cwd="/w"))
        await p.create(meta("n"))
        with pytest.raises(SessionLogExistsError, match=r"\(persisted: /w, live: undefined\) \(id collision\)$"):
            await store.create("k")
        with pytest.raises(SessionLogExistsError, match=r"\(persisted: undefined, live: /x\) \(id collision\)$"):
            await store.create("n", cwd="/x")


@pytest.mark.parametrize(
    ("from_seq", "shown"), [("5", "5"), (True, "true"), (None, "null"), ([1, 2], "1,2"), (1.5, "1.5"), (2.0, "2.0")]
)
async def test_read_from_refusal_shows_the_value_as_string_does(tmp_path: Path, from_seq: Any, shown: str) -> None:
    # The reference's `got ${fromSeq}`, not Python's repr ('5', True, None, [1, 2]); an
    # integral float shows its fraction (only this port refuses it).
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        with pytest.raises(
            PersistenceArgumentError, match=rf"^readFrom fromSeq must be a non-negative safe integer, got {re.escape(shown)}$"
        ):
            await p.read_from("t", from_seq)
