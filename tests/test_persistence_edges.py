"""Edges of the live write path and of ``load`` (reference §2.4, §2.8, §2.10):

* the adoption of an untracked stored log by a live session (§2.4 case 3) decides
  under the writer lock: another process appending between the read and the lock is
  seen, and nothing is written behind it;
* a failed retirement's retry appends only to exactly the log its writer left (a log
  rewritten with the same number of events is not appended to);
* ``load`` of an entered but unannounced session goes cold (it wrote nothing);
* a live ``load`` after an adoption answers with the stored header;
* the claim check compares JSON types strictly (``1`` is not ``1.0``).

"Another process" is a second backend instance on the same root (its own ``flock`` /
lease), as in ``tests/test_claim_race.py``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from harness.errors import (
    FlushError,
    PersistedSessionNotFoundError,
    PersistenceCloseError,
    PersistenceError,
    SessionLogExistsError,
)
from harness.faults import Probe, explore, explore_io
from harness.faults._backends import check_at_rest, close_backend, make_backend, plain_backend
from harness.persistence import open_persistence
from harness.persistence._restore import build_session
from harness.runtime import open_store
from tests.helpers import user
from tests.test_claim_race import (
    HEADER,
    SID,
    closing_fails,
    lock_free,
    opened,
    other_process_appends,
    publish,
    rec,
    stored,
    write_balanced,
)

KINDS = ["jsonl", "sqlite", "jsonl-zstd"]
COLLISION = (
    f'session "{SID}" already has a persisted log on disk that does not match this live session (id collision)'
)


def append_before_the_lock(backend: Any, root: Path, kind: str, seq: int, got: list[dict[str, Any]]) -> None:
    """Make ``backend``'s next ``acquire_writer`` let another process append first: the
    window between the adoption's read and its lock."""
    real = backend.acquire_writer

    def acquire(header: dict[str, Any]) -> Any:
        if not got:
            got.append(other_process_appends(root, kind, seq))
        return real(header)

    backend.acquire_writer = acquire


# -- 1. adoption decides under the lock -------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_an_adoption_sees_an_append_between_its_read_and_its_lock(tmp_path: Path, kind: str) -> None:
    old = write_balanced(tmp_path, kind)
    async with closing_fails(tmp_path, kind) as (p, closing):
        # Untracked here (read_session records nothing): the live session adopts the
        # stored log at its first write (§2.4 case 3).
        handle = await publish(p, await p.read_session(SID))
        await handle.append("user/message", user("mine"), surface_op="append")
        theirs: list[dict[str, Any]] = []
        append_before_the_lock(p.backend, tmp_path, kind, len(old), theirs)
        with pytest.raises(FlushError) as info:
            await handle.flush()
        cause = info.value.__cause__
        assert isinstance(cause, SessionLogExistsError) and cause.code == "SESSION_LOG_EXISTS"
        assert str(cause) == COLLISION
        # Nothing of ours was written behind the other process's event, no lock kept.
        assert stored(tmp_path, kind) == ([*old, *theirs], None)
        assert lock_free(tmp_path, kind)
        with pytest.raises(FlushError, match=r"\(id collision\)$"):
            await handle.flush()  # a retry decides again, and refuses again
        assert stored(tmp_path, kind) == ([*old, *theirs], None)
    assert list(closing[0].failures) == [SID]
    assert stored(tmp_path, kind) == ([*old, *theirs], None)
    assert lock_free(tmp_path, kind)


