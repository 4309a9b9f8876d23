"""The persistence coordinator on a live store: write path, load path, failures, locks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from harness.errors import (
    FlushError,
    PersistedSessionNotFoundError,
    PersistenceError,
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    SessionLiveError,
    SessionLockedError,
    SessionLogExistsError,
)
from harness.faults import FailingFiles
from harness.persistence import CheckpointPolicy, JsonlBackend, SqliteBackend, open_persistence
from harness.runtime import open_store
from harness.session import EventDraft
from tests.helpers import assistant, tool_call_block, user

REPO = Path(__file__).resolve().parent.parent


def transcript(root: Path) -> list[dict[str, Any]]:
    files = list(root.rglob("session.jsonl"))
    assert len(files) == 1
    return [orjson.loads(x) for x in files[0].read_bytes().splitlines()]


async def test_write_behind_window_and_flush(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=0.2):
        s = await store.create("w", cwd="/proj")
        t0 = trio.current_time()
        for i in range(20):  # 20 events 10 ms apart: one window, not reset by new events
            await s.append("feedback/record", {"i": i})
            await trio.sleep(0.01)
        assert not list(tmp_path.rglob("session.jsonl"))  # nothing yet: lazy, windowed
        for _ in range(100_000):  # the write runs on a thread: poll for it
            if list(tmp_path.rglob("session.jsonl")):
                break
            await trio.sleep(0.001)
        assert trio.current_time() - t0 >= 0.2
        lines = transcript(tmp_path)
        assert lines[0]["type"] == "session" and lines[0]["cwd"] == "/proj"
        assert [r["data"]["i"] for r in lines[1:]] == list(range(20))  # one batch
        await s.append("feedback/record", {"i": 20})
        assert await s.flush() is True  # the barrier: durable on return
        assert len(transcript(tmp_path)) == 22


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_reload_restores_the_same_log_and_surface(tmp_path: Path, kind: str) -> None:
    backend = JsonlBackend(tmp_path) if kind == "jsonl" else SqliteBackend(tmp_path / "db.sqlite")
    async with open_store() as store, open_persistence(store, backend) as p:
        s = await store.create("r", cwd="/proj", delegation_depth=1)
        await s.append_batch(
            [
                EventDraft("turn/start", {"turn": 1}),
                EventDraft("user/message", user("a"), "append"),
                EventDraft("user/message", user("b"), "append"),
                EventDraft("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
            ]
        )
        await s.commit_replace(s.surface(), "user/message", user("sum"), surface_op=__import__("harness.session", fromlist=["ReplaceOp"]).ReplaceOp(1, 2), source_event_seqs=[1, 2])
        await s.flush()
        before = (list(s.events), s.surface(), list(await s.derive_messages()))
        loaded = await p.load("r")
        assert (list(loaded.events)[:-1], loaded.surface_snapshot(), list(loaded.derive_messages())) == before
        assert loaded.events[-1].type == "session/end-seed"
        assert loaded.header.cwd == "/proj" and loaded.header.delegation_depth == 1


async def test_failed_batches_are_kept_in_order_and_retried(tmp_path: Path, failing_files: FailingFiles) -> None:
    files = failing_files  # the harness.testing fixture: a fresh FailingFiles()
    backend = JsonlBackend(tmp_path, files=files)
    async with open_store() as store, open_persistence(store, backend):
        s = await store.create("f")
        await s.append("feedback/record", {"i": 0})
        await s.flush()
        files.fail_writes = 1
        await s.append("feedback/record", {"i": 1})
        with pytest.raises(FlushError) as info:
            await s.flush()
        assert info.value.code == "FLUSH_FAILED" and isinstance(info.value.__cause__, Exception)
        assert [r.get("data", {}).get("i") for r in transcript(tmp_path)[1:]] == [0]  # rolled back, not half-written
        files.fail_fsyncs = 1
        await s.append("feedback/record", {"i": 2})
        with pytest.raises(FlushError):
            await s.flush()
        assert [r["data"]["i"] for r in transcript(tmp_path)[1:]] == [0]
        await s.append("feedback/record", {"i": 3})
        await s.flush()  # the retained batch and the new event, in order
        assert [r["data"]["i"] for r in transcript(tmp_path)[1:]] == [0, 1, 2, 3]
        assert files.injected == 2


async def test_failed_first_write_leaves_nothing_on_disk(tmp_path: Path, failing_files: FailingFiles) -> None:
    files = failing_files
    files.fail_fsyncs = 1
    backend = JsonlBackend(tmp_path, files=files)
    async with open_store() as store, open_persistence(store, backend):
        s = await store.create("g")
        await s.append("feedback/record", 1)
        with pytest.raises(FlushError):
            await s.flush()
        assert not list(tmp_path.rglob("session.jsonl")) and not list(tmp_path.rglob("*.tmp"))
        await s.flush()
        assert [r["type"] for r in transcript(tmp_path)] == ["session", "feedback/record"]


async def test_prepare_repairs_durably_and_publishes(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend):
        s = await store.create("p")
        await s.append_batch(
            [
                EventDraft("turn/start", {"turn": 1}),
                EventDraft("step/start", {"turn": 1, "step": 1}),
                EventDraft("assistant/message", assistant(blocks=[tool_call_block("c1")]), "append"),
                EventDraft("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "read", "arguments": "{}"}),
            ]
        )
        await s.flush()
    path = next(tmp_path.rglob("session.jsonl"))
    with open(path, "ab") as f:
        f.write(b'{"type":"no')  # a torn tail from a crash
    async with open_store() as store, open_persistence(store, backend) as p:
        prep = await p.prepare("p")
        assert prep.repaired == 3 and prep.session.first_live_seq == 7
        on_disk = transcript(tmp_path)  # repair is durable before publication
        assert [r["type"] for r in on_disk[1:]] == ["turn/start", "step/start", "assistant/message", "tool/call", "tool/result", "step/end", "turn/end"]
        assert on_disk[5]["data"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
        with trio.move_on_after(0.05) as waiting:
            await p.prepare("p")  # already prepared here: waits for that preparation
        assert waiting.cancelled_caught
        handle = await p.publish(prep)
        await handle.append("feedback/record", "after resume")
        await handle.flush()
        types = [r["type"] for r in transcript(tmp_path)[1:]]
        assert types[-2:] == ["session/end-seed", "feedback/record"] and types.count("session/end-seed") == 1
        with pytest.raises(SessionLiveError):
            await p.prepare("p")
    async with open_store() as store, open_persistence(store, backend) as p:
        with pytest.raises(PersistedSessionNotFoundError):
            await p.prepare("nope")


async def test_detach_without_flush_writes_everything(tmp_path: Path) -> None:
    # Regression: the retiring writer's first write used to wait for its own retirement.
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        s = await store.create("quiet")
        await s.append("feedback/record", {"text": "never flushed"})
        await store.detach(s)
        loaded = await p.load("quiet")  # waits for the retirement, then reads
        assert [e.type for e in loaded.events] == ["feedback/record", "session/end-seed"]
        prep = await p.prepare("quiet")  # the lock was released
        await prep.dispose()


async def test_checkpoint_policy_flushes_at_each_point(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=60):
        policy = CheckpointPolicy(store)
        s = await store.create("cp")
        for i, point in enumerate((policy.before_model_request, policy.at_step_boundary, policy.before_tool)):
            await s.append("feedback/record", {"i": i})
            await point(s)
            assert [r["data"]["i"] for r in transcript(tmp_path)[1:]] == list(range(i + 1))
        assert policy.flushes == 3


async def test_list_and_delete(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        a = await store.create("a", cwd="/x")
        await a.append("feedback/record", {"text": "hi"})
        await a.flush()
        assert [h["id"] for h in await p.list()] == ["a"]
        with pytest.raises(SessionLiveError):
            await p.delete("a")
        await store.detach(a)
        await p.delete("a")
        assert await p.list() == []
        with pytest.raises(PersistedSessionNotFoundError):
            await p.load("a")


async def test_disposing_a_preparation_releases_the_lock(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        s = await store.create("d")
        await s.append("feedback/record", 1)
        await s.flush()
        await store.detach(s)
        await trio.testing.wait_all_tasks_blocked()
        prep = await p.prepare("d")
        await prep.dispose()
        await prep.dispose()  # idempotent
        again = await p.prepare("d")
        assert again.session.seq == prep.session.seq
        await again.dispose()


async def test_new_session_over_an_existing_log_is_refused_at_flush(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store:
        with pytest.raises(PersistenceError, match="closing failed"):
            async with open_persistence(store, backend):
                s = await store.create("dup")
                await s.append("feedback/record", 1)
                await s.flush()
                await store.detach(s)
                s2 = await store.create("dup")
                await s2.append("feedback/record", 2)
                with pytest.raises(FlushError) as info:
                    await s2.flush()
                assert isinstance(info.value.__cause__, SessionLogExistsError)


async def test_fork_is_persisted_with_its_lineage(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        s = await store.create("parent", cwd="/proj")
        await s.append_batch([EventDraft("turn/start", {"turn": 1}), EventDraft("turn/end", {"turn": 1, "reason": {"kind": "completed"}})])
        child = await store.fork(s, 1, "child")
        await child.flush()
        loaded = await p.load("child")
        assert loaded.header.parent_session == "parent" and loaded.header.seed_length == 2 and loaded.header.cwd == "/proj"
        assert [e.type for e in loaded.events] == ["turn/start", "turn/end", "session/end-seed"]


LOCKER = textwrap.dedent(
    """
    import sys, trio
    from harness.persistence import CheckpointPolicy, JsonlBackend, SqliteBackend, open_persistence
    from harness.runtime import open_store

    async def main():
        backend = JsonlBackend(sys.argv[1]) if sys.argv[2] == "jsonl" else SqliteBackend(sys.argv[1] + "/db.sqlite")
        async with open_store() as store, open_persistence(store, backend) as p:
            prep = await p.prepare("shared")
            print("locked", flush=True)
            sys.stdin.readline()
            await prep.dispose()

    trio.run(main)
    """
)


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_two_processes_one_writer(tmp_path: Path, kind: str) -> None:
    backend = JsonlBackend(tmp_path) if kind == "jsonl" else SqliteBackend(tmp_path / "db.sqlite")
    async with open_store() as store, open_persistence(store, backend):
        s = await store.create("shared")
        await s.append("feedback/record", 1)
        await s.flush()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", LOCKER, str(tmp_path), kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert (await trio.to_thread.run_sync(child.stdout.readline)).strip() == b"locked"
        async with open_store() as store, open_persistence(store, backend) as p:
            with pytest.raises(SessionLockedError) as info:
                await p.prepare("shared")
            assert f"process {child.pid}" in str(info.value) and info.value.holder["pid"] == child.pid  # type: ignore[index]
            assert (await p.load("shared")).seq == 2  # still readable
            child.stdin.write(b"go\n")
            child.stdin.flush()
            await trio.to_thread.run_sync(child.wait)
            prep = await p.prepare("shared")  # released: now it is ours
            await prep.dispose()
    finally:
        child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


def _rec(seq: int, type_: str, data: Any = None, **extra: Any) -> dict[str, Any]:
    return {"type": type_, "seq": seq, "time": 1, "data": {} if data is None else data, **extra}


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_prepare_refuses_unknown_types_unless_ignorable(tmp_path: Path, kind: str) -> None:
    backend = JsonlBackend(tmp_path) if kind == "jsonl" else SqliteBackend(tmp_path / "s.db")
    header = {"version": 0, "id": "u", "createdAt": 1, "cwd": "/w"}
    backend.materialize(
        header,
        [_rec(0, "turn/start", {"turn": 1}), _rec(1, "future/thing", ignorable=True), _rec(2, "future/other")],
    )
    async with open_store() as store, open_persistence(store, backend) as p:
        with pytest.raises(SessionFormatUnsupportedError) as info:
            await p.prepare("u")
        assert str(info.value).startswith(
            'session "u" contains event type "future/other" (seq 2) unknown to this harness and not marked ignorable'
        )
        assert info.value.code == "SESSION_FORMAT_UNSUPPORTED"
        assert await store.get("u") is None  # nothing published
        with pytest.raises(SessionFormatUnsupportedError):
            await p.prepare("u")  # again the refusal, not SESSION_LOCKED: the lock was released


@pytest.mark.parametrize("turn_open", [True, False])
async def test_prepare_reports_a_typeless_record_as_corruption(tmp_path: Path, turn_open: bool) -> None:
    backend = JsonlBackend(tmp_path)
    header = {"version": 0, "id": "t", "createdAt": 1, "cwd": "/w"}
    first = [_rec(0, "turn/start", {"turn": 1})] if turn_open else [_rec(0, "feedback/record")]
    backend.materialize(header, [*first, {"seq": 1, "time": 1, "data": {}}])
    async with open_store() as store, open_persistence(store, backend) as p:
        with pytest.raises(SessionCorruptionError) as info:
            await p.prepare("t")
        assert info.value.code == "SESSION_CORRUPT" and 'stored session "t" failed validation' in str(info.value)
        with pytest.raises(SessionCorruptionError):
            await p.prepare("t")  # again corruption, not SESSION_LOCKED: the lock was released
