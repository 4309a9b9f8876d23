"""``Persistence.load(id)`` as the reference's §2.8: a cold load commits the crash repair
durably and leaves the id ownerless (a reproducing live seed claims it, any other live
session with that id is vetoed); a live load flushes and refuses an open turn."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from harness.errors import (
    PersistedSessionNotFoundError,
    PersistenceError,
    SessionFormatUnsupportedError,
    SessionLiveError,
    SessionLogExistsError,
    SessionTrackedError,
)
from harness.faults import Probe, explore, explore_io
from harness.faults._backends import check_at_rest, close_backend, make_backend, plain_backend
from harness.persistence import JsonlBackend, Persistence, open_persistence
from harness.runtime import open_store
from harness.session import event_to_record, thaw
from tests.helpers import assistant, tool_call_block, user

KINDS = ["jsonl", "sqlite"]
SID = "s"
#: The crash-repair closers of the log :func:`write_open_turn` leaves.
CLOSERS = ["tool/result", "step/end", "turn/end"]


@asynccontextmanager
async def opened(root: Path, kind: str) -> AsyncIterator[Persistence]:
    """A store and a persistence over a fresh (plain) backend at ``root``."""
    backend = plain_backend(root, kind)
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            yield p
    finally:
        close_backend(backend)


def write_open_turn(root: Path, kind: str) -> list[dict[str, Any]]:
    """Store a session ``s`` (cwd ``/w``) that a crash left inside a turn with an
    unanswered tool call, and a torn final write after it. Returns the complete
    stored records."""
    records: list[dict[str, Any]] = [
        {"type": "user/message", "seq": 0, "time": 10, "data": user("hello"), "surfaceOp": "append"},
        {"type": "turn/start", "seq": 1, "time": 11, "data": {"turn": 1}},
        {"type": "step/start", "seq": 2, "time": 12, "data": {"turn": 1, "step": 1}},
        {
            "type": "assistant/message",
            "seq": 3,
            "time": 13,
            "data": assistant(1, 1, "a1", [tool_call_block("c1")]),
            "surfaceOp": "append",
        },
    ]
    header = {"version": 0, "id": SID, "createdAt": 7, "cwd": "/w"}
    store_log(root, kind, header, records)
    tear(root, kind, len(records))
    return [thaw(r) for r in stored(root, kind)[0]]


def store_log(root: Path, kind: str, header: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Write ``records`` as session ``s``'s stored log, under its writer lock, with a plain backend."""
    backend = plain_backend(root, kind)
    try:
        lease = backend.acquire_writer(header)
        try:
            backend.materialize(header, [dict(r) for r in records], lease=lease)
        finally:
            lease.release()
    finally:
        close_backend(backend)


def tear(root: Path, kind: str, next_seq: int) -> None:
    """Leave a torn final write behind the stored log (a crash during a write)."""
    backend = plain_backend(root, kind)
    try:
        if isinstance(backend, JsonlBackend):
            with Path(backend.locate(SID) or "").open("ab") as f:
                f.write(b'{"type":"user/mess')
        else:
            db = sqlite3.connect(backend.path)
            with db:
                db.execute(
                    "INSERT INTO events VALUES (?, ?, 'x', 0, '{not json', NULL, NULL, NULL)", (SID, next_seq)
                )
            db.close()
    finally:
        close_backend(backend)
    assert stored(root, kind)[1] is not None  # the tail does not read: a repair is due


def stored(root: Path, kind: str) -> tuple[list[dict[str, Any]], int | None, str | None]:
    """What a fresh backend reads: the records, the torn-tail mark, the revision."""
    backend = plain_backend(root, kind)
    try:
        log = backend.load(SID)
        return [thaw(r) for r in log.records], log.truncate_to, backend.revision(SID)
    finally:
        close_backend(backend)


