"""Issue 25 §2: one SessionNotFoundError family, and ``Runtime.open`` (get-or-create)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import harness
from harness.agent import AgentHandle, Say, ScriptedProvider
from harness.errors import (
    PersistedSessionNotFoundError,
    PersistenceError,
    SessionAlreadyExistsError,
    SessionIdError,
    SessionLogExistsError,
    SessionNotFoundError,
)
from harness.faults import Probe, explore
from tests.helpers import user


def says(n: int) -> ScriptedProvider:
    return ScriptedProvider([[Say(f"reply {i}")] for i in range(n)])


async def test_resume_of_an_unknown_id_is_a_session_not_found_error(tmp_path: Path) -> None:
    async with harness.open_runtime(tmp_path, provider=says(1)) as rt:
        with pytest.raises(SessionNotFoundError) as caught:
            await rt.resume("nobody")
    error = caught.value
    assert isinstance(error, PersistedSessionNotFoundError) and isinstance(error, PersistenceError)
    assert (error.code, error.session_id, str(error)) == ("SESSION_NOT_FOUND", "nobody", 'session "nobody" not found')


async def test_open_creates_then_returns_the_live_agent_then_resumes_the_stored_one(tmp_path: Path) -> None:
    provider = says(3)
    async with harness.open_runtime(tmp_path, provider=provider) as rt:
        first = await rt.open("a", cwd="/w")
        assert (await first.run_turn("hi")).turn == 1
        assert await rt.open("a") is first  # live: the same handle
        assert rt.loop.stats["published"] == 1
    async with harness.open_runtime(tmp_path, provider=provider) as rt:
        again = await rt.open("a")
        assert again.snapshot().header.cwd == "/w"  # resumed, not created anew
        assert (await again.run_turn("still there?")).turn == 2


async def test_open_in_memory_creates_and_an_agent_being_disposed_is_replaced() -> None:
    async with harness.open_runtime(provider=says(2)) as rt:
        first = await rt.open("m")
        await first.run_turn("one")
        await first.dispose()
        second = await rt.open("m")  # in memory nothing is stored: a new session
        assert second is not first and second.snapshot().seq == 0 and first.snapshot().seq > 0


async def test_open_waits_for_an_agent_being_disposed_then_resumes_it(tmp_path: Path) -> None:
    async with harness.open_runtime(tmp_path, provider=says(2)) as rt:
        first = await rt.open("d")
        await first.run_turn("one")
        first.agent.disposed = True  # what dispose() sets first, before its teardown runs
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.dispose)
            second = await rt.open("d")
        assert second is not first and first.disposed
        assert (await second.run_turn("two")).turn == 2


async def test_concurrent_opens_of_one_id_yield_one_agent(tmp_path: Path) -> None:
    async with harness.open_runtime(tmp_path, provider=says(1)) as rt:
        got: list[AgentHandle] = []

        async def one() -> None:
            got.append(await rt.open("shared"))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(one)
        assert len(got) == 5 and len({id(h) for h in got}) == 1
        assert rt.loop.stats["published"] == 1 and rt.session_ids() == ("shared",)
        assert rt._gate.busy() == ()  # the per-id lock is dropped with its last user


async def test_open_refuses_a_bad_id_before_anything() -> None:
    async with harness.open_runtime(provider=says(1)) as rt:
        with pytest.raises(SessionIdError):
            await rt.open("")
        with pytest.raises(SessionIdError):
            await rt.open(["unhashable"])  # type: ignore[arg-type]
        assert rt._gate.busy() == ()


@pytest.mark.slow
def test_concurrent_opens_under_cancellation_at_every_step() -> None:
    """Two opens of one stored id race; either may be cancelled at any step. Whatever
    returned is the one live agent; a cancelled open published nothing; afterwards the
    session resumes with its log intact."""

    async def scenario(probe: Probe) -> None:
        root = probe.tmp_path
        async with harness.open_runtime(root, provider=says(1)) as rt:
            seeded = await rt.create("s")
            await seeded.run_turn("seed")
            await seeded.dispose()
        results: dict[str, AgentHandle] = {}
        async with harness.open_runtime(root, provider=says(1)) as rt:
            announced: list[AgentHandle] = []
            rt.loop.on_created(announced.append)
            rt.loop.on_disposed(announced.remove)
            scopes = {name: trio.CancelScope() for name in ("first", "second")}
            for name, scope in scopes.items():
                probe.canceller(name, scope.cancel)

            async def opener(name: str) -> None:
                with scopes[name]:
                    results[name] = await rt.open("s")

            probe.arm()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(opener, "first")
                nursery.start_soon(opener, "second")
            probe.disarm()
            handles = {id(h) for h in results.values()}
            probe.check(len(handles) <= 1, f"two agents for one id: {results}")
            live = rt.get("s")
            probe.check((live is not None) == bool(results), f"live agent {live} but results {results}")
            probe.check(announced == list(results.values())[:1], f"announced {announced}, opened {results}")
            probe.check(rt._gate.busy() == (), f"locks left: {rt._gate.busy()}")
        async with harness.open_runtime(root, provider=says(1)) as rt:
            again = await rt.open("s")
            types = [e.type for e in again.snapshot().events]
            probe.check(types.count("turn/end") == 1 and types.count("turn/start") == 1, f"log changed: {types}")

    report = explore(scenario, name="runtime-open", seeds=2, stride=2)
    assert report.ok, [(v.key, v.message, n) for v, n in report.distinct()]
    assert report.steps["first"] >= 10, report.steps


async def test_create_refuses_an_id_whose_log_is_stored_and_publishes_nothing(tmp_path: Path) -> None:
    # A new user's first trap: the README's program run twice. The store alone took the
    # id, the turn failed at its first write (an id collision) and the close lost it.
    async with harness.open_runtime(tmp_path, provider=says(1)) as rt:
        await (await rt.create("a")).run_turn("hi")
    stored = (tmp_path / "_no-cwd" / "a" / "session.jsonl").read_bytes()
    async with harness.open_runtime(tmp_path, provider=says(1)) as rt:
        with pytest.raises(SessionLogExistsError) as caught:
            await rt.create("a")
        assert (caught.value.code, caught.value.session_id) == ("SESSION_LOG_EXISTS", "a")
        assert "rt.resume" in str(caught.value) and '"a"' in str(caught.value)
        assert rt.get("a") is None and rt.session_ids() == ()
        resumed = await rt.open("a")  # what the message says to do
        assert (await resumed.run_turn("again")).turn == 2
    assert (tmp_path / "_no-cwd" / "a" / "session.jsonl").read_bytes().startswith(stored)


async def test_create_of_a_live_id_is_still_the_stores_refusal(tmp_path: Path) -> None:
    async with harness.open_runtime(tmp_path, provider=says(1)) as rt:
        await rt.create("a")
        with pytest.raises(SessionAlreadyExistsError):
            await rt.create("a")


async def test_create_sees_the_log_a_detached_incarnation_is_still_writing(tmp_path: Path) -> None:
    async with harness.open_runtime(tmp_path, provider=says(1), write_delay=3600.0) as rt:
        handle = await rt.store.create("a")
        await handle.append("user/message", user("not flushed"), surface_op="append")
        await rt.store.detach(handle)  # its writer retires in the background: the log may not exist yet
        with pytest.raises(SessionLogExistsError):
            await rt.create("a")


async def test_fork_refuses_a_child_id_whose_log_is_stored(tmp_path: Path) -> None:
    async with harness.open_runtime(tmp_path, provider=says(2)) as rt:
        await (await rt.create("taken")).run_turn("hi")
    async with harness.open_runtime(tmp_path, provider=says(2)) as rt:
        parent = await rt.create("parent")
        await parent.run_turn("hi")
        with pytest.raises(SessionLogExistsError) as caught:
            await rt.fork(parent, None, "taken")
        assert caught.value.session_id == "taken" and rt.session("taken") is None
        child = await rt.fork(parent, None, "free")
        assert child.id == "free"


async def test_create_in_memory_and_a_bad_id_are_unchanged() -> None:
    async with harness.open_runtime(provider=says(1)) as rt:
        await rt.create("a")
        with pytest.raises(SessionIdError):
            await rt.create("")


@pytest.mark.slow
def test_create_of_a_stored_id_under_cancellation_at_every_step() -> None:
    """A create of a stored id, cancelled at any step: it raises Cancelled or the
    refusal, publishes nothing, and the stored log is unchanged."""

    async def scenario(probe: Probe) -> None:
        root = probe.tmp_path
        async with harness.open_runtime(root, provider=says(1)) as rt:
            await (await rt.create("s")).run_turn("seed")
        log = root / "_no-cwd" / "s" / "session.jsonl"
        before = log.read_bytes()
        async with harness.open_runtime(root, provider=says(1)) as rt:
            scope = trio.CancelScope()
            probe.canceller("caller", scope.cancel)
            outcome: list[str] = []
            probe.arm()
            with scope:
                try:
                    await rt.create("s")
                    outcome.append("created")
                except SessionLogExistsError:
                    outcome.append("refused")
            probe.disarm()
            probe.check(outcome != ["created"], "a stored id was created")
            probe.check(rt.get("s") is None and rt.session_ids() == (), f"published: {rt.session_ids()}")
        probe.check(log.read_bytes() == before, "the stored log changed")

    report = explore(scenario, name="runtime-create-stored", seeds=1, stride=1)
    assert report.ok, [(v.key, v.message, n) for v, n in report.distinct()]
    assert report.steps["caller"] >= 2, report.steps
