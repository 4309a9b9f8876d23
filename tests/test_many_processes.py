"""Issue 26 (its "W13: many processes", bench W18): real processes, each one store with
persistence, bursts of appends to their own sessions of ONE shared SQLite file / ONE
PostgreSQL schema / one JSONL root. Verdict (not timing): no error surfaced to any
caller in any process (``database is locked`` included) and none reported in the
background, and afterwards every acknowledged message is in its session's stored log
exactly once, in append order (harness.bench._procs.run_many + check)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.bench._procs import check, run_many
from harness.bench._procs_worker import message
from harness.persistence import SqliteBackend

pytestmark = pytest.mark.slow

SMALL: dict[str, Any] = {"procs": 4, "sessions": 10, "rounds": 3, "burst": 4}
TOTAL = 4 * 10 * 3 * 4


def test_processes_on_one_sqlite_file_lose_nothing_and_surface_nothing(tmp_path: Path) -> None:
    verdict = run_many("sqlite", str(tmp_path / "shared.sqlite"), **SMALL)
    assert verdict.clean, verdict.summary()
    assert verdict.acked == verdict.appended == verdict.stored == TOTAL


def test_processes_on_one_jsonl_root_lose_nothing_and_surface_nothing(tmp_path: Path) -> None:
    verdict = run_many("jsonl", str(tmp_path / "root"), **SMALL)
    assert verdict.clean, verdict.summary()
    assert verdict.acked == verdict.appended == verdict.stored == TOTAL


def test_processes_on_one_postgres_schema_lose_nothing_and_surface_nothing(pg_url: str, pg_schema: str) -> None:
    pytest.importorskip("psycopg", reason="psycopg not installed: PostgreSQL tests skipped")
    verdict = run_many("postgres", f"{pg_url}#{pg_schema}", **SMALL)
    assert verdict.clean, verdict.summary()
    assert verdict.acked == verdict.appended == verdict.stored == TOTAL


def _store(path: Path, logs: dict[str, list[int]]) -> None:
    backend = SqliteBackend(path)
    try:
        for sid, ks in logs.items():
            records = [{"type": "user/message", "seq": i, "time": i, "data": message(sid, k)} for i, k in enumerate(ks)]
            backend.materialize({"version": 0, "id": sid, "createdAt": 1, "cwd": "/bench"}, records)
    finally:
        backend.close()


def _report(appended: dict[str, int], acked: dict[str, int]) -> dict[str, Any]:
    return {"proc": 0, "appended": appended, "acked": acked, "errors": []}


def test_the_reader_finds_lost_reordered_duplicated_and_unexpected_messages(tmp_path: Path) -> None:
    # The checker itself must be able to fail: logs that break each rule, written directly.
    path = tmp_path / "forged.sqlite"
    _store(path, {"ok": [0, 1, 2], "short": [0, 1], "swapped": [1, 0, 2], "twice": [0, 1, 1], "extra": [0, 1, 9]})
    report = _report({"ok": 3, "short": 3, "swapped": 3, "twice": 2, "extra": 2}, {"ok": 3, "short": 3, "swapped": 3, "twice": 2, "extra": 2})
    verdict = check("sqlite", str(path), [report], 1.0, [])
    assert not verdict.clean
    assert verdict.lost == ["short#2"]
    assert verdict.reordered == ["swapped"]
    assert verdict.duplicated == ["twice"]
    assert verdict.unexpected == ["extra: extra#9"]
    clean = check("sqlite", str(path), [_report({"ok": 3}, {"ok": 3})], 1.0, [])
    assert clean.clean, clean.summary()
    failed = check("sqlite", str(path), [{**_report({"ok": 3}, {"ok": 3}), "errors": [{"message": "database is locked"}]}], 1.0, [])
    assert not failed.clean and failed.errors[0]["message"] == "database is locked"
