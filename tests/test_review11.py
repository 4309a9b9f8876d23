"""Review of issue 11's ``load``: its races with the rest of the persistence service
(an entered-but-unannounced session, a retirement, a prepare, a delete)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from harness.errors import EventError, PersistedSessionNotFoundError, SessionLogExistsError
from harness.faults import Probe, explore
from harness.faults._backends import check_at_rest, close_backend, make_backend, plain_backend
from harness.persistence import open_persistence
from harness.runtime import open_store
from tests.helpers import user
from tests.test_persistence_load import CLOSERS, SID, opened, stored, types, write_open_turn

KINDS = ["jsonl", "sqlite"]
HEADER = {"version": 0, "id": SID, "createdAt": 7, "cwd": "/w"}


def lock_is_free(root: Path, kind: str) -> bool:
    backend = plain_backend(root, kind)
    try:
        backend.acquire_writer(HEADER).release()
        return True
    except Exception:
        return False
    finally:
        close_backend(backend)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_load_through_an_entered_unannounced_session_starts_no_writer(tmp_path: Path, kind: str) -> None:
    old = write_open_turn(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        loaded = await p.load(SID)
        # Published the documented way, but the caller stops between enter and announce.
        handle = await p.store.enter(await p.store.adopt(loaded))
        again = await p.load(SID)  # the live path: a flush of an unannounced session
        assert [e.type for e in again.events] == [e.type for e in loaded.events]
        assert p._writers == {}  # the flush started no writer ...
        await p.store.detach(handle)  # ... which no session/disposed would ever retire
        assert lock_is_free(tmp_path, kind)
        with trio.fail_after(5):
            await p.load(SID)  # no spin on a stale writer
        # The ownerless state is still there: a fresh session with the id is vetoed,
        # and nothing was written by the unannounced one.
        with pytest.raises(SessionLogExistsError, match=r"that do not match this live session \(id collision\)$"):
            await p.store.create(SID, cwd="/w")
        assert types(stored(tmp_path, kind)[0]) == types(old) + CLOSERS


@pytest.mark.parametrize("kind", KINDS)
async def test_a_load_racing_a_retirement_waits_for_its_last_batch(tmp_path: Path, kind: str) -> None:
    backend = plain_backend(tmp_path, kind)
    append, held, release = backend.append, threading.Event(), threading.Event()

    def slow_append(*args: Any, **kwargs: Any) -> Any:
        held.set()
        release.wait(10)
        return append(*args, **kwargs)

    try:
        async with open_store() as store, open_persistence(store, backend, write_delay=1000) as p:
            live = await store.create(SID, cwd="/w")
            await live.append("user/message", user("m1"), surface_op="append")
            await live.flush()  # materialized: the next batch is an append
            backend.append = slow_append  # type: ignore[method-assign]
            await live.append("user/message", user("m2"), surface_op="append")  # buffered
            got: list[Any] = []

            async def load() -> None:
                got.append(await p.load(SID))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.detach, live)  # its retirement writes "m2"
                for _ in range(10_000):  # until the store actor took the detach
                    if not live.alive:
                        break
                    await trio.lowlevel.checkpoint()
                nursery.start_soon(load)  # waited for no retirement: none was registered yet
                await trio.to_thread.run_sync(held.wait, 10)
                # The second operation has reached its wait (every task blocked), not a
                # guess at how long it takes to get there.
                await trio.testing.wait_all_tasks_blocked()
                release.set()
            backend.append = append  # type: ignore[method-assign]
            # The load saw the retired log, final batch included, and holds its end.
            assert [e.type for e in got[0].events] == ["user/message", "user/message", "session/end-seed"]
            assert p._states[SID].cursor == 2
            await p.append(SID, [{"type": "feedback/record", "seq": 2, "time": 1, "data": {}}])
        assert types(stored(tmp_path, kind)[0]) == ["user/message", "user/message", "feedback/record"]
    finally:
        close_backend(backend)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("order", ["prepare-first", "load-first", "two-prepares"])
async def test_a_prepare_racing_a_load_or_a_prepare_never_meets_our_own_lock(
    tmp_path: Path, kind: str, order: str
) -> None:
    old = write_open_turn(tmp_path, kind)
    backend = plain_backend(tmp_path, kind)
    commit, held, release = backend.commit_repair, threading.Event(), threading.Event()

    def slow_commit(*args: Any, **kwargs: Any) -> Any:
        held.set()  # the first operation holds the writer lock while it repairs
        release.wait(10)
        return commit(*args, **kwargs)

    backend.commit_repair = slow_commit  # type: ignore[method-assign]
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            done: list[str] = []

            async def prepare() -> None:
                prep = await p.prepare(SID)
                done.append(f"prepare repaired={prep.repaired}")
                await prep.dispose()

            async def load() -> None:
                await p.load(SID)
                done.append("load")

            first, second = {
                "prepare-first": (prepare, load),
                "load-first": (load, prepare),
                "two-prepares": (prepare, prepare),
            }[order]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(first)
                await trio.to_thread.run_sync(held.wait, 10)
                nursery.start_soon(second)
                # The second operation has reached its wait (every task blocked), not a
                # guess at how long it takes to get there.
                await trio.testing.wait_all_tasks_blocked()
                release.set()
            assert len(done) == 2 and sum("repaired=3" in d for d in done) <= 1
        assert types(stored(tmp_path, kind)[0]) == types(old) + CLOSERS  # repaired once
    finally:
        close_backend(backend)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_delete_racing_a_load_leaves_no_ownerless_state(tmp_path: Path, kind: str) -> None:
    async with opened(tmp_path, kind) as p:
        live = await p.store.create(SID, cwd="/w")
        await live.append("user/message", user("m1"), surface_op="append")
        await live.flush()
        await p.store.detach(live)
        await p.wait_retired(SID)
    backend = plain_backend(tmp_path, kind)
    load, held, release = backend.load, threading.Event(), threading.Event()
    calls: list[str] = []

    def slow_load(session_id: str) -> Any:
        stored_log = load(session_id)
        calls.append(session_id)
        if len(calls) == 1:  # the load's read: the delete comes meanwhile
            held.set()
            release.wait(10)
        return stored_log

    backend.load = slow_load  # type: ignore[method-assign]
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(p.load, SID)
                await trio.to_thread.run_sync(held.wait, 10)
                nursery.start_soon(p.delete, SID)
                # The second operation has reached its wait (every task blocked), not a
                # guess at how long it takes to get there.
                await trio.testing.wait_all_tasks_blocked()
                release.set()
            assert backend.revision(SID) is None and SID not in p._states
            fresh = await store.create(SID, cwd="/w")  # the id is free again
            await store.detach(fresh)
    finally:
        close_backend(backend)


@pytest.mark.parametrize("kind", KINDS)
async def test_the_per_id_chains_do_not_outlive_their_operations(tmp_path: Path, kind: str) -> None:
    write_open_turn(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(p.load, SID)
        prep = await p.prepare(SID)
        await prep.dispose()
        await p.create({"version": 0, "id": "other", "createdAt": 1})
        await p.append("other", [{"type": "feedback/record", "seq": 0, "time": 1, "data": {}}])
        await p.delete("other")
        assert p._chains == {}  # reference §2.2/§2.10: settled chains leave no entry


# -- a load racing a resume, cancelled at every step ---------------------------------------


async def load_and_resume(probe: Probe, kind: str, template: Path) -> None:
    """A load and a resume (prepare, publish, append, flush, detach) of the same torn,
    interrupted log, concurrently; either may be cancelled at any step. The repair is
    stored once, every stored event stays, nothing is left held, the id loads after."""
    root = probe.tmp_path
    shutil.copytree(template, root, dirs_exist_ok=True)
    old = stored(root, kind)[0]
    probe.data["sessions"] = {SID: dict(HEADER)}
    probe.acknowledge(SID, len(old) - 1, old)
    backend = make_backend(probe, kind)
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            load_scope, resume_scope = trio.CancelScope(), trio.CancelScope()
            probe.canceller("load", load_scope.cancel)
            probe.canceller("resume", resume_scope.cancel)

            async def load() -> None:
                with load_scope:
                    await p.load(SID)

            async def resume() -> None:
                with resume_scope:
                    handle = await p.publish(await p.prepare(SID))
                    try:
                        await handle.append("user/message", user("later"), surface_op="append")
                        await handle.flush()
                    finally:
                        with trio.CancelScope(shield=True):
                            await store.detach(handle)

            probe.arm()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(load)
                nursery.start_soon(resume)
            probe.disarm()
            await p.wait_retired(SID)
            probe.check(not p._reserved and not p._writers and not p._chains, "state left behind")
    finally:
        close_backend(backend)
    after = stored(root, kind)[0]
    rest = types(after[len(old) :])
    probe.check(after[: len(old)] == old, "a stored event changed")
    probe.check(rest[:3] in ([], CLOSERS) and rest.count("turn/end") <= 1, f"not repaired exactly once: {rest}")
    async with opened(root, kind) as p:
        await p.load(SID)
    check_at_rest(probe, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_load_racing_a_resume_cancelled_at_every_step(tmp_path: Path, kind: str) -> None:
    write_open_turn(tmp_path, kind)

    async def scenario(probe: Probe) -> None:
        await load_and_resume(probe, kind, tmp_path)

    report = explore(scenario, name=f"load-resume/{kind}")
    assert report.ok, report.distinct()
    assert report.steps["load"] > 10  # the exploration reached into both operations


@pytest.mark.parametrize("kind", KINDS)
async def test_create_waits_for_a_retiring_incarnation(tmp_path: Path, kind: str) -> None:
    backend = plain_backend(tmp_path, kind)
    materialize, release = backend.materialize, threading.Event()

    def slow_materialize(*args: Any, **kwargs: Any) -> Any:
        release.wait(10)
        return materialize(*args, **kwargs)

    backend.materialize = slow_materialize  # type: ignore[method-assign]
    try:
        async with open_store() as store, open_persistence(store, backend, write_delay=1000) as p:
            live = await store.create(SID, cwd="/w")
            await live.append("user/message", user("m1"), surface_op="append")  # not written yet
            await store.detach(live)  # its retirement writes the first batch


            async def release_later() -> None:
                # The second operation has reached its wait (every task blocked), not a
                # guess at how long it takes to get there.
                await trio.testing.wait_all_tasks_blocked()
                release.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(release_later)
                # Not a lazy state over a log that is being written: the stored log.
                with pytest.raises(SessionLogExistsError, match=r"load/resume it instead of creating$"):
                    await p.create({**HEADER, "createdAt": 1})
            assert SID not in p._states
    finally:
        close_backend(backend)


@pytest.mark.parametrize("kind", KINDS)
async def test_an_unannounced_session_is_never_written(tmp_path: Path, kind: str) -> None:
    async with opened(tmp_path, kind) as p:
        # Appended to and flushed before any announce, then detached unannounced: no
        # writer started (none would ever retire), nothing written, nothing held.
        handle = await p.store.enter(await p.store.prepare(SID, cwd="/w"))
        await handle.append("user/message", user("m1"), surface_op="append")
        assert await handle.flush() is False  # no listener has heard of it: nothing durable
        assert p._writers == {}
        await p.store.detach(handle)
        assert lock_is_free(tmp_path, kind)
        with pytest.raises(PersistedSessionNotFoundError), trio.fail_after(5):
            await p.load(SID)
        await p.create({**HEADER, "createdAt": 1})  # the id is free
        # A seed a load would refuse is not written by an unannounced session's events
        # either; its announce is then vetoed, and nothing reached the disk.
        seed = [{"type": "future/x", "seq": 0, "time": 1, "data": {}}]
        handle = await p.store.enter(await p.store.prepare("u", seed=seed))
        await handle.append("user/message", user("m1"), surface_op="append")
        await handle.flush()
        with pytest.raises(EventError, match=r"is not one this harness can read back"):
            await p.store.announce(handle)
        await p.store.detach(handle)
        await p.wait_retired("u")
        with pytest.raises(PersistedSessionNotFoundError):
            await p.read_from("u", 0)
