"""Follow-ups of review 13: scoped listeners released with their owner, stale handles
that keep their own state, typed configuration errors, owner-only demo/chat roots,
and contained failures reported on the warnings channel."""

from __future__ import annotations

import gc
import os
import stat
import weakref
from pathlib import Path
from typing import Any

import pytest
import trio

import harness
from actors import Owner
from harness.agent import (
    AgentArgumentError,
    AgentCompaction,
    Say,
    ScriptedProvider,
    open_agent_loop,
)
from harness.errors import HarnessError, SessionNotLiveError, SessionOwnerClosedError
from harness.runtime import SessionHandle, WarningReport, open_store
from harness.session import Session
from harness.testing import open_test_runtime

# -- 1. scoped listeners are released with their owner --------------------------------------


class Calls:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def created(self, h: SessionHandle) -> None:
        self.log.append(("created", h.id))

    def event(self, h: SessionHandle, e: Any) -> None:
        self.log.append(("event", h.id))

    def disposed(self, h: SessionHandle) -> None:
        self.log.append(("disposed", h.id))

    def flushed(self, h: SessionHandle) -> None:
        self.log.append(("flush", h.id))


def _register(store: Any, calls: Calls, scope: Owner) -> list[Any]:
    return [
        store.on_created(calls.created, scope=scope),
        store.on_event(calls.event, scope=scope),
        store.on_disposed(calls.disposed, scope=scope),
        store.on_flush(calls.flushed, scope=scope),
    ]


def _registered(store: Any) -> int:
    lists = store.listeners
    return sum(len(x) for x in (lists.created, lists.event, lists.disposed, lists.flush))


async def test_scoped_listeners_are_unregistered_when_their_owner_closes() -> None:
    async with open_store() as store:
        calls = Calls()
        ref = weakref.ref(calls)
        async with Owner("a") as a:
            _register(store, calls, a)
            s = await store.create("s", owner=a)
            await s.append("feedback/record", {})
            # registered after the session: still hears its disposal on close
            late = Calls()
            _register(store, late, a)
        assert ("disposed", "s") in calls.log and late.log == [("disposed", "s")]
        assert _registered(store) == 0
        # a descendant owner's scope cannot reach them either: nothing is called any more
        async with Owner("b") as b:
            t = await store.create("t", owner=b)
            await t.append("feedback/record", {})
            await t.flush()
        assert [c for c in calls.log if c[1] == "t"] == []
        del calls, late
        gc.collect()
        assert ref() is None  # nothing holds the listener


async def test_an_unsubscribe_releases_the_owner_cleanup() -> None:
    async with open_store() as store, Owner("a") as a:
        removers = _register(store, Calls(), a)
        assert len(a._cleanups) == 4
        for remove in removers:
            remove()
            remove()  # idempotent
        assert a._cleanups == {} and _registered(store) == 0


async def test_a_scoped_listener_hears_its_routing_only_sessions_until_they_are_gone() -> None:
    async with open_store() as store:
        calls = Calls()
        async with Owner("a") as a:
            _register(store, calls, a)
            prepared = await store.prepare("r")
            r = await store.enter(prepared, scope=a)  # scope only: not detached by the close
            await store.announce(r)
        assert not r.alive or a._cleanups == {}
        await r.append("feedback/record", {})
        assert calls.log == [("created", "r"), ("event", "r")]
        await store.detach(r)
        assert calls.log == [("created", "r"), ("event", "r"), ("disposed", "r")]
        assert _registered(store) == 0


async def test_a_scoped_listener_with_a_closed_or_unopened_owner_is_refused() -> None:
    async with open_store() as store:
        async with Owner("a") as a:
            pass
        with pytest.raises(SessionOwnerClosedError, match='owner "a" is closed') as info:
            store.on_event(lambda h, e: None, scope=a)
        assert info.value.code == "OWNER_CLOSED"
        with pytest.raises(SessionOwnerClosedError, match="is not open"):
            store.on_flush(lambda h: None, scope=Owner("never"))
        assert _registered(store) == 0


async def test_the_store_closing_releases_the_owner_cleanups() -> None:
    async with Owner("a") as a:
        async with open_store() as store:
            _register(store, Calls(), a)
        assert a._cleanups == {}


# -- 2. a stale handle keeps answering its own last state ----------------------------------


