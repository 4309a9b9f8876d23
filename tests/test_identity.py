"""One id per JSONL store root (issue #9 §2.4): checked under the root lock."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from harness.errors import (
    FlushError,
    SessionAlreadyExistsError,
    SessionIdInUseError,
    SessionLogExistsError,
)
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import open_store
from tests.helpers import rec


def header(sid: str, cwd: str) -> dict[str, Any]:
    return {"version": 0, "id": sid, "createdAt": 1, "cwd": cwd}


def test_an_id_stored_under_another_cwd_is_refused(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    backend.materialize(header("x", "/a"), [rec("feedback/record", 0, {})])
    with pytest.raises(SessionIdInUseError) as info:
        backend.materialize(header("x", "/b"), [rec("feedback/record", 0, {"other": True})])
    err = info.value
    assert err.code == "SESSION_ALREADY_EXISTS" and err.session_id == "x"
    assert isinstance(err, SessionLogExistsError) and isinstance(err, SessionAlreadyExistsError)
    existing = tmp_path / "--a--" / "x" / "session.jsonl"
    assert err.path == str(existing) and str(existing) in str(err)
    assert not (tmp_path / "--b--" / "x" / "session.jsonl").exists()
    assert backend.load("x").header["cwd"] == "/a"  # the earlier session stays loadable
    backend.delete("x")
    backend.materialize(header("x", "/b"), [rec("feedback/record", 0, {})])  # free again


def test_two_writers_racing_for_one_id_in_two_cwds(tmp_path: Path) -> None:
    for round_no in range(15):
        sid = f"race{round_no}"
        start = threading.Barrier(2)
        outcomes: list[str] = []

        def create(
            cwd: str, sid: str = sid, start: threading.Barrier = start, outcomes: list[str] = outcomes
        ) -> None:
            backend = JsonlBackend(tmp_path)  # one backend per "process": no shared memory
            start.wait()
            try:
                backend.materialize(header(sid, cwd), [rec("feedback/record", 0, {"cwd": cwd})])
                outcomes.append("created")
            except SessionIdInUseError:
                outcomes.append("refused")

        threads = [threading.Thread(target=create, args=(cwd,)) for cwd in ("/a", "/b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["created", "refused"], round_no
        assert len(list(tmp_path.glob(f"*/{sid}/session.jsonl"))) == 1
        JsonlBackend(tmp_path).load(sid)  # not "duplicate JSONL session id"


async def test_a_second_run_reusing_an_id_cannot_shadow_the_first(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend):
        s = await store.create("session-1", cwd="/first")
        await s.append("feedback/record", {"run": 1})
        await s.flush()
    async with open_store() as store:
        with pytest.raises(Exception, match="closing failed"):
            async with open_persistence(store, JsonlBackend(tmp_path)) as p:
                s = await store.create("session-1", cwd="/second")  # minted again by a new process
                await s.append("feedback/record", {"run": 2})
                with pytest.raises(FlushError) as info:
                    await s.flush()
                assert isinstance(info.value.__cause__, SessionIdInUseError)
                loaded = await p.read_session("session-1")
                assert loaded.header.cwd == "/first"
    assert [h["cwd"] for h in JsonlBackend(tmp_path).list_headers()] == ["/first"]
