"""Decision 0014: a JSONL group-commit round of many files is made durable with one
``syncfs(2)`` per filesystem (``OsFiles.sync_round``); a failed syncfs falls back to one
fdatasync per file, so each batch keeps its own verdict; layers that replace ``fsync``
only are not bypassed; ``group_sync="each"`` opts out."""

from __future__ import annotations

import errno
import os
import random
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import harness.persistence._files as files_module
from harness.errors import PersistenceArgumentError, StorageIOError
from harness.faults import FaultyFiles, PowerLossFiles
from harness.faults._group_scenario import _events
from harness.faults._group_scenario import _header as header
from harness.persistence import JsonlBackend, OsFiles
from harness.persistence._backend import GroupWrite
from harness.persistence._files import SYNCFS_MIN, SimulatedCrash

needs_syncfs = pytest.mark.skipif(SYNCFS_MIN is None, reason="no syncfs(2) that reports writeback errors here")


def records(sid: str, start: int, n: int = 1) -> list[dict[str, Any]]:
    return _events(sid, start, n)


class Recording(OsFiles):
    """Counts syncfs and fsync calls; fails the syncfs while ``fail_syncfs`` and the
    fsync of the sessions in ``failing`` (by the log's directory name)."""

    def __init__(self, least: int | None = None) -> None:
        if least is not None:
            self.syncfs_min = least
        self.syncfs_calls: list[int] = []
        self.fsyncs: list[str] = []
        self.fail_syncfs = False
        self.failing: set[str] = set()

    def syncfs(self, fds: Sequence[int]) -> None:
        self.syncfs_calls.append(len(fds))
        if self.fail_syncfs:
            raise OSError(errno.EIO, "injected syncfs failure")
        super().syncfs(fds)

    def fsync(self, fd: int) -> None:
        session = Path(os.readlink(f"/proc/self/fd/{fd}")).parent.name
        self.fsyncs.append(session)
        if session in self.failing:
            raise OSError(errno.EIO, "injected fsync failure")
        super().fsync(fd)


def seeded(root: Path, files: OsFiles, n: int, **options: Any) -> tuple[JsonlBackend, list[str]]:
    backend = JsonlBackend(root, files=files, **options)
    sids = [f"s{i}" for i in range(n)]
    for sid in sids:
        backend.materialize(header(sid), records(sid, 0))
    return backend, sids


def round_of(sids: list[str]) -> list[GroupWrite]:
    return [GroupWrite(sid, header(sid), records(sid, 1), True, None) for sid in sids]


def stored(root: Path, sid: str) -> list[int]:
    return [r["seq"] for r in JsonlBackend(root).load(sid).records]


@needs_syncfs
def test_a_round_of_many_files_is_one_syncfs_and_no_fsync(tmp_path: Path) -> None:
    files = Recording()
    backend, sids = seeded(tmp_path, files, 10)
    files.fsyncs.clear()
    assert backend.write_group(round_of(sids)) == [None] * 10
    assert files.syncfs_calls == [10]
    assert files.fsyncs == []
    assert all(stored(tmp_path, sid) == [0, 1] for sid in sids)


@needs_syncfs
def test_a_round_below_the_threshold_fsyncs_each_file(tmp_path: Path) -> None:
    assert SYNCFS_MIN is not None and SYNCFS_MIN > 2
    files = Recording()
    backend, sids = seeded(tmp_path, files, SYNCFS_MIN - 1)
    files.fsyncs.clear()
    assert backend.write_group(round_of(sids)) == [None] * len(sids)
    assert files.syncfs_calls == []
    assert sorted(files.fsyncs) == sorted(sids)


@needs_syncfs
def test_a_failed_syncfs_falls_back_to_each_file_s_own_verdict(tmp_path: Path) -> None:
    files = Recording(least=2)
    backend, sids = seeded(tmp_path, files, 4)
    files.fsyncs.clear()
    files.fail_syncfs = True
    files.failing = {"s2"}
    results = backend.write_group(round_of(sids))
    assert files.syncfs_calls == [4]
    assert set(files.fsyncs) == set(sids)  # every file got its own fdatasync (s2 its rollback's too)
    assert [i for i, r in enumerate(results) if r is not None] == [2]
    assert isinstance(results[2], StorageIOError) and "s2" in str(results[2])
    assert [stored(tmp_path, sid) for sid in sids] == [[0, 1], [0, 1], [0], [0, 1]]  # s2 rolled back


def test_group_sync_each_never_calls_syncfs(tmp_path: Path) -> None:
    files = Recording(least=2)
    backend, sids = seeded(tmp_path, files, 10, group_sync="each")
    files.fsyncs.clear()
    assert backend.write_group(round_of(sids)) == [None] * 10
    assert files.syncfs_calls == []
    assert sorted(files.fsyncs) == sorted(sids)


def test_group_sync_is_checked() -> None:
    with pytest.raises(PersistenceArgumentError, match="group_sync") as info:
        JsonlBackend("/nonexistent", group_sync="sometimes")  # type: ignore[arg-type]
    assert info.value.code == "INVALID_ARGUMENT"


def test_a_layer_that_replaces_fsync_only_is_not_bypassed(tmp_path: Path) -> None:
    class CountingFsyncs(OsFiles):
        syncfs_min = 2

        def __init__(self) -> None:
            self.fsyncs = 0

        def fsync(self, fd: int) -> None:
            self.fsyncs += 1
            super().fsync(fd)

    files = CountingFsyncs()
    backend, sids = seeded(tmp_path, files, 10)
    files.fsyncs = 0
    assert backend.write_group(round_of(sids)) == [None] * 10
    assert files.fsyncs == 10


