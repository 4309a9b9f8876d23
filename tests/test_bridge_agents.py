"""Issue 25 §3: the OpenAI Agents SDK's ``Session`` protocol on a harness session.

The SDK's own ``SQLiteSession`` is the oracle: the same operations give the same
answers. Then what only an append-only log gives: durable across processes (an
asyncio program writes, a Trio program resumes), pops and clears that delete
nothing (a fork before them keeps the items), and crash repair of a torn tail."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import harness
from harness.bridge import AgentsSession, RuntimeThread, TrioAgentsSession
from harness.errors import SessionArgumentError
from harness.faults import Probe, explore
from tests.helpers import user

agents = pytest.importorskip("agents")
from agents import Agent, Runner, set_tracing_disabled  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.memory import Session, SessionSettings, SQLiteSession  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import ResponseOutputMessage, ResponseOutputText  # noqa: E402

HANG = 60.0  # a hang guard, never a verdict


def item(text: str, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": text}


def run_asyncio(fn: Callable[[], Awaitable[None]]) -> None:
    async def guarded() -> None:
        await asyncio.wait_for(fn(), HANG)

    asyncio.run(guarded())


async def script(session: Any) -> list[object]:
    """The SDK session tests' behaviours, as one sequence of observations."""
    seen: list[object] = [await session.get_items(), await session.pop_item()]
    await session.add_items([item("a"), item("b", "assistant"), item("c")])
    seen += [await session.get_items(), await session.get_items(limit=2), await session.get_items(limit=0)]
    seen += [await session.get_items(limit=-1), await session.get_items(limit=10)]
    seen += [await session.pop_item(), await session.get_items()]
    await session.add_items([])
    await session.add_items([item("d")])
    seen.append(await session.get_items())
    returned = await session.get_items()
    returned[0]["content"] = "mutated by the caller"
    seen.append(await session.get_items())  # a returned list is the caller's own copy
    await session.clear_session()
    seen += [await session.get_items(), await session.pop_item()]
    await session.clear_session()  # clearing an empty session
    await session.add_items([item("e"), item("f")])
    seen += [await session.get_items(), await session.pop_item(), await session.pop_item(), await session.pop_item()]
    return seen


def test_it_implements_the_sdk_session_protocol() -> None:
    with harness.open_runtime_in_thread() as portal:
        session = AgentsSession(portal, "p")
        assert isinstance(session, Session) and session.session_id == "p"
        typed: Session = session  # mypy checks the structural match too
        assert typed is session


@pytest.mark.parametrize("backend", ["memory", "jsonl", "sqlite"])
def test_the_same_answers_as_the_sdk_sqlite_session(tmp_path: Path, backend: str) -> None:
    async def main() -> None:
        reference = SQLiteSession("ref")
        expected = await script(reference)
        reference.close()
        kwargs: dict[str, Any] = {} if backend == "memory" else {"root": tmp_path / "s", "backend": backend}
        async with harness.open_runtime_in_thread(**kwargs) as portal:
            assert await script(AgentsSession(portal, "ours")) == expected

    run_asyncio(main)


def test_session_settings_limit_is_the_default_limit() -> None:
    async def main() -> None:
        reference = SQLiteSession("ref", session_settings=SessionSettings(limit=2))
        async with harness.open_runtime_in_thread() as portal:
            ours = AgentsSession(portal, "ours", session_settings=SessionSettings(limit=2))
            for session in (reference, ours):
                await session.add_items([item("1"), item("2"), item("3")])
            assert await ours.get_items() == await reference.get_items() == [item("2"), item("3")]
            assert await ours.get_items(limit=1) == await reference.get_items(limit=1) == [item("3")]
        reference.close()

    run_asyncio(main)


def test_an_item_that_is_not_a_dict_is_refused_before_anything_is_written() -> None:
    async def main() -> None:
        async with harness.open_runtime_in_thread() as portal:
            session = AgentsSession(portal, "r")
            with pytest.raises(SessionArgumentError, match='session "r": an SDK item must be a dict'):
                await session.add_items([item("ok"), "not an item"])  # type: ignore[list-item]
            assert await session.get_items() == []

    run_asyncio(main)


