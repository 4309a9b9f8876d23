"""The fault layer under both backends, and the persistence failure paths (issue #9 §2.3)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import sqlite3
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

import harness.persistence._writer as writer_module
from harness.errors import (
    FlushError,
    HarnessError,
    PersistenceError,
    PreparationDisposedError,
    RecordEncodingError,
    SessionLockedError,
    SessionNotLiveError,
    StorageIOError,
    WriterWedgedError,
)
from harness.faults import (
    MUTATING_KINDS,
    POWER_LOSS_KINDS,
    FaultyFiles,
    PowerLossFiles,
    SimulatedCrash,
    SqliteFaults,
)
from harness.persistence import JsonlBackend, OsFiles, SqliteBackend, open_persistence
from harness.persistence._jsonl import LOCKFILE
from harness.persistence._writer import Leftover
from harness.runtime import open_store
from harness.session import EventDraft
from tests.helpers import rec, user

H: dict[str, Any] = {"version": 0, "id": "s", "createdAt": 1, "cwd": "/w"}


def events(start: int, n: int) -> list[dict[str, Any]]:
    return [rec("user/message", i, user(f"m{i}"), surfaceOp="append") for i in range(start, start + n)]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def on_disk(root: Path, sid: str = "s") -> list[Any]:
    """The stored records as a fresh, fault-free backend reads them."""
    return JsonlBackend(root).load(sid).records


# -- Part A: the fault layer itself ----------------------------------------------------------


def jsonl_scenario(backend: JsonlBackend, acked: list[dict[str, Any]]) -> None:
    """Lock, first write, two appends, a repair append, release: every op kind."""
    lease = backend.acquire_writer(H)
    try:
        for batch in (events(0, 2), events(2, 2), events(4, 1)):
            if not acked:
                backend.materialize(H, batch)
            else:
                backend.append("s", batch)
            acked.extend(batch)
    finally:
        lease.release()


def test_faulty_files_sees_every_mutating_operation(tmp_path: Path) -> None:
    files = FaultyFiles()
    backend = JsonlBackend(tmp_path / "root", files=files)
    jsonl_scenario(backend, [])
    backend.delete("s")
    # JSONL never renames; a syncfs makes a round of several files durable, and this
    # is one session (tests/test_syncfs_rounds.py counts it).
    assert {kind for kind, _ in files.ops} == MUTATING_KINDS - {"rename", "syncfs"}
    assert files.count == len(files.ops) and not files.injected
    assert any(kind == "lock" and path.endswith(LOCKFILE) for kind, path in files.ops)
    assert ("unlink", str(tmp_path / "root" / "--w--" / "s" / "session.jsonl")) in files.ops


def test_failing_each_jsonl_operation_is_typed_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    dry = FaultyFiles()
    jsonl_scenario(JsonlBackend(tmp_path / "dry", files=dry), [])
    assert dry.count > 15
    for k in range(1, dry.count + 1):
        root = tmp_path / f"k{k}"
        files = FaultyFiles(fail_at=k, error=errno.ENOSPC)
        acked: list[dict[str, Any]] = []
        before = open_fds()
        try:
            jsonl_scenario(JsonlBackend(root, files=files), acked)
        except HarnessError as exc:  # never a raw OSError
            assert isinstance(exc, StorageIOError), (k, files.injected, exc)
        else:
            # Only best-effort cleanups may fail silently: the temp file's unlink
            # (reference §1.4) and blanking the lock file's holder at release.
            kind, path = files.injected[0][1:]
            assert (kind, path.endswith(".tmp")) == ("unlink", True) or (kind, path.endswith(LOCKFILE)) == (
                "ftruncate",
                True,
            ), files.injected
        assert files.injected and files.injected[0][0] == k
        assert open_fds() == before, (k, files.injected)  # no descriptor leaks on any path
        if acked:
            stored = JsonlBackend(root).load("s")
            assert stored.records[: len(acked)] == acked, (k, files.injected)
            assert stored.truncate_to is None, (k, files.injected)  # nothing half-written stays


def test_sqlite_faults_see_every_statement_and_failures_are_typed(tmp_path: Path) -> None:
    dry = SqliteFaults()
    backend = SqliteBackend(tmp_path / "dry.db", faults=dry)
    lease = backend.acquire_writer(H)
    backend.materialize(H, events(0, 2), lease=lease)
    backend.append("s", events(2, 1), lease=lease)
    writes = dry.count  # statements up to the release
    lease.release()
    backend.close()
    kinds = {sql.split()[0] for sql in dry.statements}
    assert {"PRAGMA", "BEGIN", "COMMIT", "SELECT", "INSERT", "UPDATE", "CREATE"} <= kinds
    assert any(sql.startswith("INSERT INTO events") for sql in dry.statements)  # the executemany
    for error in ("full", "ioerr"):
        for k in range(1, writes + 1):
            faults = SqliteFaults(fail_at=k, error=error)
            b = SqliteBackend(tmp_path / f"{error}{k}.db", faults=faults)
            acked: list[dict[str, Any]] = []
            with pytest.raises(StorageIOError) as info:
                lease = b.acquire_writer(H)
                b.materialize(H, events(0, 2), lease=lease)
                acked = events(0, 2)
                b.append("s", events(2, 1), lease=lease)
            cause = info.value.__cause__
            assert isinstance(cause, sqlite3.OperationalError), (k, faults.injected)
            expected = sqlite3.SQLITE_FULL if error == "full" else sqlite3.SQLITE_IOERR
            assert cause.sqlite_errorcode == expected
            b.close()
            if acked:
                assert SqliteBackend(tmp_path / f"{error}{k}.db").load("s").records == acked


def test_power_loss_at_every_point_keeps_what_was_acknowledged(tmp_path: Path) -> None:
    dry = PowerLossFiles()
    jsonl_scenario(JsonlBackend(tmp_path / "dry", files=dry), [])
    points = dry.count
    assert points > 8 and {k for k, _ in dry.ops} <= POWER_LOSS_KINDS
    outcomes: set[int] = set()
    for k in range(1, points + 1):
        for seed in range(4):
            root = tmp_path / f"k{k}-{seed}"
            files = PowerLossFiles(crash_at=k)
            acked: list[dict[str, Any]] = []
            with pytest.raises(SimulatedCrash):
                jsonl_scenario(JsonlBackend(root, files=files), acked)
            with pytest.raises(SimulatedCrash):
                files.write(0, b"x")  # the world stopped
            files.apply(random.Random(seed))
            assert not list(root.rglob(".powerloss-*"))  # hidden links are gone
            backend = JsonlBackend(root)
            try:
                stored = backend.load("s")
            except HarnessError:
                assert not acked, (k, seed)  # only a never-acknowledged first write may vanish
                outcomes.add(-1)
                continue
            assert stored.records[: len(acked)] == acked, (k, seed, files.crash_op)
            outcomes.add(len(stored.records))
            assert not backend.lock_held(H)  # the dead process's lock went with it
            backend.acquire_writer(H).release()
    assert len(outcomes) >= 3  # the crashes landed at different moments


def test_power_loss_undoes_unsynced_directory_entries(tmp_path: Path) -> None:
    files = PowerLossFiles()
    d = tmp_path / "d"
    files.mkdir(str(d))
    files.fsync_dir(str(tmp_path))
    fd = files.open(str(d / "a"), os.O_WRONLY | os.O_CREAT, 0o600)
    files.write(fd, b"durable")
    files.fsync(fd)
    files.write(fd, b"-lost")
    files.close(fd)
    files.link(str(d / "a"), str(d / "b"))  # never made durable
    (d / "c").write_bytes(b"old")
    files.unlink(str(d / "c"))  # never made durable either
    rng = random.Random()
    rng.randint = lambda a, b: a  # type: ignore[method-assign]  # keep no pending dir op
    rng.random = lambda: 0.0  # type: ignore[method-assign]  # drop unsynced bytes
    files.apply(rng)
    assert sorted(p.name for p in d.iterdir()) == ["c"]  # a and b were never durable names
    assert (d / "c").read_bytes() == b"old"


def test_sqlite_crash_at_every_statement_keeps_commits(tmp_path: Path) -> None:
    dry = SqliteFaults()
    b = SqliteBackend(tmp_path / "dry.db", faults=dry)
    lease = b.acquire_writer(H)
    b.materialize(H, events(0, 2), lease=lease)
    b.append("s", events(2, 1), lease=lease)
    for k in range(1, dry.count + 1):
        path = tmp_path / f"c{k}.db"
        faults = SqliteFaults(crash_at=k)
        b = SqliteBackend(path, faults=faults)
        acked: list[dict[str, Any]] = []
        with pytest.raises(SimulatedCrash):
            lease = b.acquire_writer(H)
            b.materialize(H, events(0, 2), lease=lease)
            acked = events(0, 2)
            b.append("s", events(2, 1), lease=lease)
        with pytest.raises(SimulatedCrash):
            b.list_headers()
        fresh = SqliteBackend(path)
        if acked:
            assert fresh.load("s").records == acked
            assert not fresh.lock_held(H)  # the crashed holder is dead
            fresh.acquire_writer(H).release()
        fresh.close()


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_lock_held_probe(tmp_path: Path, kind: str) -> None:
    backend = JsonlBackend(tmp_path) if kind == "jsonl" else SqliteBackend(tmp_path / "s.db")
    assert not backend.lock_held(H)
    lease = backend.acquire_writer(H)
    assert backend.lock_held(H)
    with pytest.raises(SessionLockedError):
        backend.acquire_writer(H)  # the probe did not take the lock over
    lease.release()
    assert not backend.lock_held(H)


# -- Part B: §2.3 failure paths --------------------------------------------------------------


class BrokenTruncate(FaultyFiles):
    """Fails writes per ``FaultyFiles`` and, while ``truncates_fail``, every ftruncate."""

    truncates_fail = False

    def ftruncate(self, fd: int, size: int) -> None:
        if self.truncates_fail:
            raise OSError(errno.EIO, "injected ftruncate failure")
        super().ftruncate(fd, size)


async def test_failed_rollback_never_strands_later_appends(tmp_path: Path) -> None:
    files = BrokenTruncate(kinds={"write"})
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path, files=files)):
        s = await store.create("s", cwd="/w")
        await s.append("feedback/record", {"i": 0})
        await s.flush()
        files.fail_at = files.count + 1  # the next write fails half-written ...
        files.truncates_fail = True  # ... and cannot be rolled back
        await s.append("feedback/record", {"i": 1})
        with pytest.raises(FlushError, match="failed to roll back"):
            await s.flush()
        size = next(tmp_path.rglob("session.jsonl")).stat().st_size
        await s.append("feedback/record", {"i": 2})
        with pytest.raises(FlushError, match="refusing to append behind them"):
            await s.flush()  # fail closed while the torn bytes cannot be cut
        assert next(tmp_path.rglob("session.jsonl")).stat().st_size == size  # nothing landed behind them
        files.truncates_fail = False
        await s.append("feedback/record", {"i": 3})
        await s.flush()
    stored = JsonlBackend(tmp_path).load("s")
    assert stored.truncate_to is None
    assert [r["data"]["i"] for r in stored.records] == [0, 1, 2, 3]  # acknowledged, none cut off


async def test_sqlite_disk_full_is_typed_and_never_crashes_the_runtime(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    faults = SqliteFaults()
    backend = SqliteBackend(tmp_path / "s.db", faults=faults)

    def fail_next(prefix: str) -> None:
        # A write's statements, in order, as a dry run saw them: fail the INSERT.
        faults.fail_at = faults.count + write_shape.index(next(x for x in write_shape if x.startswith(prefix))) + 1

    async with open_store() as store, open_persistence(store, backend, write_delay=0.01):
        s = await store.create("s", cwd="/w")
        await s.append("feedback/record", {"i": 0})
        await s.flush()
        n = faults.count
        await s.append("feedback/record", {"i": 1})
        await s.flush()
        write_shape = faults.statements[n:]
        fail_next("INSERT INTO events")
        await s.append("feedback/record", {"i": 2})
        with pytest.raises(FlushError) as info:
            await s.flush()
        assert isinstance(info.value.__cause__, StorageIOError)
        assert isinstance(info.value.__cause__.__cause__, sqlite3.OperationalError)
        fail_next("INSERT INTO events")
        with caplog.at_level(logging.WARNING, "harness.persistence"):
            await s.append("feedback/record", {"i": 3})
            # The background window hits the full disk and logs it: waited for by what it
            # leaves (the log record), not by how long that takes.
            for _ in range(6000):  # bounds a broken run only (60 s)
                if faults.injected[1:] and any("background write" in r.getMessage() for r in caplog.records):
                    break
                await trio.sleep(0.01)
        assert any("background write" in r.getMessage() for r in caplog.records)
        await s.append("feedback/record", {"i": 4})  # the runtime is alive and well
        await s.flush()
    assert [r["data"]["i"] for r in SqliteBackend(tmp_path / "s.db").load("s").records] == [0, 1, 2, 3, 4]


async def background_failure_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Return once a background write failure was logged (the window fired and failed)."""
    for _ in range(6000):  # bounds a broken run only (60 s)
        if any("background write" in r.getMessage() for r in caplog.records):
            return
        await trio.sleep(0.01)
    raise AssertionError("no background write failure was logged")