async def test_a_stale_handle_keeps_its_state_when_the_session_is_entered_again() -> None:
    async with open_store() as store:
        session = Session.create("s")
        first = await store.enter(await store.adopt(session))
        await first.append("feedback/record", {"n": 1})
        before = first.snapshot()
        seq, events, surface, generation = first.seq, first.events, first.surface(), first.generation
        await store.detach(first)
        second = await store.enter(await store.adopt(session))  # the same Session object
        await second.append("feedback/record", {"n": 2})
        assert second.seq == seq + 1
        assert not first.alive
        assert first.snapshot() is before or first.snapshot().seq == before.seq
        assert first.snapshot().events == before.events and first.snapshot().messages == before.messages
        assert (first.seq, len(first.events), first.generation) == (seq, len(events), generation)
        assert list(first.surface()) == list(surface)
        assert first.events_until(seq) == events
        with pytest.raises(SessionNotLiveError):
            await first.append("feedback/record", {})


async def test_a_stale_handle_derives_its_own_messages_lazily() -> None:
    async with open_store() as store:
        session = Session.create("s")
        first = await store.enter(await store.adopt(session))
        await first.append("user/message", _user("m1", "hi"), surface_op="append")
        await store.detach(first)  # never read before the detach
        second = await store.enter(await store.adopt(session))
        await second.append("user/message", _user("m2", "again"), surface_op="append")
        assert [m["id"] for m in first.snapshot().messages] == ["m1"]
        assert [m["id"] for m in second.snapshot().messages] == ["m1", "m2"]
        assert first.request_header() is None and first.last_turn() == 0


async def test_a_resumed_session_leaves_the_stale_handle_alone(tmp_path: Path) -> None:
    provider = ScriptedProvider([[Say("one")], [Say("two")]])
    async with open_test_runtime("jsonl", tmp_path, provider=provider) as rt:
        agent = await rt.create("a")
        await agent.run_turn("hi")
        stale = agent.session
        before = stale.snapshot()
        await agent.dispose()
        again = await rt.resume("a")
        await again.run_turn("more")
        assert stale.snapshot().seq == before.seq and stale.seq == before.seq
        assert again.session.seq > before.seq


def _user(mid: str, text: str) -> dict[str, object]:
    return {"id": mid, "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}


# -- 3. an owner closed while its body runs -------------------------------------------------


async def test_closing_an_owner_inside_its_body_detaches_its_sessions_and_lets_the_body_run() -> None:
    async with open_store() as store:
        async with Owner("a") as a:
            s = await store.create("s", owner=a)
            await a.aclose("done early")
            assert not s.alive
            with pytest.raises(SessionOwnerClosedError) as info:
                await store.create("t", owner=a)
            assert info.value.reason == "done early"
            with pytest.raises(SessionNotLiveError):
                await s.append("feedback/record", {})
            body_went_on = True
        assert body_went_on


# -- 4. typed configuration errors ----------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", True])
async def test_an_invalid_agent_max_tokens_is_a_typed_error(bad: object) -> None:
    provider = ScriptedProvider([[Say("x")]])
    with pytest.raises(AgentArgumentError, match=f"max_tokens must be a positive integer, got {bad!r}") as info:
        async with harness.open_runtime(provider=provider, max_tokens=bad):  # type: ignore[arg-type]
            pass  # pragma: no cover
    assert info.value.code == "INVALID_AGENT_ARGUMENT"
    assert isinstance(info.value, ValueError) and isinstance(info.value, HarnessError)
    async with harness.open_runtime(provider=provider) as rt:
        with pytest.raises(AgentArgumentError, match=repr(bad)):
            await rt.create("a", max_tokens=bad)  # type: ignore[arg-type]
        assert rt.agents() == []
    async with open_store() as store:
        with pytest.raises(AgentArgumentError):
            async with open_agent_loop(store, provider=provider, max_tokens=bad):  # type: ignore[arg-type]
                pass  # pragma: no cover


async def test_an_unknown_test_backend_is_a_runtime_config_error(tmp_path: Path) -> None:
    with pytest.raises(harness.RuntimeConfigError, match="'postgresql'") as info:
        async with open_test_runtime("postgresql", tmp_path):  # type: ignore[arg-type]
            pass  # pragma: no cover
    assert info.value.code == "RUNTIME_CONFIG" and isinstance(info.value, ValueError)


@pytest.mark.parametrize("kind", ["file", "under-a-file", "instance", "empty", "empty-sqlite"])
async def test_a_jsonl_root_that_cannot_be_a_directory_is_a_runtime_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # It used to enter, create, then fail the turn (FLUSH_FAILED "Not a directory") and
    # the close (PersistenceCloseError); "" wrote into the current directory.
    from harness import _runtime_api
    from harness.persistence import JsonlBackend

    checked_on_trio: list[bool] = []
    check = _runtime_api._check_jsonl_root

    def spy(root: Path, given: object) -> None:
        checked_on_trio.append(trio.lowlevel.in_trio_run())
        check(root, given)

    monkeypatch.setattr(_runtime_api, "_check_jsonl_root", spy)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a directory\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    root: Any = {"file": tmp_path / "afile", "under-a-file": str(tmp_path / "afile" / "sub")}.get(kind, "")
    backend: Any = {"instance": JsonlBackend(tmp_path / "afile"), "empty-sqlite": "sqlite"}.get(kind)
    if kind == "instance":
        root = None
    with pytest.raises(harness.RuntimeConfigError) as info:
        async with harness.open_runtime(root, backend, provider=ScriptedProvider([[Say("x")]])):
            pass  # pragma: no cover
    assert info.value.code == "RUNTIME_CONFIG"
    if kind.startswith("empty"):
        assert str(info.value) == "root must be a non-empty path, got '' (None for an in-memory runtime)"
    else:
        assert f"{str(tmp_path / 'afile')!r} is a file" in str(info.value)
        assert ("its ancestor" in str(info.value)) == (kind == "under-a-file")
        assert checked_on_trio == [False]  # the stat ran on a worker thread
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created
    async with harness.open_runtime(tmp_path / "new" / "root", provider=ScriptedProvider([[Say("x")]])) as rt:
        assert (await (await rt.create("a")).run_turn("hi")).kind == "completed"  # a root yet to exist is fine


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), "0.2", True, None])
async def test_an_invalid_write_delay_is_a_runtime_config_error(tmp_path: Path, bad: object) -> None:
    with pytest.raises(harness.RuntimeConfigError, match="write_delay") as info:
        async with harness.open_runtime(tmp_path / "s", write_delay=bad):  # type: ignore[arg-type]
            pass  # pragma: no cover
    assert repr(bad) in str(info.value)
    assert not (tmp_path / "s").exists()  # refused before anything opened