class CountingModel(Model):
    """A model for the real ``Runner``: answers how many user messages it was sent."""

    def __init__(self) -> None:
        self.inputs: list[object] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        given = args[1] if len(args) > 1 else kwargs["input"]
        self.inputs.append(given)
        users = sum(1 for i in given if i.get("role") == "user") if isinstance(given, list) else 1
        text = ResponseOutputText(type="output_text", text=f"{users} user messages", annotations=[])
        message = ResponseOutputMessage(
            id=f"msg_{users}", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_an_asyncio_sdk_conversation_is_resumed_by_a_trio_program(tmp_path: Path) -> None:
    """The done criterion: asyncio stores an SDK conversation, Trio resumes it."""
    set_tracing_disabled(True)
    model = CountingModel()
    agent = Agent(name="assistant", instructions="Be brief.", model=model)

    async def asyncio_program() -> None:
        async with harness.open_runtime_in_thread(tmp_path) as portal:
            session = AgentsSession(portal, "chat-1", cwd="/app")
            assert (await Runner.run(agent, "Hello", session=session)).final_output == "1 user messages"
            assert (await Runner.run(agent, "Again", session=session)).final_output == "2 user messages"

    run_asyncio(asyncio_program)
    assert [len(i) for i in model.inputs] == [1, 3]  # the second run was sent the history

    async def trio_program() -> list[Any]:
        async with harness.open_runtime(tmp_path) as rt:
            session = TrioAgentsSession(rt, "chat-1")
            items = await session.get_items()
            handle = await session.handle()
            assert handle.header.cwd == "/app"
            return items

    items = trio.run(trio_program)
    assert [(i.get("role"), i.get("content")) for i in items][::2] == [("user", "Hello"), ("user", "Again")]
    assert [i["content"][0]["text"] for i in items[1::2]] == ["1 user messages", "2 user messages"]


async def test_pop_and_clear_delete_nothing_and_a_fork_before_them_keeps_the_items(tmp_path: Path) -> None:
    async with harness.open_runtime(tmp_path) as rt:
        session = TrioAgentsSession(rt, "log")
        await session.add_items([item("a"), item("b")])
        handle = await session.handle()
        before = len(handle.events) - 1  # inclusive: the last item event
        assert await session.pop_item() == item("b")
        await session.clear_session()
        types = [(e.type, e.ignorable) for e in handle.events]
        assert types == [
            ("openai-agents/item", True),
            ("openai-agents/item", True),
            ("openai-agents/pop", True),
            ("openai-agents/clear", True),
        ]
        child = await rt.fork(handle, before, "log-fork")
        assert await TrioAgentsSession(rt, "log-fork").get_items() == [item("a"), item("b")]
        assert await session.get_items() == []
        await child.flush()


@pytest.mark.parametrize("durable", [True, False])
async def test_two_objects_on_one_session_never_pop_the_same_item(tmp_path: Path, durable: bool) -> None:
    # As SQLiteSession's instances on one file: a pop is one step for every object on
    # the session. With the actor busy (casts queued ahead), the second object's read
    # came before the first one's removal was applied, and both returned item "b".
    async with harness.open_runtime(tmp_path) as rt:
        first = TrioAgentsSession(rt, "chat", durable=durable)
        second = TrioAgentsSession(rt, "chat", durable=durable)
        await first.add_items([item("a"), item("b")])
        handle = await first.handle()
        for i in range(3):
            handle.append_nowait("user/message", user(f"queued {i}"), surface_op="append")
        popped: list[Any] = []

        async def pop(session: TrioAgentsSession) -> None:
            popped.append(await session.pop_item())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pop, first)
            nursery.start_soon(pop, second)
        assert sorted(p["content"] for p in popped) == ["a", "b"]
        assert await first.get_items() == [] and await second.get_items() == []
        pops = [e.data["seq"] for e in handle.events if e.type == "openai-agents/pop"]
        assert sorted(pops) == [0, 1]


async def test_a_torn_tail_is_repaired_and_the_items_before_it_kept(tmp_path: Path) -> None:
    async with harness.open_runtime(tmp_path) as rt:
        await TrioAgentsSession(rt, "torn").add_items([item("kept")])
    log = tmp_path / "_no-cwd" / "torn" / "session.jsonl"
    with log.open("ab") as f:
        f.write(b'{"type":"openai-agents/item","seq":1,"time":1,"data":{"item":{"role":"us')  # a crash mid-write
    async with harness.open_runtime(tmp_path) as rt:
        session = TrioAgentsSession(rt, "torn")
        assert await session.get_items() == [item("kept")]
        await session.add_items([item("after")])
        assert await session.get_items() == [item("kept"), item("after")]