def test_without_syncfs_the_round_fsyncs_each_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The platform has no usable syncfs (not Linux, or a kernel before 5.8): the
    # attempt fails with ENOSYS and every batch is made durable by its own fsync.
    monkeypatch.setattr(files_module, "_syncfs", None)
    files = Recording(least=2)
    backend, sids = seeded(tmp_path, files, 4)
    files.fsyncs.clear()
    assert backend.write_group(round_of(sids)) == [None] * 4
    assert files.syncfs_calls == [4]
    assert sorted(files.fsyncs) == sorted(sids)
    with pytest.raises(OSError) as info:
        OsFiles().syncfs([0])
    assert info.value.errno == errno.ENOSYS


@needs_syncfs
def test_syncfs_is_trusted_on_the_journaling_filesystems_only(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        kind = subprocess.run(["stat", "-f", "-c", "%t", str(tmp_path)], capture_output=True, text=True, check=True).stdout.strip()
        assert files_module.syncfs_is_durable(fd) == (int(kind, 16) in files_module.SYNCFS_FILESYSTEMS)
    finally:
        os.close(fd)
    if Path("/dev/shm").is_dir():
        fd = os.open("/dev/shm", os.O_RDONLY)
        try:
            assert not files_module.syncfs_is_durable(fd)  # tmpfs
        finally:
            os.close(fd)


def test_no_syncfs_below_linux_5_8() -> None:
    at_least = files_module._kernel_at_least
    assert at_least("5.8.0-1-amd64", (5, 8)) and at_least("6.18.44-fc", (5, 8)) and at_least("5.10+deb", (5, 8))
    assert not at_least("5.4.0-150-generic", (5, 8)) and not at_least("4.19.0", (5, 8))
    assert not at_least("weird", (5, 8))


@needs_syncfs
def test_one_syncfs_per_filesystem(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs a second filesystem (/dev/shm)")
    files = Recording(least=2)
    paths = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    other = shm / f"harness-syncfs-{os.getpid()}"
    other.mkdir()
    try:
        paths += [other / "d", other / "e"]
        fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) for p in paths]
        try:
            for fd in fds:
                os.write(fd, b"x\n")
            assert files.sync_round(fds) == [None] * 5
            # One syncfs for tmp_path's filesystem; tmpfs is not one whose syncfs is
            # trusted (decision 0014's list), so its two files get an fsync each.
            assert files.syncfs_calls == [3]
            assert len(files.fsyncs) == 2
        finally:
            for fd in fds:
                os.close(fd)
    finally:
        for p in other.iterdir():
            p.unlink()
        other.rmdir()


@needs_syncfs
def test_the_fault_layers_see_the_syncfs_as_one_step_and_failing_it_loses_nothing(tmp_path: Path) -> None:
    dry = FaultyFiles()
    backend, sids = seeded(tmp_path / "dry", dry, 3)
    first = dry.count
    assert backend.write_group(round_of(sids)) == [None] * 3
    round_ops = dry.ops[first:]
    assert [kind for kind, _ in round_ops].count("syncfs") == 1
    assert not any(kind == "fsync" for kind, _ in round_ops)
    at = first + 1 + [kind for kind, _ in round_ops].index("syncfs")

    failing = FaultyFiles(fail_at=at)
    backend, sids = seeded(tmp_path / "fail", failing, 3)
    assert backend.write_group(round_of(sids)) == [None] * 3  # the fallback fsyncs
    assert failing.injected == [(at, "syncfs", failing.injected[0][2])]
    assert [kind for kind, _ in failing.ops[at:]].count("fsync") == 3
    assert all(stored(tmp_path / "fail", sid) == [0, 1] for sid in sids)


def _crash_round(root: Path, crash_at: int, seed: int) -> list[list[int]]:
    files = PowerLossFiles(crash_at=crash_at)
    backend, sids = seeded(root, files, 3)
    with pytest.raises(SimulatedCrash):
        backend.write_group(round_of(sids))
        backend.write_group(round_of(sids)[:1])  # a crash point after the round, to be sure
    files.apply(random.Random(seed))
    return [stored(root, sid) for sid in sids]


@needs_syncfs
def test_a_power_cut_keeps_the_round_once_its_syncfs_returned(tmp_path: Path) -> None:
    dry = PowerLossFiles(crash_at=None)
    backend, sids = seeded(tmp_path / "dry", dry, 3)
    first = dry.count
    backend.write_group(round_of(sids))
    at = first + 1 + [kind for kind, _ in dry.ops[first:]].index("syncfs")
    lost_somewhere = False
    for seed in range(8):
        # Crash at the first point after the syncfs: the round is durable, in every
        # way the power cut may leave the disk.
        after = _crash_round(tmp_path / f"after{seed}", at + 1, seed)
        assert all(log[:2] == [0, 1] for log in after), (seed, after)
        # Crash at the syncfs itself: nothing of the round was made durable, and some
        # ways of cutting the power lose it (so the check above can fail).
        before = _crash_round(tmp_path / f"before{seed}", at, seed)
        assert all(log in ([0], [0, 1]) for log in before), (seed, before)
        lost_somewhere |= any(log == [0] for log in before)
    assert lost_somewhere