async def test_a_zero_write_delay_is_accepted(tmp_path: Path) -> None:
    async with harness.open_runtime(tmp_path / "s", write_delay=0):
        pass


# -- 5. the demo and the chat leave owner-only directories ----------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_demo_creates_owner_only_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.demo import run_demo

    old = os.umask(0o022)
    try:
        root = tmp_path / "new" / "demo"
        assert run_demo(str(root)) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    assert _mode(tmp_path / "new") == 0o700 and _mode(root) == 0o700
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        assert _mode(d) == 0o700, d


async def test_the_chat_creates_an_owner_only_root(tmp_path: Path) -> None:
    from tests.test_chat import run_chat

    root = tmp_path / "new" / "store"
    code, out = await run_chat(tmp_path, "", "--root", str(root), "--list", "--provider", "scripted")
    assert code == 0, out
    assert _mode(tmp_path / "new") == 0o700 and _mode(root) == 0o700


def test_private_dirs_leave_an_existing_directory_alone(tmp_path: Path) -> None:
    from harness.demo import make_private_dirs

    existing = tmp_path / "mine"
    existing.mkdir(mode=0o755)
    os.chmod(existing, 0o755)
    make_private_dirs(existing / "a" / "b")
    assert _mode(existing) == 0o755
    assert _mode(existing / "a") == 0o700 and _mode(existing / "a" / "b") == 0o700


# -- 6. contained failures reach the warnings channel ---------------------------------------


async def test_a_failing_compaction_hook_is_reported_on_the_warnings_channel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(self: Any, agent: Any, reason: str) -> None:
        raise RuntimeError("summariser exploded")

    monkeypatch.setattr(AgentCompaction, "compact_if_needed", boom)
    provider = ScriptedProvider([[Say("one")]])
    reports: list[WarningReport] = []
    async with harness.open_runtime(provider=provider, compaction=AgentCompaction()) as rt:
        rt.warnings.subscribe(reports.append)
        agent = await rt.create("a")
        result = await agent.run_turn("hi")
        assert result.kind == "completed"
    mine = [r for r in reports if r.source == "agent/compaction"]
    assert len(mine) == 1 and mine[0].kind == "listener-failed"
    assert mine[0].session_id == "a" and isinstance(mine[0].error, RuntimeError)
    assert "step compaction failed" in mine[0].message
    assert "step compaction failed" in caplog.text


async def test_an_async_status_listener_result_is_refused_and_reported() -> None:
    provider = ScriptedProvider([[Say("one")]])
    reports: list[WarningReport] = []
    async with harness.open_runtime(provider=provider) as rt:
        rt.warnings.subscribe(reports.append)
        agent = await rt.create("a")

        async def later() -> None:
            pass  # pragma: no cover

        agent.agent.hooks.on_status(lambda a, s: later())  # type: ignore[arg-type]
        await agent.run_turn("hi")
        await trio.lowlevel.checkpoint()
    status = [r for r in reports if r.source == "agent/status"]
    assert status and all(r.error is not None and r.error.code == "ASYNC_LISTENER" for r in status)  # type: ignore[attr-defined]
