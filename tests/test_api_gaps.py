"""Public API gaps users hit (issue 24 §4): a synchronous read of a live handle's
session for the pure functions, a fire-and-forget append, a synchronous inject, and
``open_runtime`` options for the checkpoint policy, the inspection-cache size and a
file layer."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import harness
from harness.agent import Agent, Say, ScriptedProvider
from harness.agent._inbox import Inbox
from harness.compaction import measure, select_compactable_range, tool_pairing_balanced_after
from harness.errors import EventError, NotJsonError, PersistenceArgumentError, SessionNotLiveError
from harness.persistence import OsFiles
from harness.runtime import open_store
from harness.session import EventDraft, thaw
from tests.helpers import assistant, user

LONG = "lorem ipsum dolor sit amet " * 40


async def test_current_session_feeds_the_pure_functions_without_private_attributes() -> None:
    async with open_store() as store:
        s = await store.create("s")
        await s.append("user/message", user("u1", LONG), surface_op="append")
        await s.append("assistant/message", assistant(1, 1, "a1", [{"type": "text", "text": LONG}]), surface_op="append")
        await s.append("user/message", user("u2", "next"), surface_op="append")
        session = s.current_session()
        measurement = measure(session)
        assert [n.seq for n in measurement.nodes] == list(s.surface())
        selected = select_compactable_range(session, measurement, 0)
        assert selected is not None and (selected.start, selected.end) == (0, 1)
        assert tool_pairing_balanced_after(session, 1)
        await store.detach(s)
        with pytest.raises(SessionNotLiveError):
            s.current_session()


async def test_append_nowait_is_queued_in_order_and_snapshots_its_data(caplog: pytest.LogCaptureFixture) -> None:
    async with open_store() as store:
        s = await store.create("s")
        data: dict[str, Any] = {"n": 1}
        s.append_nowait("note", data)
        data["n"] = 2  # after the call: never reaches the log
        s.append_nowait("note", {"n": 3})
        with pytest.raises(NotJsonError):
            s.append_nowait("note", {"bad": object()})
        with caplog.at_level(logging.WARNING, logger="actors"):
            s.append_nowait("user/message", user("u", "no surface op"))  # refused by the actor
            await s.append("note", {"n": 4})  # behind the casts
        assert [thaw(e.data) for e in s.events] == [{"n": 1}, {"n": 3}, {"n": 4}]
        assert "requires a surfaceOp marker" in caplog.text
        await store.detach(s)
        with pytest.raises(SessionNotLiveError):
            s.append_nowait("note", {})


async def test_append_nowait_refuses_data_too_deep_to_store_as_append_does() -> None:
    # The frozen copy it queues is a view, which the planner shares without a depth
    # walk: accepted, such data would fail every write-behind flush (issue 16).
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    async with open_store() as store:
        s = await store.create("s")
        with pytest.raises(NotJsonError, match="nested more than 200 levels"):
            await s.append("note", {"k": deep})
        with pytest.raises(NotJsonError, match="nested more than 200 levels"):
            s.append_nowait("note", {"k": deep})
        await s.barrier()
        assert list(s.events) == []


async def test_a_batch_item_that_is_not_an_event_draft_is_refused_and_the_session_stays_live() -> None:
    async with open_store() as store:
        s = await store.create("s")
        for drafts in ([("note", {})], [EventDraft("note", {}), ("note", {})]):
            with pytest.raises(EventError, match=r'session "s".*EventDraft'):
                await s.append_batch(drafts)  # type: ignore[list-item]
        await s.append("note", {"n": 1})  # not crashed
        assert [e.type for e in s.events] == ["note"]


async def test_inject_nowait_queues_at_once_and_its_record_rebuilds_the_same_inbox() -> None:
    async with open_store() as store, trio.open_nursery() as nursery:
        s = await store.create("s")
        agent = Agent(s, ScriptedProvider([[Say("r")]]), nursery=nursery)
        first = agent.inject_nowait("one")
        assert [m["id"] for m in agent.inbox["next-step"]] == [first]  # synchronously
        # An inbox record in flight: the inject is deferred behind it, in FIFO order.
        async with trio.open_nursery() as senders:
            async with agent._inbox_lock:  # stands for a record being written
                senders.start_soon(partial(agent.send, "two", delivery="inject"))
                await trio.testing.wait_all_tasks_blocked()  # "two" waits for the lock
                third = agent.inject_nowait("three")
                await trio.testing.wait_all_tasks_blocked()
                assert len(agent.inbox["next-step"]) == 1  # "three" waits behind "two"
        await trio.testing.wait_all_tasks_blocked()
        await s.barrier()
        texts = [m["content"][0]["text"] for m in agent.inbox["next-step"]]
        assert texts == ["one", "two", "three"] and agent.inbox["next-step"][2]["id"] == third
        rebuilt = Inbox.rebuild(s.events)
        assert [m["content"][0]["text"] for m in rebuilt.queues["next-step"]] == texts
        nursery.cancel_scope.cancel()


class CountingFiles(OsFiles):
    def __init__(self) -> None:
        self.writes = 0

    def write(self, fd: int, data: bytes) -> None:
        self.writes += 1
        super().write(fd, data)


@pytest.mark.parametrize("checkpoint", [True, False])
async def test_open_runtime_checkpoint_policy_and_file_layer(tmp_path: Path, checkpoint: bool) -> None:
    files = CountingFiles()
    provider = ScriptedProvider([[Say("hello")]])
    async with harness.open_runtime(
        tmp_path, provider=provider, files=files, write_delay=3600, checkpoint=checkpoint
    ) as rt:
        handle = await rt.create("s")
        await handle.agent.run_turn("hi")
        # With the policy, the pre-step flush wrote through the given file layer
        # during the turn; without it, the hour-long window has written nothing yet.
        assert (files.writes > 0) == checkpoint
    assert files.writes > 0  # teardown's final flush, through the same layer


async def test_open_runtime_inspection_cache_size_and_refusals(tmp_path: Path) -> None:
    with pytest.raises(PersistenceArgumentError, match="prepared_session_cache_size must be a positive integer"):
        async with harness.open_runtime(tmp_path, prepared_session_cache_size=0):
            pass
    async with harness.open_runtime(tmp_path, prepared_session_cache_size=1) as rt:
        assert rt.persistence is not None and rt.persistence._cache_size == 1
    with pytest.raises(harness.RuntimeConfigError, match="files applies to a JSONL or SQLite backend"):
        async with harness.open_runtime(files=OsFiles()):
            pass
    with pytest.raises(harness.RuntimeConfigError, match="files must be an OsFiles"):
        async with harness.open_runtime(tmp_path, files=object()):  # type: ignore[arg-type]
            pass


async def test_checkpoint_flushes_are_observable_by_listeners(tmp_path: Path) -> None:
    # Issue 24 §4: a listener sees each checkpoint flush of the policy (reference §4),
    # the tool's before its body runs, with the tool/call already durable.
    from harness.agent import Call, CheckpointContext, ToolSet, tool

    seen: list[Any] = []

    @tool("probe", "Records that it ran")
    async def probe(args: dict[str, Any]) -> str:
        seen.append("body")
        return "ok"

    provider = ScriptedProvider([[Call("probe", {})], [Say("done")]])
    async with harness.open_runtime(tmp_path, provider=provider, tools=ToolSet([probe]), write_delay=3600) as rt:
        flushed: list[int] = []
        rt.store.on_flush(lambda h: _record_flush(flushed, h))
        handle = await rt.create("s")

        def on_checkpoint(c: CheckpointContext) -> None:
            seen.append((c.point, c.step, c.call_id is not None))
            if c.point == "tool":
                calls = [e for e in handle.session.events if e.type == "tool/call"]
                assert calls and calls[-1].seq < c.durable_seq and c.call_id == thaw(calls[-1].data)["callId"]
                assert flushed and flushed[-1] == c.durable_seq  # the flush listeners ran first

        handle.agent.hooks.on_checkpoint(on_checkpoint)
        await handle.agent.run_turn("go")
    assert seen == [
        ("step", 1, False),
        ("model-request", 1, False),
        ("tool", 1, True),
        "body",
        ("step", 2, False),
        ("model-request", 2, False),
    ]


async def _record_flush(flushed: list[int], handle: Any) -> None:
    flushed.append(handle.seq)