def test_a_cancelled_add_items_lands_whole_then_raises_cancelled(tmp_path: Path) -> None:
    """As the SDK's sessions: a mutation runs to its outcome, then the cancellation."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        in_flush = loop.create_future()
        async with harness.open_runtime_in_thread(tmp_path) as portal:
            gate = trio.Event()

            flushed: list[str] = []

            async def hold_the_flush(handle: object) -> None:
                loop.call_soon_threadsafe(in_flush.set_result, None)
                await gate.wait()  # a cancelled (unshielded) flush would stop here
                flushed.append("the flush ran to its end")

            session = AgentsSession(portal, "c")
            await session.add_items([item("first")])
            await portal.arun_sync(portal.runtime.store.on_flush, hold_the_flush)
            adding = asyncio.create_task(session.add_items([item("second"), item("third")]))
            await in_flush
            adding.cancel()
            await portal.arun_sync(gate.set)
            with pytest.raises(asyncio.CancelledError):
                await adding
            assert flushed == ["the flush ran to its end"]
            assert await session.get_items() == [item("first"), item("second"), item("third")]

    run_asyncio(main)


@pytest.mark.slow
def test_agents_session_ops_under_cancellation_at_every_step() -> None:
    """A cancelled operation changed nothing or everything it meant to, and what the
    session answers is what a fresh runtime reads back from disk."""

    async def scenario(probe: Probe) -> None:
        root = probe.tmp_path
        answers: list[object] = []
        async with harness.open_runtime(root) as rt:
            seeded = TrioAgentsSession(rt, "s")
            await seeded.add_items([item("a")])
        async with harness.open_runtime(root) as rt:
            session = TrioAgentsSession(rt, "s")
            with trio.CancelScope() as caller:
                probe.canceller("caller", caller.cancel)
                probe.arm()
                await session.add_items([item("b"), item("c")])
                answers.append(await session.pop_item())
                await session.clear_session()
            probe.disarm()
            now = await session.get_items()
            allowed = ([item("a")], [item("a"), item("b"), item("c")], [item("a"), item("b")], [])
            probe.check(now in allowed, f"items {now} after {answers}")
        async with harness.open_runtime(root) as rt:
            stored = await TrioAgentsSession(rt, "s").get_items()
            probe.check(stored == now, f"stored {stored}, answered {now}")

    report = explore(scenario, name="agents-session", seeds=2, stride=2)
    assert report.ok, [(v.key, v.message, n) for v, n in report.distinct()]
    assert report.steps["caller"] >= 20, report.steps


def test_the_portal_session_is_usable_without_the_sdk_types(tmp_path: Path) -> None:
    # The bridge imports nothing of the SDK at run time: a plain dict is an item.
    with harness.open_runtime_in_thread(tmp_path) as portal:
        session = AgentsSession(portal, "plain")
        portal.run(session._trio.add_items, [item("x")])
        assert portal.run(session._trio.get_items) == [item("x")]
        assert isinstance(portal, RuntimeThread)


async def test_an_event_draft_marked_ignorable_is_logged_so_and_a_bad_flag_refused() -> None:
    from harness.errors import EventError
    from harness.runtime import open_store
    from harness.session import EventDraft

    async with open_store() as store:
        s = await store.create("x")
        (event,) = await s.append_batch([EventDraft("my-extension/record", {"n": 1}, ignorable=True)])
        assert event.ignorable and s.events[0].ignorable
        with pytest.raises(EventError, match="ignorable must be a bool, got 1"):
            await s.append_batch([EventDraft("my-extension/record", {"n": 2}, ignorable=1)])  # type: ignore[arg-type]
        assert len(s.events) == 1


def test_a_stored_item_is_held_once_not_again_by_the_session_object() -> None:
    # The log keeps each item as its JSON (decision 0026); the session object folds the
    # items' seqs and decodes an item when it is read. Holding decoded copies as well
    # took 1,444 bytes per item here (the log's JSON and a tree); the log alone 574.
    import gc
    import tracemalloc

    import orjson

    from harness.bench._peer import items

    conv = items(2000)
    size = sum(len(orjson.dumps(i)) for i in conv) / len(conv)

    async def main() -> float:
        async with harness.open_runtime(None) as rt:
            session = TrioAgentsSession(rt, "held", cwd="/x")
            await session.add_items(conv[:1])
            await session.get_items()
            gc.collect()
            tracemalloc.start()
            try:
                for i in range(0, len(conv), 50):
                    await session.add_items(conv[i : i + 50])
                assert await session.get_items() == [conv[0], *conv]
                gc.collect()
                return tracemalloc.get_traced_memory()[0] / len(conv)
            finally:
                tracemalloc.stop()

    held = trio.run(main)
    assert held < 2.5 * size, f"{held:.0f} bytes retained per item of {size:.0f} bytes of JSON"
