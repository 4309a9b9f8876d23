"""Where attempts keep their scratch files: ``Settings.scratch``, and the built-in
scenarios' choice (memory for the statement-faulted kinds, the disk for JSONL)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import attrs
import pytest
import trio

from harness.faults import Probe, Scenario, Settings, _scratch, builtin_scenarios, explore
from harness.faults._scratch import MEMORY_SCRATCH, scratch_dir


def _memory_usable() -> bool:
    try:
        st = os.statvfs(MEMORY_SCRATCH)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= 256 * 1024 * 1024 and os.access(MEMORY_SCRATCH, os.W_OK | os.X_OK)


def _record_tmp(seen: list[Path]) -> Scenario:
    async def scenario(probe: Probe) -> None:
        seen.append(probe.tmp_path)
        (probe.tmp_path / "data").write_bytes(b"x")
        with trio.CancelScope() as scope:
            probe.canceller("caller", scope.cancel)
            probe.arm()
            for _ in range(3):
                await trio.lowlevel.checkpoint()
        probe.disarm()

    return Scenario(name="scratch", run=scenario, settings=Settings())


def test_each_attempt_makes_its_tmp_path_in_the_scratch_directory_and_removes_it(tmp_path: Path) -> None:
    seen: list[Path] = []
    spec = _record_tmp(seen)
    report = explore(attrs.evolve(spec, settings=Settings(scratch=str(tmp_path))), seeds=[0], confirm=False)
    assert report.ok and report.attempts >= 2
    assert len(seen) == report.attempts and len(set(seen)) == len(seen)
    assert all(p.parent == tmp_path for p in seen)
    assert list(tmp_path.iterdir()) == []  # each attempt's directory is gone after it


def test_without_a_scratch_directory_attempts_use_the_system_temporary_directory() -> None:
    seen: list[Path] = []
    report = explore(_record_tmp(seen), seeds=[0], confirm=False)
    assert report.ok and seen
    assert all(p.parent == Path(tempfile.gettempdir()) for p in seen)


def test_the_builtin_statement_kinds_use_memory_and_the_file_kinds_the_disk() -> None:
    by_kind = {s.backend: s.settings for s in builtin_scenarios() if s.name.startswith("resume/")}
    by_kind.update({s.backend: s.settings for s in builtin_scenarios() if s.name.startswith("lifecycle/")})
    assert by_kind["jsonl"] is not None and by_kind["jsonl"].scratch is None
    assert by_kind["jsonl-zstd"] is not None and by_kind["jsonl-zstd"].scratch is None
    memory = str(MEMORY_SCRATCH) if _memory_usable() else None
    assert by_kind["sqlite"] is not None and by_kind["sqlite"].scratch == memory
    assert by_kind["postgres"] is not None and by_kind["postgres"].scratch == memory


def test_memory_is_left_out_when_it_is_missing_or_small(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(path: object) -> os.statvfs_result:
        raise FileNotFoundError(path)

    monkeypatch.setattr(_scratch.os, "statvfs", missing)
    assert scratch_dir("sqlite") is None

    small = os.statvfs_result((4096, 4096, 1000, 1000, 1000, 100, 100, 100, 0, 255))
    monkeypatch.setattr(_scratch.os, "statvfs", lambda path: small)  # 4 MB free
    assert scratch_dir("sqlite") is None

    roomy = os.statvfs_result((4096, 4096, 10**6, 10**6, 10**6, 100, 100, 100, 0, 255))
    monkeypatch.setattr(_scratch.os, "statvfs", lambda path: roomy)
    monkeypatch.setattr(_scratch.os, "access", lambda path, mode: False)  # not writable
    assert scratch_dir("sqlite") is None
    monkeypatch.setattr(_scratch.os, "access", lambda path, mode: True)
    assert scratch_dir("sqlite") == str(MEMORY_SCRATCH) and scratch_dir("postgres") == str(MEMORY_SCRATCH)
    assert scratch_dir("jsonl") is None and scratch_dir("jsonl-zstd") is None