def types(records: Any) -> list[str]:
    return [r["type"] for r in records]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cold_load_commits_the_repair_of_a_torn_log(tmp_path: Path, kind: str) -> None:
    old = write_open_turn(tmp_path, kind)
    revision = stored(tmp_path, kind)[2]
    async with opened(tmp_path, kind) as p:
        loaded = await p.load(SID)
        after, torn, moved = stored(tmp_path, kind)
        # The repair is durable: the torn tail is gone, the closers are on disk, the
        # revision moved; the loaded session is that log (plus its new end-seed).
        assert torn is None and moved != revision
        assert after[: len(old)] == old and types(after[len(old) :]) == CLOSERS
        assert after[-1]["data"]["reason"] == {"kind": "interrupted"}
        assert [thaw(event_to_record(e)) for e in loaded.events][:-1] == after
        assert loaded.events[-1].type == "session/end-seed" and loaded.header.cwd == "/w"
        # Nothing is left to repair: inspect shows the stored log as it is.
        assert [thaw(e) for e in (await p.inspect(SID)).events] == after
    if kind == "jsonl":
        lines = Path(JsonlBackend(tmp_path / "jsonl").locate(SID) or "").read_bytes().splitlines()
        assert [orjson.loads(x)["type"] for x in lines[1:]] == types(after)  # no torn bytes left