async def test_unencodable_record_is_a_flush_error_not_a_crash(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for backend in (JsonlBackend(tmp_path / "j"), SqliteBackend(tmp_path / "s.db")):
        backend.materialize(H, events(0, 1))
        with pytest.raises(RecordEncodingError, match='session "s": event seq 1'):
            backend.append("s", [rec("feedback/record", 1, {"n": 2**70})])
        assert len(backend.load("s").records) == 1
    async with open_store() as store:
        with pytest.raises(PersistenceError, match="closing failed"):  # the poisoned batch stays
            async with open_persistence(store, JsonlBackend(tmp_path / "p"), write_delay=0.01) as p:
                s = await store.create("big", cwd="/w")
                await s.append("feedback/record", {"i": 0})
                await s.flush()
                # The session core refuses such values; a writer must survive one anyway.
                writer = p._writers["big"]
                writer.pending.append(rec("feedback/record", 1, {"n": 2**70}))
                writer.queued += 1
                writer._arm()
                with caplog.at_level(logging.WARNING, "harness.persistence"):
                    await background_failure_logged(caplog)  # the window fails: logged, not raised
                with pytest.raises(FlushError) as info:
                    await s.flush()
                assert isinstance(info.value.__cause__, RecordEncodingError)
                assert (await store.get("big")) is not None


class BuggyBackend(JsonlBackend):
    """A backend whose appends fail with an untyped exception (a bug, or a codec error)."""

    def append(self, session_id: str, records: list[dict[str, Any]], *, lease: Any = None) -> None:
        raise TypeError("Integer exceeds 64-bit range")


async def test_an_untyped_backend_failure_never_crashes_the_runtime(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with open_store() as store:
        with pytest.raises(PersistenceError, match="closing failed"):
            async with open_persistence(store, BuggyBackend(tmp_path), write_delay=0.01):
                s = await store.create("s", cwd="/w")
                await s.append("feedback/record", {"i": 0})
                await s.flush()  # the first write materializes
                with caplog.at_level(logging.WARNING, "harness.persistence"):
                    await s.append("feedback/record", {"i": 1})
                    await background_failure_logged(caplog)  # the window fails: logged, not raised
                with pytest.raises(FlushError) as info:
                    await s.flush()
                assert isinstance(info.value.__cause__, TypeError)
                assert await store.get("s") is not None


async def test_flush_after_detach_builds_no_writer(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        s = await store.create("s", cwd="/w")
        await s.append("feedback/record", 1)
        await s.flush()
        await store.detach(s)
        await p.wait_retired("s")
        with pytest.raises(SessionNotLiveError):
            await p._on_flush(s)  # the flush listener, reached after the detach
        await p.wait_retired("s")
        assert not backend.lock_held(H)
        assert "s" not in p._writers
        prep = await p.prepare("s")  # nobody holds the lock
        await prep.dispose()


async def test_flush_racing_detach_leaves_no_lock_behind(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        for i in range(20):
            sid = f"r{i}"
            s = await store.create(sid, cwd="/w")
            await s.append("feedback/record", 1)

            async def flush(s: Any = s) -> None:
                with contextlib.suppress(SessionNotLiveError):
                    await store.flush(s)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(flush)
                nursery.start_soon(store.detach, s)
            await p.wait_retired(sid)
            await trio.testing.wait_all_tasks_blocked()
            assert not backend.lock_held({**H, "id": sid}), i
            assert len(backend.load(sid).records) == 1


async def test_failed_directory_fsync_after_link_is_retried(tmp_path: Path) -> None:
    dry = FaultyFiles(kinds={"link", "fsync_dir"})
    backend = JsonlBackend(tmp_path / "dry", files=dry)
    backend.acquire_writer(H).release()
    backend.materialize(H, events(0, 1))
    after_link = [k for k, _ in dry.ops].index("link") + 2  # the directory fsync after it
    assert dry.ops[after_link - 1][0] == "fsync_dir"
    files = FaultyFiles(kinds={"link", "fsync_dir"}, fail_at=after_link)
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path / "r", files=files)) as p:
        s = await store.create("s", cwd="/w")
        await s.append("feedback/record", {"i": 0})
        with pytest.raises(FlushError, match="injected fsync_dir failure"):
            await s.flush()
        await s.append("feedback/record", {"i": 1})  # the retry carries more than was linked
        await s.flush()
        assert [e.type for e in (await p.load("s")).events] == ["feedback/record"] * 2 + ["session/end-seed"]
    assert files.ops.count(("fsync_dir", str(tmp_path / "r" / "--w--" / "s"))) >= 2


def test_a_changed_log_is_not_mistaken_for_our_unsynced_link(tmp_path: Path) -> None:
    dry = FaultyFiles(kinds={"link", "fsync_dir"})
    JsonlBackend(tmp_path / "dry", files=dry).materialize(H, events(0, 1))
    files = FaultyFiles(kinds={"link", "fsync_dir"}, fail_at=[k for k, _ in dry.ops].index("link") + 2)
    backend = JsonlBackend(tmp_path / "r", files=files)
    with pytest.raises(StorageIOError):
        backend.materialize(H, events(0, 1))
    with pytest.raises(PersistenceError, match="already exists"):
        backend.materialize(H, events(5, 1))  # not what we linked: refused as before


async def test_lock_descriptors_are_closed_on_every_failure(tmp_path: Path) -> None:
    kinds = {"open", "lock", "ftruncate", "write", "mkdir", "fsync_dir"}
    dry = FaultyFiles(kinds=kinds)
    lease = JsonlBackend(tmp_path / "dry", files=dry).acquire_writer(H)
    assert {"open", "lock", "ftruncate", "write"} <= {k for k, _ in dry.ops}
    acquire = dry.count  # (the release's own failures are best-effort, not counted here)
    lease.release()
    for k in range(1, acquire + 1):
        backend = JsonlBackend(tmp_path / f"k{k}", files=FaultyFiles(kinds=kinds, fail_at=k))
        before = open_fds()
        with pytest.raises(StorageIOError, match='locking session "s" failed'):
            backend.acquire_writer(H)
        assert open_fds() == before, dry.ops[k - 1]
        assert not backend.lock_held(H)
    backend = JsonlBackend(tmp_path / "busy")
    lease = backend.acquire_writer(H)
    before = open_fds()
    for _ in range(5):
        with pytest.raises(SessionLockedError):
            backend.acquire_writer(H)
    assert open_fds() == before
    lease.release()


def test_delete_keeps_the_lock_file(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    backend.materialize(H, events(0, 1))
    lock_path = next(tmp_path.rglob(LOCKFILE), None) or (backend.session_dir(H) / LOCKFILE)
    lease = backend.acquire_writer(H)
    early = os.open(lock_path, os.O_RDWR)  # another process opened the lock file, about to lock
    try:
        backend.delete("s")
        lease.release()
        assert lock_path.exists()
        import fcntl

        fcntl.flock(early, fcntl.LOCK_EX | fcntl.LOCK_NB)  # it gets the lock ...
        with pytest.raises(SessionLockedError):
            backend.acquire_writer(H)  # ... so nobody else may: one inode, one holder
    finally:
        os.close(early)
    first = backend.acquire_writer(H)
    with pytest.raises(SessionLockedError):
        backend.acquire_writer(H)
    first.release()


class GatedFiles(OsFiles):
    """Blocks every fsync while ``closed`` (the write thread then "hangs")."""

    def __init__(self) -> None:
        self.open_gate = threading.Event()
        self.open_gate.set()
        self.blocked = threading.Event()

    def fsync(self, fd: int) -> None:
        if not self.open_gate.is_set():
            self.blocked.set()
            self.open_gate.wait(20)
        super().fsync(fd)


async def test_waiting_for_retirement_waits_for_every_incarnation(tmp_path: Path) -> None:
    files = GatedFiles()
    backend = JsonlBackend(tmp_path, files=files)
    async with open_store() as store, open_persistence(store, backend) as p:
        first = await store.create("s", cwd="/w")
        await first.append("feedback/record", {"i": 0})
        files.open_gate.clear()
        await store.detach(first)  # its retirement hangs in fsync
        await trio.to_thread.run_sync(files.blocked.wait)
        second = await store.create("s", cwd="/w")
        await store.detach(second)  # nothing to write: retires at once
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(0.3) as scope:
            await p.wait_retired("s")
        assert scope.cancelled_caught  # the first incarnation is still writing
        files.open_gate.set()
        await p.wait_retired("s")
        assert [r["data"]["i"] for r in backend.load("s").records] == [0]
        assert not backend.lock_held(H)


async def test_disposed_preparation_is_never_published(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    backend.materialize(H, events(0, 1))
    async with open_store() as store, open_persistence(store, backend) as p:
        prep = await p.prepare("s")
        await prep.dispose()
        with pytest.raises(PreparationDisposedError) as info:
            await p.publish(prep)
        assert info.value.code == "PREPARATION_DISPOSED" and info.value.session_id == "s"
        assert await store.get("s") is None
        # Through the store directly: the created listener refuses it too.
        prepared = await store.adopt(prep.session)
        handle = await store.enter(prepared)
        with pytest.raises(PreparationDisposedError):
            await store.announce(handle)
        await store.detach(handle)
        assert not backend.lock_held(H) and "s" not in p._writers
        again = await p.prepare("s")
        handle = await p.publish(again)
        await handle.flush()
    assert [r["type"] for r in backend.load("s").records] == ["user/message", "session/end-seed"]


async def test_failed_retirement_keeps_only_what_a_retry_needs(tmp_path: Path) -> None:
    files = FaultyFiles(kinds={"write"})
    backend = JsonlBackend(tmp_path, files=files)
    async with open_store() as store, open_persistence(store, backend) as p:
        s = await store.create("s", cwd="/w")
        await s.append("feedback/record", {"i": 0})
        await s.flush()
        files.fail_at = files.count + 1
        await s.append("feedback/record", {"i": 1})
        await store.detach(s)
        await p.wait_retired("s")
        assert not p._retiring  # no writer (and no session) is kept ...
        assert [type(x) for x in p._leftovers] == [Leftover]  # ... only what a retry needs
        # (as orjson writes them: an appended event's data is its encoded JSON, decision 0023)
        assert [orjson.loads(orjson.dumps(r))["data"]["i"] for r in p._leftovers[0].pending] == [1]
        assert not backend.lock_held(H)
    # aclose retried it under a fresh lock.
    assert [r["data"]["i"] for r in backend.load("s").records] == [0, 1]


async def test_a_leftover_is_not_appended_to_a_log_that_moved_on(tmp_path: Path) -> None:
    files = FaultyFiles(kinds={"write"})
    backend = JsonlBackend(tmp_path, files=files)
    async with open_store() as store:
        with pytest.raises(PersistenceError, match="moved on since its retirement failed"):
            async with open_persistence(store, backend) as p:
                s = await store.create("s", cwd="/w")
                await s.append("feedback/record", {"i": 0})
                await s.flush()
                files.fail_at = files.count + 1
                await s.append("feedback/record", {"i": 1})
                await store.detach(s)
                await p.wait_retired("s")
                handle = await p.publish(await p.prepare("s"))  # resumed: the log grows
                await handle.flush()
    types = [r["type"] for r in backend.load("s").records]
    assert types == ["feedback/record", "session/end-seed"]  # no stale suffix appended


async def test_an_overrunning_write_wedges_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # Both halves of the bound are driven by the test, not by the machine's speed
    # (issue 24 §5): the Trio clock autojumps past WRITE_WAIT_LIMIT while the round is
    # stuck, and the injected wall clock passes it only once the round is known to be
    # stuck in its fsync. The 60 s timer only keeps a broken run from hanging.
    wall = [0.0]
    monkeypatch.setattr(writer_module, "wall_clock", lambda: wall[0])
    files = GatedFiles()
    backend = JsonlBackend(tmp_path, files=files)
    release = threading.Timer(60.0, files.open_gate.set)
    release.start()
    try:
        async with open_store() as store:
            with pytest.raises(PersistenceError, match="closing failed"):
                async with open_persistence(store, backend) as p:
                    s = await store.create("s", cwd="/w")
                    await s.append("feedback/record", {"i": 0})
                    files.open_gate.clear()

                    async def stuck_then_overdue() -> None:
                        await trio.to_thread.run_sync(files.blocked.wait)
                        wall[0] += writer_module.WRITE_WAIT_LIMIT + 1

                    async with trio.open_nursery() as n:
                        n.start_soon(stuck_then_overdue)
                        with pytest.raises(WriterWedgedError) as info:
                            await s.flush()
                    assert info.value.code == "WRITER_WEDGED" and info.value.session_id == "s"
                    files.open_gate.set()
                    # The abandoned round runs to its end: wait for the writer thread.
                    thread = p.committer.close()
                    if thread is not None:
                        await trio.to_thread.run_sync(thread.join)
                    with pytest.raises(WriterWedgedError):
                        await s.flush()  # state unknown: fails closed for good
                    await store.detach(s)
                    await p.wait_retired("s")
        assert not backend.lock_held(H)
    finally:
        release.cancel()
        files.open_gate.set()


async def test_a_resume_after_a_failed_rollback_never_reads_the_torn_batch(tmp_path: Path) -> None:
    # The failed batch's bytes are still in the file when the session is prepared
    # again in the same process: they must read as a torn tail (never acknowledged),
    # be cut by the repair, and later acknowledged appends must survive a fresh load.
    class Flaky(OsFiles):
        broken = False

        def fsync(self, fd: int) -> None:
            if self.broken:
                raise OSError(errno.EIO, "EIO fsync")
            super().fsync(fd)

        def ftruncate(self, fd: int, size: int) -> None:
            if self.broken:
                raise OSError(errno.EIO, "EIO ftruncate")
            super().ftruncate(fd, size)

    files = Flaky()
    end = {"reason": {"kind": "completed"}}
    acknowledged = -1
    with contextlib.suppress(BaseException):  # closing reports the dropped leftover
        async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path, files=files)) as p:
            s = await store.create("s", cwd="/proj")
            await s.append_batch([EventDraft("turn/start", {"turn": 1}), EventDraft("turn/end", {"turn": 1, **end})])
            await s.flush()
            files.broken = True
            await s.append_batch([EventDraft("turn/start", {"turn": 2}), EventDraft("turn/end", {"turn": 2, **end})])
            with pytest.raises(FlushError):
                await s.flush()
            await store.detach(s)
            await p.wait_retired("s")
            files.broken = False
            prep = await p.prepare("s")
            assert [e.type for e in prep.session.events] == ["turn/start", "turn/end", "session/end-seed"]
            h = await p.publish(prep)
            await h.append_batch([EventDraft("turn/start", {"turn": 3}), EventDraft("turn/end", {"turn": 3, **end})])
            await h.flush()
            acknowledged = h.seq - 1
            await store.detach(h)
            await p.wait_retired("s")
    seqs = [r["seq"] for r in JsonlBackend(tmp_path).load("s").records]
    assert acknowledged == 4 and seqs == list(range(acknowledged + 1))


async def test_a_write_wedged_while_taking_the_lock_still_releases_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # The first write hangs inside acquire_writer (the session directory's fsync): the
    # writer is retired before the thread even holds the lock. When the thread gets
    # through, the lock it took must be released, not kept for the process's life.
    # The bound's two clocks are driven by the test (autojump, an injected wall clock
    # moved once the thread is known to hang), never by the machine's speed.
    class HangingDirFsync(OsFiles):
        def __init__(self) -> None:
            self.gate = threading.Event()
            self.gate.set()
            self.blocked = threading.Event()

        def fsync_dir(self, path: str) -> None:
            if not self.gate.is_set():
                self.blocked.set()
                self.gate.wait(60)  # only keeps a broken run from hanging
            super().fsync_dir(path)

    wall = [0.0]
    monkeypatch.setattr(writer_module, "wall_clock", lambda: wall[0])
    files = HangingDirFsync()
    backend = JsonlBackend(tmp_path, files=files)
    header = {"id": "s", "cwd": "/w"}
    try:
        async with open_store() as store:
            with pytest.raises(PersistenceError):
                async with open_persistence(store, backend) as p:
                    s = await store.create("s", cwd="/w")
                    await s.append("feedback/record", {"i": 0})
                    files.gate.clear()

                    async def stuck_then_overdue() -> None:
                        await trio.to_thread.run_sync(files.blocked.wait)
                        wall[0] += writer_module.WRITE_WAIT_LIMIT + 1

                    async with trio.open_nursery() as n:
                        n.start_soon(stuck_then_overdue)
                        with pytest.raises(WriterWedgedError):
                            await s.flush()
                    await store.detach(s)
                    await p.wait_retired("s")
                    files.gate.set()
                    # The abandoned round runs to its end (and releases the lock it
                    # took): wait for the writer thread rather than for a while.
                    thread = p.committer.close()
                    if thread is not None:
                        await trio.to_thread.run_sync(thread.join)
                    assert not backend.lock_held(header)
                    prep = await p.prepare("s")
                    await prep.dispose()
    finally:
        files.gate.set()
    assert not backend.lock_held(header)


async def stored_then_prepared(store: Any, p: Any) -> Any:
    """Session "a" (cwd /w) written, detached, retired, then prepared again."""
    s = await store.create("a", cwd="/w")
    await s.append("feedback/record", {})
    await s.flush()
    await store.detach(s)
    await p.wait_retired("a")
    return await p.prepare("a")


async def test_publish_reconciles_an_enter_whose_reply_was_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from actors import ReplyOverdueError
    from harness.runtime._store import Store

    backend = JsonlBackend(tmp_path)
    header = {"id": "a", "cwd": "/w"}
    async with open_store() as store, open_persistence(store, backend) as p:
        prep = await stored_then_prepared(store, p)
        original = Store.enter

        async def overdue_enter(self: Store, prepared: Any) -> Any:
            await original(self, prepared)  # applied, but the reply never came back
            raise ReplyOverdueError("store", prepared, 30)

        monkeypatch.setattr(Store, "enter", overdue_enter)
        with pytest.raises(ReplyOverdueError):
            await p.publish(prep)
        monkeypatch.setattr(Store, "enter", original)
        # Nothing half-published: not live, lock free, preparation disposed.
        assert await store.get("a") is None and prep.disposed
        assert not backend.lock_held(header)


async def test_a_write_queued_behind_a_stuck_round_leaves_no_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Session b's round hangs in fsync on the group committer's thread; a's batch queues
    # for the next round and its bounded wait overruns before that round starts.
    # Retiring a must still release its lock (releases have threads of their own), and
    # the late round writes nothing of a's (it was withdrawn).
    monkeypatch.setattr(writer_module, "WRITE_WAIT_LIMIT", 0.2)
    files = GatedFiles()
    backend = JsonlBackend(tmp_path, files=files)
    header = {"id": "a", "cwd": "/w"}
    try:
        async with open_store() as store:
            with pytest.raises(PersistenceError):
                async with open_persistence(store, backend) as p:
                    a = await store.create("a", cwd="/w")
                    b = await store.create("b", cwd="/w")
                    for s in (a, b):
                        await s.append("feedback/record", {"i": 0})
                        await s.flush()
                    files.open_gate.clear()
                    async with trio.open_nursery() as n:
                        await b.append("feedback/record", {"i": 1})

                        async def b_flush() -> None:
                            with pytest.raises(WriterWedgedError):
                                await b.flush()

                        n.start_soon(b_flush)
                        await trio.to_thread.run_sync(files.blocked.wait)  # the gate (20 s) bounds a broken run
                        await a.append("feedback/record", {"i": 1})
                        with pytest.raises(WriterWedgedError):
                            await a.flush()
                        await store.detach(a)
                        await p.wait_retired("a")
                        assert not backend.lock_held(header)
                    files.open_gate.set()
    finally:
        files.open_gate.set()
    assert [r["seq"] for r in JsonlBackend(tmp_path).load("a").records] == [0]


async def test_publish_on_a_closed_store_still_disposes_the_preparation(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    header = {"id": "a", "cwd": "/w"}
    async with open_store() as store, open_persistence(store, backend) as p:
        prep = await stored_then_prepared(store, p)
        await store.aclose()
        with pytest.raises(HarnessError):
            await p.publish(prep)
        assert prep.disposed and not backend.lock_held(header)