@pytest.mark.parametrize("kind", KINDS)
async def test_an_adoption_continues_a_log_that_moved_into_its_own_prefix(tmp_path: Path, kind: str) -> None:
    # The other process appended exactly what the live log holds next: re-read under
    # the lock, the stored log is still a prefix, and only the rest is written.
    old = write_balanced(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        theirs = rec(len(old), "from another process")
        seed = build_session(SID, dict(HEADER), [*old, dict(theirs)])
        handle = await publish(p, seed)
        await handle.append("user/message", user("mine"), surface_op="append")
        got: list[dict[str, Any]] = []
        real = p.backend.acquire_writer

        def acquire(header: dict[str, Any]) -> Any:
            if not got:
                got.append(other_process_appends(tmp_path, kind, len(old)))
            return real(header)

        p.backend.acquire_writer = acquire  # type: ignore[method-assign]
        await handle.flush()
        after = stored(tmp_path, kind)[0]
        assert after[: len(old) + 1] == [*old, got[0]]
        assert [r["type"] for r in after[len(old) + 1 :]] == ["session/end-seed", "user/message"]
        assert [r["seq"] for r in after] == list(range(len(after)))
        await p.store.detach(handle)
        await p.wait_retired(SID)
    assert lock_free(tmp_path, kind)


async def adoption_scenario(probe: Probe, kind: str, template: Path) -> None:
    """A live session adopts the stored log while another process appends between its
    read and its lock; a cancellation (explore) or a failing file step / statement
    (explore_io) may hit any step. Whatever happens nothing of ours is stored behind
    the other event, the log reads, and no lock is left held."""
    root = probe.tmp_path
    shutil.copytree(template, root, dirs_exist_ok=True)
    old = stored(root, kind)[0]
    probe.data["sessions"] = {SID: dict(HEADER)}
    backend = make_backend(probe, kind)
    theirs: list[dict[str, Any]] = []
    try:
        async with open_store() as store:
            try:
                async with open_persistence(store, backend) as p:
                    try:
                        loaded = await p.read_session(SID)
                    except PersistenceError as exc:
                        probe.check(probe.faults is not None, f"read failed without a fault: {exc!r}")
                        return
                    append_before_the_lock(backend, root, kind, len(old), theirs)
                    with trio.CancelScope() as caller:
                        probe.canceller("caller", caller.cancel)
                        probe.arm()
                        try:
                            handle = await publish(p, loaded)
                            await handle.append("user/message", user("mine"), surface_op="append")
                            await handle.flush()
                            probe.fail("an adoption wrote behind a log another process moved")
                        except FlushError as exc:
                            cause = exc.__cause__
                            probe.check(
                                isinstance(cause, SessionLogExistsError) or probe.faults is not None,
                                f"the adoption failed without a fault, not as a collision: {cause!r}",
                            )
                    probe.disarm()
                    if theirs:
                        probe.acknowledge(SID, len(old), old + theirs)
            except PersistenceError as exc:
                probe.check(
                    isinstance(exc, PersistenceCloseError) or probe.faults is not None,
                    f"closing failed oddly: {exc!r}",
                )
    finally:
        close_backend(backend)
    after, torn = stored(root, kind)
    expected = old + theirs
    probe.check(after == expected, f"the stored log changed: {[r['seq'] for r in after]}")
    probe.check(torn is None, "a torn tail was left")
    check_at_rest(probe, kind)


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_the_adoption_cancelled_at_every_checkpoint(tmp_path: Path, kind: str) -> None:
    template = tmp_path / "template"
    write_balanced(template, kind)

    async def scenario(probe: Probe) -> None:
        await adoption_scenario(probe, kind, template)

    report = explore(scenario, name=f"adoption-race/{kind}")
    assert report.ok, report.distinct()
    assert report.steps["caller"] > 3


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_the_adoption_with_a_failing_file_step(tmp_path: Path, kind: str) -> None:
    template = tmp_path / "template"
    write_balanced(template, kind)

    async def scenario(probe: Probe) -> None:
        await adoption_scenario(probe, kind, template)

    report = explore_io(scenario, backend=kind)
    assert report.ok, report.distinct()
    assert all(n > 0 for n in report.steps.values()), report.steps


# -- 2. a failed retirement's retry -----------------------------------------------------------


def fail_appends(backend: Any) -> list[bool]:
    """Make ``backend.append`` fail while the returned flag list is non-empty."""
    real = backend.append
    failing = [True]

    def append(*args: Any, **kwargs: Any) -> Any:
        if failing:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    backend.append = append
    return failing


def another_process_rewrites(root: Path, kind: str, records: list[dict[str, Any]]) -> None:
    """Another process deletes the log and writes one with ``records`` (same header)."""
    backend = plain_backend(root, kind)
    try:
        header = {k: v for k, v in backend.load(SID).header.items() if k != "type"}
        lease = backend.acquire_writer(header)
        try:
            backend.delete(SID)
            backend.materialize(header, [dict(r) for r in records], lease=lease)
        finally:
            lease.release()
    finally:
        close_backend(backend)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retry_does_not_append_to_a_log_rewritten_with_the_same_count(tmp_path: Path, kind: str) -> None:
    backend = plain_backend(tmp_path, kind)
    try:
        async with open_store() as store:
            with pytest.raises(PersistenceCloseError) as info:
                async with open_persistence(store, backend) as p:
                    s = await store.create(SID, cwd="/w")
                    await s.append("user/message", user("a"), surface_op="append")
                    await s.append("user/message", user("b"), surface_op="append")
                    await s.flush()
                    failing = fail_appends(backend)
                    await s.append("user/message", user("lost"), surface_op="append")
                    await store.detach(s)
                    await p.wait_retired(SID)
                    assert len(p._leftovers) == 1
                    theirs = [rec(0, "x"), rec(1, "y")]  # the same count, other events
                    another_process_rewrites(tmp_path, kind, theirs)
                    failing.clear()
        error = info.value.failures[SID]
        assert isinstance(error, PersistenceError)
        assert str(error) == (
            f'{backend.name}: session "{SID}" moved on since its retirement failed (2 stored event(s), '
            "expected 2, not the ones it wrote): 1 event(s) dropped"
        )
    finally:
        close_backend(backend)
    assert stored(tmp_path, kind) == (theirs, None)
    assert lock_free(tmp_path, kind)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retry_appends_to_the_log_its_writer_left(tmp_path: Path, kind: str) -> None:
    backend = plain_backend(tmp_path, kind)
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            s = await store.create(SID, cwd="/w")
            await s.append("user/message", user("a"), surface_op="append")
            await s.flush()
            failing = fail_appends(backend)
            await s.append("user/message", user("b"), surface_op="append")
            await store.detach(s)
            await p.wait_retired(SID)
            failing.clear()
    finally:
        close_backend(backend)
    assert [r["data"]["content"] for r in stored(tmp_path, kind)[0]] == [user("a")["content"], user("b")["content"]]


async def retry_scenario(probe: Probe, kind: str) -> None:
    """A failed retirement, another process rewriting the log with as many events, then
    the close retrying; cancelled (explore) or failing (explore_io) anywhere. Nothing
    is ever appended to the rewritten log."""
    root = probe.tmp_path
    probe.data["sessions"] = {}
    backend = make_backend(probe, kind)
    theirs = [rec(0, "x")]
    rewritten = False
    try:
        async with open_store() as store:
            try:
                async with open_persistence(store, backend) as p:
                    with trio.CancelScope() as caller:
                        probe.canceller("caller", caller.cancel)
                        probe.arm()
                        s = await store.create(SID, cwd="/w")
                        await s.append("user/message", user("a"), surface_op="append")
                        try:
                            await s.flush()
                        except FlushError:
                            probe.check(probe.faults is not None, "a flush failed without a fault")
                            return
                        failing = fail_appends(backend)
                        await s.append("user/message", user("lost"), surface_op="append")
                        await store.detach(s)
                        await p.wait_retired(SID)
                        probe.disarm()
                        another_process_rewrites(root, kind, theirs)
                        rewritten = True
                        failing.clear()
                        probe.arm()
            except PersistenceError as exc:
                probe.check(
                    isinstance(exc, PersistenceCloseError) or probe.faults is not None,
                    f"closing failed oddly: {exc!r}",
                )
    finally:
        probe.disarm()
        close_backend(backend)
    if rewritten:
        after, torn = stored(root, kind)
        probe.check(after == theirs, f"the rewritten log changed: {[r['seq'] for r in after]}")
        probe.check(torn is None, "a torn tail was left")
        probe.check(lock_free(root, kind), "a lock was left held")


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_the_retry_cancelled_at_every_checkpoint(tmp_path: Path, kind: str) -> None:
    async def scenario(probe: Probe) -> None:
        await retry_scenario(probe, kind)

    report = explore(scenario, name=f"retry-moved/{kind}")
    assert report.ok, report.distinct()
    assert report.steps["caller"] > 3


# -- 3. load of an entered, unannounced session ------------------------------------------------


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_load_of_an_unannounced_session_with_nothing_stored_is_not_found(tmp_path: Path, kind: str) -> None:
    async with opened(tmp_path, kind) as p:
        prepared = await p.store.prepare(SID, cwd="/w")
        handle = await p.store.enter(prepared)
        await handle.append("user/message", user("never written"), surface_op="append")
        with pytest.raises(PersistedSessionNotFoundError) as info:
            await p.load(SID)
        assert str(info.value) == f'session "{SID}" not found'
        assert await p.list() == []
        await p.store.detach(handle)


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_load_of_an_unannounced_session_reads_the_stored_log(tmp_path: Path, kind: str) -> None:
    old = write_balanced(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        handle = await p.store.enter(await p.store.prepare(SID, cwd="/w"))
        await handle.append("user/message", user("not stored"), surface_op="append")
        loaded = await p.load(SID)  # cold: the stored log, not the unannounced one
        assert [e.type for e in loaded.events] == ["user/message", "user/message", "session/end-seed"]
        assert stored(tmp_path, kind) == (old, None)
        # The id is ownerless now: announcing the unannounced session is vetoed.
        with pytest.raises(SessionLogExistsError, match=r"that do not match this live session \(id collision\)$"):
            await p.store.announce(handle)
    assert stored(tmp_path, kind) == (old, None)


# -- 4. a live load after an adoption ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_live_load_after_an_adoption_answers_with_the_stored_header(tmp_path: Path, kind: str) -> None:
    old = write_balanced(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        # The same log, but built with another createdAt (an HMR reload): untracked here.
        live = build_session(SID, {**HEADER, "createdAt": 99}, [dict(r) for r in old])
        handle = await publish(p, live)
        await handle.append("user/message", user("mine"), surface_op="append")
        loaded = await p.load(SID)  # flushes: the adoption happens in that flush
        assert loaded.header.created_at == 7
        assert stored(tmp_path, kind)[0][: len(old)] == old
        await handle.flush()
        await p.store.detach(handle)
        await p.wait_retired(SID)
    assert lock_free(tmp_path, kind)
    # Everything was written under the stored header (one log, createdAt 7).
    backend = plain_backend(tmp_path, kind)
    try:
        assert backend.load(SID).header["createdAt"] == 7
    finally:
        close_backend(backend)


# -- 5. the claim check's JSON types ------------------------------------------------------------


async def test_the_claim_check_compares_json_types_strictly(tmp_path: Path) -> None:
    kind = "jsonl"
    backend = plain_backend(tmp_path, kind)
    lease = backend.acquire_writer(HEADER)
    try:
        backend.materialize(
            HEADER,
            [{"type": "feedback/record", "seq": 0, "time": 1, "data": {"score": 1.0}}],
            lease=lease,
        )
    finally:
        lease.release()
    async with opened(tmp_path, kind) as p:
        loaded = await p.load(SID)
        # A seed with the int 1 where the log holds 1.0 does not reproduce it ...
        with pytest.raises(SessionLogExistsError, match=r"with 1 event\(s\) that do not match"):
            await p.store.create(SID, cwd="/w", seed=[{"type": "feedback/record", "seq": 0, "time": 1, "data": {"score": 1}}])
        # ... the loaded session (its 1.0 read back as 1.0) does.
        handle = await publish(p, loaded)
        await handle.flush()
        await p.store.detach(handle)
    assert stored(tmp_path, kind)[0][0]["data"] == {"score": 1.0}
