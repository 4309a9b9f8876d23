"""The front door: ``harness.open_runtime`` and per-agent settings on the agent loop."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio

import harness
from actors import Owner
from harness.agent import AgentLoopError, Call, Delay, Say, ScriptedProvider, ToolSet, tool
from harness.persistence import JsonlBackend, SqliteBackend
from harness.session import RelationalInvariants, thaw

REPO = Path(__file__).resolve().parent.parent


@tool("ping", "Answer pong")
async def ping(args: dict[str, Any]) -> Any:
    return "pong"


def texts(handle: Any) -> list[str]:
    out = []
    for e in handle.session.events:
        if e.type == "assistant/message":
            out += [b["text"] for b in thaw(e.data)["message"]["content"] if b["type"] == "text"]
    return out


def turn_ends(handle: Any) -> list[dict[str, Any]]:
    return [thaw(e.data) for e in handle.session.events if e.type == "turn/end"]


def turn_starts(handle: Any) -> list[int]:
    return [thaw(e.data)["turn"] for e in handle.session.events if e.type == "turn/start"]


async def test_in_memory_runtime_runs_a_scripted_turn() -> None:
    provider = ScriptedProvider([[Say("hello there")]])
    async with harness.open_runtime(provider=provider) as rt:
        assert rt.persistence is None
        assert rt.store.validator_factory is RelationalInvariants
        h = await rt.create("a1", cwd="/w")
        assert h.owner is rt.owner and rt.get("a1") is h and rt.agents() == [h]
        result = await h.run_turn("hi")
        assert (result.turn, result.kind) == (1, "completed")
        assert texts(h) == ["hello there"]
        with pytest.raises(AgentLoopError, match="persistence is not configured"):
            await rt.resume("a1")
    assert h.disposed


async def test_runtime_is_frozen_and_invariants_can_be_off() -> None:
    async with harness.open_runtime(invariants=False, provider=ScriptedProvider([])) as rt:
        assert rt.store.validator_factory is None
        with pytest.raises(AttributeError):
            rt.loop = None  # type: ignore[misc]


@pytest.mark.parametrize("kind", ["jsonl", "sqlite", "jsonl-instance", "sqlite-instance", "default"])
async def test_persist_and_resume_across_two_blocks(tmp_path: Path, kind: str) -> None:
    where: dict[str, Any]
    if kind == "jsonl":
        where = {"root": tmp_path, "backend": "jsonl"}
    elif kind == "default":
        where = {"root": tmp_path}
    elif kind == "sqlite":
        where = {"root": tmp_path / "s.db", "backend": "sqlite"}
    elif kind == "jsonl-instance":
        where = {"backend": JsonlBackend(tmp_path)}
    else:
        where = {"backend": SqliteBackend(tmp_path / "s.db")}
    provider = ScriptedProvider([[Say("one")], [Say("two")], [Say("three")]])
    async with harness.open_runtime(**where, provider=provider) as rt:
        assert rt.persistence is not None
        h = await rt.create("keep", cwd="/proj")
        assert (await h.run_turn("1")).turn == 1
        assert (await h.run_turn("2")).turn == 2
    async with harness.open_runtime(**where, provider=provider) as rt:
        h = await rt.resume("keep")
        assert h.session.header.cwd == "/proj"
        result = await h.run_turn("3")
        assert (result.turn, result.kind) == (3, "completed")
        assert turn_starts(h) == [1, 2, 3]
        assert texts(h) == ["one", "two", "three"]


async def test_per_agent_provider_and_tools_at_create_and_resume(tmp_path: Path) -> None:
    pa = ScriptedProvider([[Call("ping")], [Say("A got pong")], [Say("A again")]], name="pa")
    pb = ScriptedProvider([[Say("B here")], [Say("B again")]], name="pb")
    default = ScriptedProvider([], name="default")
    async with harness.open_runtime(tmp_path, provider=default, system="loop prompt") as rt:
        a = await rt.create("a", provider=pa, tools=ToolSet([ping]), system="you are A", max_tokens=64)
        b = await rt.create("b", provider=pb)
        ra, rb = await a.run_turn("go"), await b.run_turn("go")
        assert ra.kind == rb.kind == "completed"
        assert texts(a) == ["A got pong"] and texts(b) == ["B here"]
        assert default.requests == []
        assert [t.name for t in pa.requests[0].tools] == ["ping"] and pb.requests[0].tools == ()
        assert (pa.requests[0].system, pa.requests[0].max_tokens) == ("you are A", 64)
        assert (pb.requests[0].system, pb.requests[0].max_tokens) == ("loop prompt", None)
        assert a.agent.provider is pa and b.agent.provider is pb
    # Resume: the settings are not stored; each resume names its own again.
    async with harness.open_runtime(tmp_path, provider=default) as rt:
        a = await rt.resume("a", provider=pa, tools=ToolSet([ping]))
        b = await rt.resume("b", provider=pb, system="you are B")
        await a.run_turn("again")
        await b.run_turn("again")
        assert texts(a)[-1] == "A again" and texts(b)[-1] == "B again"
        assert [t.name for t in pa.requests[-1].tools] == ["ping"] and pb.requests[-1].tools == ()
        assert pa.requests[-1].system is None and pb.requests[-1].system == "you are B"
        assert default.requests == []


async def test_no_provider_anywhere_is_refused() -> None:
    async with harness.open_runtime() as rt:
        with pytest.raises(AgentLoopError, match="no model provider"):
            await rt.create("x")
        assert rt.agents() == [] and await rt.store.get("x") is None
        h = await rt.create("x", provider=ScriptedProvider([[Say("ok")]]))
        assert (await h.run_turn("hi")).kind == "completed"


async def test_per_agent_max_tokens_is_checked() -> None:
    async with harness.open_runtime(provider=ScriptedProvider([])) as rt:
        with pytest.raises(ValueError, match="max_tokens"):
            await rt.create("x", max_tokens=0)


async def test_open_agent_loop_call_sites_keep_working() -> None:
    # The old shape: one provider and tool set for every agent of the loop.
    from harness.agent import open_agent_loop
    from harness.runtime import open_store

    provider = ScriptedProvider([[Call("ping")], [Say("done")]])
    async with open_store() as store, open_agent_loop(store, provider=provider, tools=ToolSet([ping])) as loop:
        async with Owner("o") as owner:
            h = await loop.create("old", owner=owner)
            assert (await h.run_turn("go")).kind == "completed"
            assert [t.name for t in provider.requests[0].tools] == ["ping"]


async def test_leaving_the_block_aborts_a_running_turn_disposed(tmp_path: Path) -> None:
    provider = ScriptedProvider([[Say("thinking..."), Delay(0.01), Call("hang")], [Say("after")]])
    results: list[Any] = []
    started = trio.Event()

    @tool("hang", "Never returns")
    async def hang(args: dict[str, Any]) -> Any:
        started.set()
        await trio.sleep_forever()

    async def run(h: Any) -> None:
        results.append(await h.run_turn("long one"))

    async with trio.open_nursery() as nursery:
        async with harness.open_runtime(tmp_path, provider=provider) as rt:
            h = await rt.create("busy", tools=ToolSet([hang]))
            nursery.start_soon(run, h)
            await started.wait()
            assert h.agent.busy
        # The block disposed the agent, which cancelled its turn.
        assert h.disposed
    [result] = results
    assert result.kind == "aborted" and result.reason["reason"] == {"kind": "disposed"}
    # On disk the log is balanced: resume (invariants replayed) finds the turn closed.
    async with harness.open_runtime(tmp_path, provider=provider) as rt:
        h = await rt.resume("busy")
        ends = turn_ends(h)
        assert len(ends) == len(turn_starts(h)) == 1
        # The hanging call was answered (an abort error), not left open.
        results_logged = [thaw(e.data) for e in h.session.events if e.type == "tool/result"]
        assert len(results_logged) == 1 and "error" in results_logged[0]
        assert ends[0]["reason"] == {"kind": "aborted", "reason": {"kind": "disposed"}}
        assert (await h.run_turn("again")).turn == 2


async def test_agents_of_another_owner_are_disposed_too(tmp_path: Path) -> None:
    provider = ScriptedProvider([[Say("x")]])
    async with Owner("outer") as outer:
        async with harness.open_runtime(provider=provider) as rt:
            h = await rt.create("mine", owner=outer)
            assert h.owner is outer
        assert h.disposed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "postgres"}, 'backend "postgres" needs a root "postgresql://'),
        ({"backend": "cassandra"}, 'backend must be "jsonl", "sqlite", "postgres" or a Backend instance, got \'cassandra\''),
        ({"backend": "sqlite"}, "needs a root"),
        ({"backend": 42}, "Backend instance"),
        ({"backend": object()}, "no list_headers"),
        ({"root": "x", "backend": "JSONL"}, 'backend must be "jsonl"'),
        ({"invariants": "yes"}, "invariants must be"),
    ],
)
async def test_bad_arguments_raise_a_typed_error(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    if kwargs.get("root") == "x":
        kwargs["root"] = tmp_path
    with pytest.raises(harness.RuntimeConfigError, match=re.escape(message)) as info:
        async with harness.open_runtime(**kwargs):
            pytest.fail("entered")  # pragma: no cover
    assert info.value.code == "RUNTIME_CONFIG" and isinstance(info.value, ValueError)
    assert list(tmp_path.iterdir()) == []


async def test_root_and_backend_instance_together_is_refused(tmp_path: Path) -> None:
    with pytest.raises(harness.RuntimeConfigError, match="not both"):
        async with harness.open_runtime(tmp_path, JsonlBackend(tmp_path)):
            pass  # pragma: no cover


def _embedding_snippet() -> str:
    text = (REPO / "docs" / "embedding.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    [snippet] = [b for b in blocks if "open_runtime" in b and "trio.run" in b]
    return snippet


def test_the_embedding_doc_snippet_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    snippet = _embedding_snippet()
    assert len([line for line in snippet.splitlines() if line.strip()]) <= 26
    exec(compile(snippet, "docs/embedding.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.splitlines() == ["turn 1: completed", "turn 2: completed"]


async def test_a_sqlite_backend_built_by_open_runtime_is_closed_with_it(tmp_path: Path) -> None:
    """Found by the SQLite fuzz work (decision 0016): ``open_runtime`` closed only a
    PostgreSQL backend it built, so a SQLite connection it opened from a path lived until
    the collector found it (its WAL not checkpointed, the file's pages not all in it).
    Now a backend built here is closed when the block ends; one passed in is the
    caller's and stays open."""
    import gc

    db = tmp_path / "db.sqlite"
    wal = tmp_path / "db.sqlite-wal"
    gc.disable()  # the collector must not be what closes it
    try:
        async with harness.open_runtime(db, backend="sqlite", provider=ScriptedProvider([[Say("hi")]])) as rt:
            agent = await rt.create("s", cwd="/work")
            assert (await agent.run_turn("hello")).kind == "completed"
            assert wal.exists()  # the connection is open, in WAL mode
        # SQLite checkpoints and removes the WAL when its last connection closes.
        assert not wal.exists()
        mine = SqliteBackend(db)
        try:
            async with harness.open_runtime(backend=mine, provider=ScriptedProvider([[Say("again")]])) as rt:
                agent = await rt.resume("s")
                assert (await agent.run_turn("more")).kind == "completed"
            assert [h["id"] for h in mine.list_headers()] == ["s"]  # still open, still usable
        finally:
            mine.close()
    finally:
        gc.enable()
