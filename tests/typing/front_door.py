"""Checked by mypy --strict (tests/test_typing.py; also in pyproject's mypy ``files``),
never run: the public calls an embedding application makes have precise types."""

from __future__ import annotations

from typing import assert_type

import trio
from agents.items import TResponseInputItem
from agents.memory import Session

import harness
from harness.agent import AgentHandle, AgentLoop, TurnResult
from harness.bridge import AgentsSession, RuntimeThread, TrioAgentsSession
from harness.persistence import Persistence
from harness.runtime import SessionHandle, SessionSnapshot, Store, Warnings
from harness.session import Event, MessageList


async def front_door(root: str) -> None:
    async with harness.open_runtime(root) as rt:
        assert_type(rt, harness.Runtime)
        assert_type(rt.store, Store)
        assert_type(rt.persistence, Persistence | None)
        assert_type(rt.loop, AgentLoop)
        agent = await rt.open("a", cwd="/w")
        assert_type(agent, AgentHandle)
        assert_type(await rt.create("b"), AgentHandle)
        assert_type(await rt.resume("a"), AgentHandle)
        assert_type(rt.get("a"), AgentHandle | None)
        assert_type(rt.agents(), list[AgentHandle])
        assert_type(rt.session_ids(), tuple[str, ...])
        assert_type(rt.session("a"), SessionHandle | None)
        assert_type(rt.warnings, Warnings)
        result = await agent.run_turn("hi")
        assert_type(result, TurnResult)
        assert_type(result.kind, str)
        assert_type(result.turn, int)
        assert_type(agent.snapshot(), SessionSnapshot)
        assert_type(agent.messages, MessageList)
        assert_type(agent.session_id, str)
        child = await rt.fork(agent, None, "c")
        assert_type(child, SessionHandle)
        assert_type(await child.append("feedback/record", {"x": 1}), Event)
        assert_type(await child.flush(), bool)
        session = TrioAgentsSession(rt, "sdk")
        assert_type(await session.get_items(), list[TResponseInputItem])
        assert_type(await session.pop_item(), TResponseInputItem | None)
        assert_type(await session.handle(), SessionHandle)


async def bridge() -> None:
    async with harness.open_runtime_in_thread() as portal:
        assert_type(portal, RuntimeThread)
        agent = await portal.arun(portal.runtime.open, "a")
        assert_type(agent, AgentHandle)
        assert_type(await portal.arun(agent.run_turn, "hi"), TurnResult)
        assert_type(portal.run_sync(portal.runtime.session_ids), tuple[str, ...])
        assert_type(await portal.arun_sync(lambda: 3), int)
        assert_type(portal.run(trio.sleep, 0), None)
        sdk = AgentsSession(portal, "s")
        assert_type(sdk.session_id, str)
        protocol: Session = sdk  # the SDK's protocol, structurally
        assert_type(await protocol.get_items(), list[TResponseInputItem])
