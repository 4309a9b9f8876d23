"""A stored log that another process appends to after ``Persistence.load`` (or after an
envelope ``append``) must not be written behind: the live session that claims the
ownerless id, or the next ``append``, checks under the writer lock that the stored log
is still the one it read (same revision, else the same events and no torn tail); if it
moved, that write fails with :class:`SessionLogExistsError` and nothing is written.

"Another process" is a second backend instance on the same root (its own ``flock`` /
lease, as a process would have): the race is on the storage, not in this process."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from harness.errors import (
    FlushError,
    PersistenceCloseError,
    PersistenceError,
    SessionLogExistsError,
)
from harness.faults import Probe, explore, explore_io
from harness.faults._backends import check_at_rest, close_backend, make_backend, plain_backend
from harness.persistence import JsonlBackend, Persistence, open_persistence
from harness.runtime import SessionHandle, open_store
from harness.session import Session, thaw
from tests.helpers import user

KINDS = ["jsonl", "sqlite", "jsonl-zstd"]
SID = "s"
HEADER: dict[str, Any] = {"version": 0, "id": SID, "createdAt": 7, "cwd": "/w"}
CHANGED = r"stored log changed since it was loaded"


def rec(seq: int, text: str) -> dict[str, Any]:
    return {
        "type": "user/message",
        "seq": seq,
        "time": 10 + seq,
        "data": user(text),
        "surfaceOp": "append",
    }


def write_balanced(root: Path, kind: str) -> list[dict[str, Any]]:
    """Store a balanced session ``s`` (no open turn: a cold load writes nothing)."""
    backend = plain_backend(root, kind)
    try:
        lease = backend.acquire_writer(HEADER)
        try:
            backend.materialize(HEADER, [rec(0, "hello"), rec(1, "again")], lease=lease)
        finally:
            lease.release()
    finally:
        close_backend(backend)
    return stored(root, kind)[0]


def other_process_appends(root: Path, kind: str, seq: int) -> dict[str, Any]:
    """Another writer (its own backend instance, lock and lease) appends one event."""
    record = rec(seq, "from another process")
    backend = plain_backend(root, kind)
    try:
        lease = backend.acquire_writer(HEADER)
        try:
            backend.append(SID, [dict(record)], lease=lease)
        finally:
            lease.release()
    finally:
        close_backend(backend)
    return record


def stored(root: Path, kind: str) -> tuple[list[dict[str, Any]], int | None]:
    backend = plain_backend(root, kind)
    try:
        log = backend.load(SID)
        return [thaw(r) for r in log.records], log.truncate_to
    finally:
        close_backend(backend)


def lock_free(root: Path, kind: str) -> bool:
    backend = plain_backend(root, kind)
    try:
        return not backend.lock_held(HEADER)
    finally:
        close_backend(backend)


@asynccontextmanager
async def opened(root: Path, kind: str) -> AsyncIterator[Persistence]:
    backend = plain_backend(root, kind)
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            yield p
    finally:
        close_backend(backend)


@asynccontextmanager
async def closing_fails(
    root: Path, kind: str
) -> AsyncIterator[tuple[Persistence, list[PersistenceCloseError]]]:
    """Like :func:`opened`, but the persistence's close must raise
    :class:`PersistenceCloseError` (appended to the yielded list)."""
    backend = plain_backend(root, kind)
    closing: list[PersistenceCloseError] = []
    try:
        async with open_store() as store:
            with pytest.raises(PersistenceCloseError) as info:
                async with open_persistence(store, backend) as p:
                    yield p, closing
            closing.append(info.value)
    finally:
        close_backend(backend)


async def publish(p: Persistence, loaded: Session) -> SessionHandle:
    handle = await p.store.enter(await p.store.adopt(loaded))
    await p.store.announce(handle)
    return handle


@pytest.mark.parametrize("kind", KINDS)
async def test_a_claim_after_another_process_appended_writes_nothing(
    tmp_path: Path, kind: str
) -> None:
    old = write_balanced(tmp_path, kind)
    async with closing_fails(tmp_path, kind) as (p, closing):
        loaded = await p.load(SID)  # balanced: no lock taken, nothing written
        theirs = other_process_appends(tmp_path, kind, len(old))
        handle = await publish(p, loaded)  # the seed reproduces the loaded log: a claim
        await handle.append("user/message", user("mine"), surface_op="append")
        with pytest.raises(FlushError) as info:
            await handle.flush()
        cause = info.value.__cause__
        assert isinstance(cause, SessionLogExistsError) and cause.code == "SESSION_LOG_EXISTS"
        assert str(cause) == (
            f'session "{SID}" already has a persisted log on disk that does not match this live session '
            "(id collision): the stored log changed since it was loaded (it now holds 3 event(s), this "
            "persistence wrote or read 2; another process wrote it); nothing was written"
        )
        # Nothing of ours landed, the log reads as the other process left it, and
        # the failed claim did not keep the lock (the other writer may go on).
        assert stored(tmp_path, kind) == ([*old, theirs], None)
        assert lock_free(tmp_path, kind)
        # A retry checks again (it does not write behind the moved log either).
        with pytest.raises(FlushError, match=CHANGED):
            await handle.flush()
        assert stored(tmp_path, kind) == ([*old, theirs], None)
    # The unwritten events are reported when the persistence closes: never silent.
    assert list(closing[0].failures) == [SID]
    assert stored(tmp_path, kind) == ([*old, theirs], None)
    assert lock_free(tmp_path, kind)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_claim_of_an_unchanged_log_writes_its_suffix(tmp_path: Path, kind: str) -> None:
    old = write_balanced(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        loaded = await p.load(SID)
        handle = await publish(p, loaded)
        await handle.append("user/message", user("mine"), surface_op="append")
        await handle.flush()
        after = stored(tmp_path, kind)[0]
        assert after[: len(old)] == old
        assert [r["type"] for r in after[len(old) :]] == ["session/end-seed", "user/message"]
        await p.store.detach(handle)
        await p.wait_retired(SID)
    assert lock_free(tmp_path, kind)


async def test_a_revision_that_moved_without_new_events_does_not_refuse_the_claim(
    tmp_path: Path,
) -> None:
    # A touched file (mtime, ctime) has another revision but the same events: the
    # claim compares the content and goes on.
    old = write_balanced(tmp_path, "jsonl")
    async with opened(tmp_path, "jsonl") as p:
        loaded = await p.load(SID)
        probe = plain_backend(tmp_path, "jsonl")
        assert isinstance(probe, JsonlBackend)
        path = probe.locate(SID)
        assert path is not None
        before = probe.revision(SID)
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns + 10**9, st.st_mtime_ns + 10**9))
        assert probe.revision(SID) != before
        handle = await publish(p, loaded)
        await handle.append("user/message", user("mine"), surface_op="append")
        await handle.flush()
        assert [r["type"] for r in stored(tmp_path, "jsonl")[0][len(old) :]] == [
            "session/end-seed",
            "user/message",
        ]
        await p.store.detach(handle)


async def test_a_torn_tail_left_by_another_process_refuses_the_claim(tmp_path: Path) -> None:
    # The same events but torn bytes after them (another process crashed mid-write):
    # appending behind them would bury our batch behind garbage.
    old = write_balanced(tmp_path, "jsonl")
    async with closing_fails(tmp_path, "jsonl") as (p, _):
        loaded = await p.load(SID)
        jsonl = plain_backend(tmp_path, "jsonl")
        assert isinstance(jsonl, JsonlBackend)
        path = jsonl.locate(SID)
        assert path is not None
        with path.open("ab") as f:
            f.write(b'{"type":"user/mess')
        handle = await publish(p, loaded)
        await handle.append("user/message", user("mine"), surface_op="append")
        with pytest.raises(FlushError, match=CHANGED):
            await handle.flush()
    records, torn = stored(tmp_path, "jsonl")
    assert records == old and torn is not None  # untouched: the next repair cuts the tail


@pytest.mark.parametrize("kind", KINDS)
async def test_an_append_after_another_process_appended_writes_nothing(
    tmp_path: Path, kind: str
) -> None:
    old = write_balanced(tmp_path, kind)
    async with opened(tmp_path, kind) as p:
        await p.load(SID)
        theirs = other_process_appends(tmp_path, kind, len(old))
        with pytest.raises(SessionLogExistsError) as info:
            await p.append(SID, [rec(len(old), "mine")])
        assert str(info.value) == (
            f'cannot append session "{SID}": the stored log changed since it was loaded (it now holds 3 '
            "event(s), this persistence wrote or read 2; another process wrote it); nothing was written, "
            "load it again"
        )
        assert stored(tmp_path, kind) == ([*old, theirs], None)
        # Its own appends keep working: the state follows the revision each one leaves.
    async with opened(tmp_path, kind) as p:
        await p.append(SID, [rec(3, "adopted")])  # adopts the stored log afresh
        await p.append(SID, [rec(4, "then")])
        theirs2 = other_process_appends(tmp_path, kind, 5)
        with pytest.raises(SessionLogExistsError, match=CHANGED):
            await p.append(SID, [rec(5, "mine")])
    assert [r["seq"] for r in stored(tmp_path, kind)[0]] == [0, 1, 2, 3, 4, 5]
    assert stored(tmp_path, kind)[0][-1] == theirs2


# -- cancellation and I/O failures ----------------------------------------------------------


async def race_scenario(probe: Probe, kind: str, template: Path) -> None:
    """Load, another process appends, the loaded session is published and writes; a
    cancellation (explore) or a failing file step / statement (explore_io) may hit any
    step. Whatever happens, nothing of ours is stored behind the other process's event,
    the log reads, and no lock is left held."""
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
                        loaded = await p.load(SID)
                    except PersistenceError as exc:
                        probe.check(
                            probe.faults is not None, f"load failed without a fault: {exc!r}"
                        )
                        return
                    theirs.append(other_process_appends(root, kind, len(old)))
                    probe.acknowledge(SID, len(old), old + theirs)
                    with trio.CancelScope() as caller:
                        probe.canceller("caller", caller.cancel)
                        probe.arm()
                        try:
                            handle = await publish(p, loaded)
                            await handle.append("user/message", user("mine"), surface_op="append")
                            await handle.flush()
                            probe.fail("a claim wrote behind a log another process moved")
                        except FlushError as exc:
                            cause = exc.__cause__
                            probe.check(
                                isinstance(cause, SessionLogExistsError)
                                or probe.faults is not None,
                                f"the claim failed without a fault, not as a collision: {cause!r}",
                            )
                    probe.disarm()
            except PersistenceError as exc:
                # The close reports the unwritten events (or an injected fault).
                probe.check(
                    isinstance(exc, PersistenceCloseError) or probe.faults is not None,
                    f"closing failed oddly: {exc!r}",
                )
    finally:
        close_backend(backend)
    after, torn = stored(root, kind)
    probe.check(after == old + theirs, f"the stored log changed: {[r['seq'] for r in after]}")
    probe.check(torn is None, "a torn tail was left")
    check_at_rest(probe, kind)


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_the_claim_check_cancelled_at_every_checkpoint(tmp_path: Path, kind: str) -> None:
    template = tmp_path / "template"
    write_balanced(template, kind)

    async def scenario(probe: Probe) -> None:
        await race_scenario(probe, kind, template)

    report = explore(scenario, name=f"claim-race/{kind}")
    assert report.ok, report.distinct()
    assert report.steps["caller"] > 3


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_the_claim_check_with_a_failing_file_step(tmp_path: Path, kind: str) -> None:
    template = tmp_path / "template"
    write_balanced(template, kind)

    async def scenario(probe: Probe) -> None:
        await race_scenario(probe, kind, template)

    report = explore_io(scenario, backend=kind)
    assert report.ok, report.distinct()
    assert all(n > 0 for n in report.steps.values()), report.steps


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_jsonl_load_pairs_its_bytes_with_the_revision_they_were_read_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compression: str
) -> None:
    """The revision a load reports is the file's state when its bytes were read, not
    after decoding: an append landing while the log is decoded must show as a moved
    revision, or the checks before a write would miss it."""
    if compression == "zstd":
        pytest.importorskip("zstandard")
    kind = "jsonl" if compression == "none" else "jsonl-zstd"
    write_balanced(tmp_path, kind)
    backend = plain_backend(tmp_path, kind)
    other = plain_backend(tmp_path, kind)
    import harness.persistence._jsonl_read as jsonl

    real_fast_scan = jsonl._fast_scan
    appended: list[bool] = []

    def scan_while_another_process_appends(lines: list[bytes]) -> Any:
        if not appended:
            appended.append(True)
            lease = other.acquire_writer(HEADER)
            try:
                other.append(SID, [rec(2, "behind your back")], lease=lease)
            finally:
                lease.release()
        return real_fast_scan(lines)

    monkeypatch.setattr(jsonl, "_fast_scan", scan_while_another_process_appends)
    try:
        stored = backend.load(SID)
    finally:
        close_backend(other)
    assert appended
    assert [r["seq"] for r in stored.records] == [0, 1]
    assert stored.revision != backend.revision(SID)
