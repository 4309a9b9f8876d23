"""JSONL: a writer's lease keeps its log's append descriptor between batches (decision
0019). Before each use one ``stat`` of the path must name the descriptor's inode, so a
log deleted, replaced or moved away is never written behind; the descriptors are bounded
per process and closed with the lease; every write and sync on them is still a file
operation the fault layers see."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.errors import PersistedSessionNotFoundError, StorageIOError
from harness.faults import FaultyFiles
from harness.persistence import JsonlBackend
from harness.persistence._backend import GroupWrite, WriterLease
from harness.persistence._jsonl_logs import BUDGET
from tests.helpers import rec, user


def header(sid: str, cwd: str = "/w") -> dict[str, Any]:
    return {"version": 0, "id": sid, "createdAt": 5, "cwd": cwd}


def events(start: int, n: int, tag: str = "m") -> list[dict[str, Any]]:
    return [rec("user/message", i, user(f"{tag}{i}"), surfaceOp="append") for i in range(start, start + n)]


def seqs(backend: JsonlBackend, sid: str) -> list[int]:
    return [r["seq"] for r in backend.load(sid).records]


def texts(backend: JsonlBackend, sid: str) -> list[str]:
    return [r["data"]["id"] for r in backend.load(sid).records]


def open_fds_on(path: Path) -> int:
    """How many of this process's descriptors are open on ``path``'s inode."""
    target = path.stat()
    n = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            n += 1
    return n


@pytest.fixture(autouse=True)
def _budget_restored() -> Iterator[None]:
    used, limit = BUDGET.used, BUDGET.limit
    yield
    assert BUDGET.used == used, "every kept descriptor was closed (and its place given back)"
    BUDGET.limit = limit


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")


def leased(tmp_path: Path, sid: str = "s", files: FaultyFiles | None = None) -> tuple[JsonlBackend, WriterLease]:
    backend = JsonlBackend(tmp_path, files=files)
    lease = backend.acquire_writer(header(sid))
    backend.materialize(header(sid), events(0, 1), lease=lease)
    return backend, lease


def kept(tmp_path: Path, files: FaultyFiles | None = None) -> tuple[JsonlBackend, WriterLease, Path]:
    """A leased writer after one append through its lease (its descriptor is kept now),
    and the path of its log."""
    backend, lease = leased(tmp_path, files=files)
    backend.append("s", events(1, 1), lease=lease)
    log = backend.locate("s")
    assert log is not None
    return backend, lease, log


@pytest.mark.parametrize("through", ["append", "write_group"])
def test_a_leased_writer_opens_its_log_once(tmp_path: Path, through: str) -> None:
    files = FaultyFiles(kinds={"open", "write", "fsync", "syncfs", "close"})
    backend, lease = leased(tmp_path, files=files)
    log = backend.locate("s")
    assert log is not None
    start = len(files.ops)
    for i in range(1, 4):
        if through == "append":
            backend.append("s", events(i, 1), lease=lease)
        else:
            assert backend.write_group([GroupWrite("s", header("s"), events(i, 1), True, lease)]) == [None]
    ops = files.ops[start:]
    assert ops.count(("open", str(log))) == 1
    assert ops.count(("write", str(log))) == 3 and ops.count(("fsync", str(log))) == 3
    assert ("close", str(log)) not in ops
    assert open_fds_on(log) == 1
    lease.release()
    assert open_fds_on(log) == 0  # the lease's release closed it
    assert ("close", str(log)) in files.ops
    assert seqs(JsonlBackend(tmp_path), "s") == [0, 1, 2, 3]


def test_without_a_lease_the_log_is_opened_and_closed_per_batch(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    backend.materialize(header("s"), events(0, 1))
    backend.append("s", events(1, 1))
    log = backend.locate("s")
    assert log is not None and open_fds_on(log) == 0


@pytest.mark.parametrize("through", ["append", "write_group"])
def test_a_log_deleted_and_re_created_is_appended_to_by_name_not_by_the_old_descriptor(
    tmp_path: Path, through: str
) -> None:
    backend, lease = leased(tmp_path)
    backend.append("s", events(1, 1), lease=lease)  # the descriptor is kept now
    other = JsonlBackend(tmp_path)
    other.delete("s")
    other.materialize(header("s"), events(0, 2, tag="new"))  # the same path, a new inode
    if through == "append":
        backend.append("s", events(2, 1, tag="late"), lease=lease)
    else:
        assert backend.write_group([GroupWrite("s", header("s"), events(2, 1, tag="late"), True, lease)]) == [None]
    assert texts(JsonlBackend(tmp_path), "s") == ["new0", "new1", "late2"]
    lease.release()


def test_a_log_deleted_behind_a_kept_descriptor_is_not_found(tmp_path: Path) -> None:
    backend, lease, log = kept(tmp_path)
    JsonlBackend(tmp_path).delete("s")
    with pytest.raises(PersistedSessionNotFoundError, match='session "s" not found'):
        backend.append("s", events(2, 1), lease=lease)
    assert BUDGET.used == 0  # the stale descriptor was closed
    lease.release()


def test_a_log_replaced_by_rename_is_appended_to_as_renamed(tmp_path: Path) -> None:
    backend, lease, log = kept(tmp_path)
    copy = log.with_name("copy.tmp")
    shutil.copyfile(log, copy)
    os.rename(copy, log)  # same name and content, another inode
    backend.append("s", events(2, 1), lease=lease)
    assert seqs(JsonlBackend(tmp_path), "s") == [0, 1, 2]
    lease.release()


def test_a_log_moved_away_is_not_written_behind(tmp_path: Path) -> None:
    backend, lease, log = kept(tmp_path)
    moved = log.with_name("moved.jsonl")
    os.rename(log, moved)  # the inode lives on under another name: the descriptor still works
    size = moved.stat().st_size
    with pytest.raises(PersistedSessionNotFoundError):
        backend.append("s", events(2, 1), lease=lease)
    assert moved.stat().st_size == size
    lease.release()


def test_the_kept_descriptors_are_bounded_per_process(tmp_path: Path) -> None:
    BUDGET.limit = BUDGET.used + 1
    a, lease_a = leased(tmp_path, "a")
    b = JsonlBackend(tmp_path)
    lease_b = b.acquire_writer(header("b"))
    b.materialize(header("b"), events(0, 1), lease=lease_b)
    for i in range(1, 3):
        a.append("a", events(i, 1), lease=lease_a)
        b.append("b", events(i, 1), lease=lease_b)
    log_a, log_b = a.locate("a"), b.locate("b")
    assert log_a is not None and log_b is not None
    assert (open_fds_on(log_a), open_fds_on(log_b)) == (1, 0)  # b opens and closes per batch
    lease_a.release()
    b.append("b", events(3, 1), lease=lease_b)  # the freed place goes to the next append
    assert open_fds_on(log_b) == 1
    lease_b.release()
    assert seqs(JsonlBackend(tmp_path), "a") == [0, 1, 2] and seqs(JsonlBackend(tmp_path), "b") == [0, 1, 2, 3]


def test_a_failed_write_on_a_kept_descriptor_is_rolled_back_and_the_next_append_lands(tmp_path: Path) -> None:
    files = FaultyFiles(kinds={"write"})
    backend, lease, log = kept(tmp_path, files=files)
    size = log.stat().st_size
    files.fail_at = files.count + 1  # the next write: on the kept descriptor (half of it lands)
    with pytest.raises(StorageIOError, match="rolled back"):
        backend.append("s", events(2, 1), lease=lease)
    assert log.stat().st_size == size
    backend.append("s", events(2, 1), lease=lease)
    assert seqs(JsonlBackend(tmp_path), "s") == [0, 1, 2]
    lease.release()


def test_a_round_of_kept_descriptors_syncs_once(tmp_path: Path) -> None:
    files = FaultyFiles(kinds={"open", "fsync", "syncfs"})
    if files.syncfs_min is None:
        pytest.skip("no syncfs(2) that reports writeback errors here")
    backend = JsonlBackend(tmp_path, files=files)
    leases = {}
    for sid in ("a", "b", "c"):
        leases[sid] = backend.acquire_writer(header(sid))
        backend.materialize(header(sid), events(0, 1), lease=leases[sid])
    for i in range(1, 3):
        start = len(files.ops)
        assert backend.write_group(
            [GroupWrite(sid, header(sid), events(i, 1), True, leases[sid]) for sid in ("a", "b", "c")]
        ) == [None] * 3
        kinds = [k for k, _ in files.ops[start:]]
        assert kinds.count("syncfs") == 1 and "fsync" not in kinds
        assert kinds.count("open") == (3 if i == 1 else 0)
    for lease in leases.values():
        lease.release()
    assert [seqs(JsonlBackend(tmp_path), sid) for sid in ("a", "b", "c")] == [[0, 1, 2]] * 3


def test_a_lease_of_another_files_layer_keeps_nothing(tmp_path: Path) -> None:
    backend, lease = leased(tmp_path)
    other = JsonlBackend(tmp_path, files=FaultyFiles())
    other.append("s", events(1, 1), lease=lease)  # another layer opened it: not kept in this lease
    log = other.locate("s")
    assert log is not None and open_fds_on(log) == 0
    lease.release()