@pytest.mark.parametrize("kind", KINDS)
async def test_a_balanced_log_loads_without_a_write(tmp_path: Path, kind: str) -> None:
    async with opened(tmp_path, kind) as p:
        s = await p.store.create(SID, cwd="/w")
        await s.append("turn/start", {"turn": 1})
        await s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        await s.flush()
        await p.store.detach(s)
    before = stored(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        await p.load(SID)
        assert stored(tmp_path, kind) == before  # same records, same revision
        with pytest.raises(SessionLogExistsError, match=r"with 2 event\(s\) that do not match"):
            await p.store.create(SID, cwd="/w")  # but the id is held all the same


@pytest.mark.parametrize("kind", KINDS)
async def test_the_loaded_log_is_claimed_by_a_live_seed_that_reproduces_it(tmp_path: Path, kind: str) -> None:
    old = write_open_turn(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        loaded = await p.load(SID)
        repaired = len(old) + len(CLOSERS)
        # Publishing the loaded session claims the ownerless state: only its new
        # end-seed and what follows are written.
        handle = await p.store.enter(await p.store.adopt(loaded))
        await p.store.announce(handle)
        await handle.append("user/message", user("again"), surface_op="append")
        await handle.flush()
        after = stored(tmp_path, kind)[0]
        assert after[:repaired] == [thaw(event_to_record(e)) for e in loaded.events][:repaired]
        assert types(after[repaired:]) == ["session/end-seed", "user/message"]
        await p.store.detach(handle)
        await p.wait_retired(SID)
        # The claim consumed the ownerless state: the id is a stored log again.
        with pytest.raises(SessionLogExistsError, match=r"already has a persisted log on disk; load/resume it"):
            await p.create({"version": 0, "id": SID, "createdAt": 1, "cwd": "/w"})
    async with opened(tmp_path, kind) as p:
        await p.load(SID)
        # A seed given by records claims it too (content equality), and the stored
        # header wins over the live one.
        seed = stored(tmp_path, kind)[0]
        live = await p.store.create(SID, cwd="/w", seed=seed)
        await live.append("user/message", user("third"), surface_op="append")
        await live.flush()
        assert types(stored(tmp_path, kind)[0][len(seed) :]) == ["session/end-seed", "user/message"]
        await p.store.detach(live)
        await p.wait_retired(SID)
        assert (await p.inspect(SID)).meta["createdAt"] == loaded.header.created_at


@pytest.mark.parametrize("kind", KINDS)
async def test_other_live_sessions_with_a_loaded_id_are_refused(tmp_path: Path, kind: str) -> None:
    old = write_open_turn(tmp_path, kind)
    n = len(old) + len(CLOSERS)
    async with opened(tmp_path, kind) as p:
        await p.load(SID)
        repaired = stored(tmp_path, kind)[0]
        mismatch = rf'^session "s" is already persisted with {n} event\(s\) that do not match this live session \(id collision\)$'
        with pytest.raises(SessionLogExistsError, match=mismatch) as info:
            await p.store.create(SID, cwd="/w")  # a fresh empty session
        assert info.value.code == "SESSION_LOG_EXISTS"
        changed = [dict(r) for r in repaired]
        changed[0] = {**changed[0], "data": user("not what was said")}
        with pytest.raises(SessionLogExistsError, match=mismatch):
            await p.store.create(SID, cwd="/w", seed=changed)
        with pytest.raises(
            SessionLogExistsError,
            match=r'^session "s" is already persisted at a different cwd \(persisted: /w, live: /x\) \(id collision\)$',
        ):
            await p.store.create(SID, cwd="/x", seed=repaired)
        with pytest.raises(SessionTrackedError, match=r'^session "s" already exists in this backend$'):
            await p.create({"version": 0, "id": SID, "createdAt": 1})
        assert await p.store.get(SID) is None  # every creation was vetoed
        assert stored(tmp_path, kind)[0] == repaired  # and none of them wrote
        # The ownerless id still takes envelope appends from where the repair ended.
        await p.append(SID, [{"type": "feedback/record", "seq": n, "time": 1, "data": {"ok": True}}])
        assert types(stored(tmp_path, kind)[0][n:]) == ["feedback/record"]


@pytest.mark.parametrize("kind", KINDS)
async def test_concurrent_loads_commit_the_repair_once(tmp_path: Path, kind: str) -> None:
    old = write_open_turn(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        got: list[Any] = []

        async def load() -> None:
            got.append(await p.load(SID))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(load)
            nursery.start_soon(load)
        assert types(stored(tmp_path, kind)[0][len(old) :]) == CLOSERS
        assert [e.seq for e in got[0].events] == [e.seq for e in got[1].events]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_prepare_after_a_load_owns_the_id(tmp_path: Path, kind: str) -> None:
    write_open_turn(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        await p.load(SID)
        prep = await p.prepare(SID)
        assert prep.repaired == 0  # the load already made the repair durable
        handle = await p.publish(prep)
        await handle.flush()
        await p.store.detach(handle)
        await p.wait_retired(SID)
        # The resumed session owned the id: no stale ownerless state is left behind.
        with pytest.raises(SessionLogExistsError, match=r"load/resume it instead of creating$"):
            await p.create({"version": 0, "id": SID, "createdAt": 1, "cwd": "/w"})


@pytest.mark.parametrize("kind", KINDS)
async def test_a_live_load_flushes_and_refuses_an_open_turn(tmp_path: Path, kind: str) -> None:
    async with opened(tmp_path, kind) as p:
        empty = await p.store.create("e")
        with pytest.raises(PersistedSessionNotFoundError, match=r'^session "e" not found$'):
            await p.load("e")  # live with no event
        with pytest.raises(PersistedSessionNotFoundError, match=r'^session "nobody" not found$'):
            await p.load("nobody")
        await p.store.detach(empty)
        # A live session claiming an envelope log: its stored header (createdAt 5) wins.
        await p.create({"version": 0, "id": SID, "createdAt": 5, "cwd": "/w"})
        seed = [{"type": "user/message", "seq": 0, "time": 1, "data": user("m0"), "surfaceOp": "append"}]
        await p.append(SID, seed)
        live = await p.store.create(SID, cwd="/w", seed=seed)
        await live.append("turn/start", {"turn": 1})
        with pytest.raises(
            SessionLiveError,
            match=r'^cannot load session "s" while its live turn is open; use the live Session or wait for the '
            r"turn to close$",
        ) as info:
            await p.load(SID)
        assert info.value.code == "SESSION_LIVE"
        # It flushed before refusing.
        assert types(await p.read_from(SID, 0)) == ["user/message", "session/end-seed", "turn/start"]
        await live.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        loaded = await p.load(SID)
        assert [e.type for e in loaded.events] == [e.type for e in live.events] + ["session/end-seed"]
        assert loaded.header.created_at == 5 and live.header.created_at != 5
        assert types(await p.read_from(SID, 0))[-1] == "turn/end"  # durable
        await p.store.detach(live)


# -- cancellation and I/O failures ----------------------------------------------------------


async def load_scenario(probe: Probe, kind: str, template: Path) -> None:
    """Load a torn, interrupted log (a copy of ``template``, :func:`write_open_turn`);
    a cancellation (explore) or a failing file step (explore_io) may interrupt it.
    Either the old or the repaired log is stored, never part of the repair; and the id
    loads (and repairs) afterwards."""
    root = probe.tmp_path
    shutil.copytree(template, root, dirs_exist_ok=True)
    old = stored(root, kind)[0]
    header = plain_backend(root, kind)
    try:
        probe.data["sessions"] = {SID: dict(header.load(SID).header)}
    finally:
        close_backend(header)
    probe.acknowledge(SID, len(old) - 1, old)
    backend = make_backend(probe, kind)
    loaded = None
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            with trio.CancelScope() as caller:
                probe.canceller("caller", caller.cancel)
                probe.arm()
                try:
                    loaded = await p.load(SID)
                except PersistenceError as exc:
                    probe.check(probe.faults is not None, f"load failed without a fault: {exc!r}")
            probe.disarm()
            if loaded is not None:
                # Held ownerless: a fresh session with the id is vetoed.
                try:
                    await store.create(SID, cwd="/w")
                    probe.fail("a fresh session claimed a loaded id")
                except SessionLogExistsError:
                    pass
    except PersistenceError as exc:
        # Closing the persistence may report the injected fault again; nothing to retry.
        probe.check(probe.faults is not None, f"closing failed without a fault: {exc!r}")
    finally:
        close_backend(backend)
    after, torn, _ = stored(root, kind)
    probe.check(after[: len(old)] == old, "a stored event changed")
    probe.check(
        types(after[len(old) :]) in ([], CLOSERS),
        f"half a repair is stored: {types(after[len(old):])}",
    )
    probe.check(loaded is None or (torn is None and len(after) == len(old) + len(CLOSERS)), "load returned unrepaired")
    # Whatever happened, the id loads and repairs now, and no lock is left held.
    async with opened(root, kind) as p:
        again = await p.load(SID)
    final = stored(root, kind)[0]
    probe.check(types(final[len(old) :]) == CLOSERS and len(again.events) == len(final) + 1, "reload did not repair")
    check_at_rest(probe, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_load_cancelled_at_every_checkpoint(tmp_path: Path, kind: str) -> None:
    write_open_turn(tmp_path, kind)

    async def scenario(probe: Probe) -> None:
        await load_scenario(probe, kind, tmp_path)

    report = explore(scenario, name=f"load/{kind}")
    assert report.ok, report.distinct()
    assert report.steps["caller"] > 3  # the exploration reached into load


@pytest.mark.parametrize("kind", KINDS)
def test_load_with_a_failing_file_step(tmp_path: Path, kind: str) -> None:
    write_open_turn(tmp_path, kind)

    async def scenario(probe: Probe) -> None:
        await load_scenario(probe, kind, tmp_path)

    report = explore_io(scenario, backend=kind)
    assert report.ok, report.distinct()
    assert all(n > 0 for n in report.steps.values()), report.steps


@pytest.mark.parametrize("kind", KINDS)
async def test_a_live_create_while_a_cold_load_holds_the_id_is_refused(tmp_path: Path, kind: str) -> None:
    # Reference §2.4: a preparation entry (a cold load reading and repairing) owns the
    # id; a live creation of it is vetoed with "persisted state already owns this identity".
    import threading

    from harness.errors import SessionLockedError

    write_open_turn(tmp_path, kind)
    backend = plain_backend(tmp_path, kind)
    inside, go = threading.Event(), threading.Event()
    real_load = backend.load

    def held_load(session_id: str) -> Any:
        inside.set()
        go.wait()
        return real_load(session_id)

    backend.load = held_load  # type: ignore[method-assign]
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            loaded: list[Any] = []
            async with trio.open_nursery() as n:

                async def load() -> None:
                    loaded.append(await p.load(SID))

                n.start_soon(load)
                await trio.to_thread.run_sync(inside.wait)
                try:
                    with pytest.raises(SessionLockedError, match=r'^cannot publish session "s": persisted state already owns this identity$'):
                        await store.create(SID, cwd="/w")
                finally:
                    go.set()
            assert await store.get(SID) is None  # nothing was published
            # The load completed as if nothing had happened: repaired, the id ownerless.
            assert [e.type for e in loaded[0].events][4:7] == CLOSERS
            assert types(stored(tmp_path, kind)[0])[4:] == CLOSERS
    finally:
        close_backend(backend)


@pytest.mark.parametrize("kind", KINDS)
async def test_prepare_sees_what_was_appended_after_its_repair_commit(tmp_path: Path, kind: str) -> None:
    # Reference §2.7: "after any repair commit the source is discarded and the log
    # re-read". A writer that ignores the lease (e.g. another build sharing the
    # database) appends right after the repair commit: the prepared session has it.
    write_open_turn(tmp_path, kind)
    backend = plain_backend(tmp_path, kind)
    real_commit = backend.commit_repair

    def commit_then_append(session_id: str, truncate_to: Any, closers: Any, *, lease: Any) -> None:
        real_commit(session_id, truncate_to, closers, lease=lease)
        n = len(backend.load(session_id).records)
        late = {"type": "user/message", "seq": n, "time": 99, "data": user("late"), "surfaceOp": "append"}
        backend.append(session_id, [late], lease=lease)

    backend.commit_repair = commit_then_append  # type: ignore[method-assign]
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            prep = await p.prepare(SID)
            try:
                events = list(prep.session.events)
                assert [e.type for e in events][4:] == [*CLOSERS, "user/message", "session/end-seed"]
                assert thaw(events[7].data)["id"] == "late"
                assert prep.cursor == 8 and prep.repaired == 3
            finally:
                await prep.dispose()
    finally:
        close_backend(backend)


async def test_unknown_type_refusal_shows_the_seq_as_string_does(tmp_path: Path) -> None:
    # An integral float seq continues the log in the reader (1.0 === 1); the refusal
    # writes it as the reference's String() does: "seq 1", not "seq 1.0".
    b = JsonlBackend(tmp_path)
    hdr = {"version": 0, "id": SID, "createdAt": 1}
    d = b.session_dir(hdr)
    d.mkdir(parents=True)
    first = {"type": "user/message", "seq": 0, "time": 1, "data": user("u0"), "surfaceOp": "append"}
    lines = [{"type": "session", **hdr, "delegationDepth": 0}, first, {"type": "weird/type", "seq": 1.0, "time": 1, "data": {}}]
    (d / "session.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    async with open_store() as store, open_persistence(store, b) as p:
        with pytest.raises(Exception, match=r'contains event type "weird/type" \(seq 1\) unknown'):
            await p.load(SID)


def write_invalid_open_turn(root: Path, kind: str) -> bytes | list[dict[str, Any]]:
    """Store a session ``s`` that does not restore (a surfaceOp on a log-only event), left
    inside a turn with a torn final write: a repair is due, but validation fails."""
    header = {"version": 0, "id": SID, "createdAt": 7, "cwd": "/w"}
    records: list[dict[str, Any]] = [
        {"type": "user/message", "seq": 0, "time": 10, "data": user("hello"), "surfaceOp": "append"},
        {"type": "session/end-seed", "seq": 1, "time": 10, "data": {}, "surfaceOp": "append"},
        {"type": "turn/start", "seq": 2, "time": 11, "data": {"turn": 1}},
    ]
    store_log(root, kind, header, records)
    tear(root, kind, len(records))
    return at_rest(root, kind)


def at_rest(root: Path, kind: str) -> bytes | list[dict[str, Any]]:
    """The stored bytes (JSONL) or rows (SQLite) of ``s``, to compare before and after."""
    backend = plain_backend(root, kind)
    try:
        if isinstance(backend, JsonlBackend):
            return Path(backend.locate(SID) or "").read_bytes()
        db = sqlite3.connect(backend.path)  # type: ignore[attr-defined]
        rows = db.execute("SELECT * FROM events WHERE session_id = ? ORDER BY seq", (SID,)).fetchall()
        db.close()
        return rows
    finally:
        close_backend(backend)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["prepare", "append", "load"])
async def test_a_log_that_does_not_restore_is_refused_before_its_repair(tmp_path: Path, kind: str, how: str) -> None:
    # Reference §2.8 / §2.3: prepareCore builds (validates) the session before
    # commitPrepared writes the repair, and an append's adoption is a prepare: the
    # refusal leaves the stored log as it was (torn tail and open turn included).
    before = write_invalid_open_turn(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        with pytest.raises(Exception, match=r'^stored session "s" failed validation: ') as info:
            if how == "prepare":
                await p.prepare(SID)
            elif how == "append":
                await p.append(SID, [{"type": "feedback/record", "seq": 5, "time": 1, "data": {}}])
            else:
                await p.load(SID)
        assert getattr(info.value, "code", None) == "SESSION_CORRUPT"
    assert at_rest(tmp_path, kind) == before


@pytest.mark.parametrize("kind", KINDS)
async def test_an_append_does_not_adopt_a_balanced_log_that_does_not_restore(tmp_path: Path, kind: str) -> None:
    # The adoption is a prepare: its validation refuses the log even when no repair is due.
    header = {"version": 0, "id": SID, "createdAt": 7, "cwd": "/w"}
    records = [
        {"type": "user/message", "seq": 0, "time": 10, "data": user("hello"), "surfaceOp": "append"},
        {"type": "session/end-seed", "seq": 1, "time": 10, "data": {}, "surfaceOp": "append"},
    ]
    store_log(tmp_path, kind, header, records)
    before = at_rest(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        with pytest.raises(Exception, match=r'^stored session "s" failed validation: '):
            await p.append(SID, [{"type": "feedback/record", "seq": 2, "time": 1, "data": {}}])
    assert at_rest(tmp_path, kind) == before


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("what", ["version", "unknown", "legacy"])
async def test_a_format_refusal_carries_the_raw_logs_location(tmp_path: Path, kind: str, what: str) -> None:
    # Reference §2.9: `.location` when the backend keeps a per-session artifact (JSONL:
    # the transcript, also named in the message), none for SQLite.
    header = {"version": 0, "id": SID, "createdAt": 7, "cwd": "/w"}
    first = {"type": "user/message", "seq": 0, "time": 10, "data": user("hello"), "surfaceOp": "append"}
    odd = {"type": "weird/type" if what == "unknown" else "mode/set", "seq": 1, "time": 11, "data": {}}
    backend = plain_backend(tmp_path, kind)
    try:
        lease = backend.acquire_writer(header)
        try:
            backend.materialize(header, [first, odd], lease=lease)
        finally:
            lease.release()
        path = backend.locate(SID) if isinstance(backend, JsonlBackend) else None
        db_path = getattr(backend, "path", None)
    finally:
        close_backend(backend)
    if what == "version":
        if path is None:
            db = sqlite3.connect(db_path)
            with db:
                db.execute("UPDATE sessions SET version = 3")
            db.close()
        else:
            text = Path(path).read_bytes().replace(b'"version":0', b'"version":3', 1)
            Path(path).write_bytes(text)
    async with opened(tmp_path, kind) as p:
        with pytest.raises(SessionFormatUnsupportedError) as info:
            await p.load(SID)
    assert info.value.location == (None if path is None else str(path))
    assert str(info.value).endswith("" if path is None else f" (raw log: {path})")
    if path is None:
        assert "(raw log:" not in str(info.value)
