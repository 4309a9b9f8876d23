"""Child process for the agent end-to-end test.

``first``: create agent "e2e", run turn 1 (a tool call, then an answer), then start
turn 2 whose tool hangs; print ``hanging`` once the tool body runs (a checkpoint
flushed before it), and wait to be killed.
``resume``: resume "e2e" in a new process, run turn 3, print the log as JSON.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson
import trio

from actors import Owner
from harness.agent import Call, Say, ScriptedProvider, ToolSet, open_agent_loop, tool
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import open_store
from harness.session import RelationalInvariants, event_to_record, thaw


@tool("lookup", "Look something up")
async def lookup(args: dict[str, Any]) -> Any:
    return {"found": args.get("q")}


@tool("wait_forever", "A tool that never returns")
async def wait_forever(args: dict[str, Any]) -> Any:
    print("hanging", flush=True)
    await trio.sleep_forever()


async def main(root: str, mode: str) -> None:
    script = (
        [[Say("looking"), Call("lookup", {"q": "x"})], [Say("found x")], [Say("waiting"), Call("wait_forever")]]
        if mode == "first"
        else [[Say("after the crash, carrying on")]]
    )
    async with open_store(validator_factory=RelationalInvariants) as store, open_persistence(store, JsonlBackend(root)) as p:
        tools = ToolSet([lookup, wait_forever])
        async with open_agent_loop(store, provider=ScriptedProvider(script), tools=tools, persistence=p) as loop, Owner("app") as owner:
            if mode == "first":
                agent = await loop.create("e2e", owner=owner, cwd="/e2e")
                await agent.run_turn("look up x")
                await agent.run_turn("now wait")
            else:
                agent = await loop.resume("e2e", owner=owner)
                result = await agent.run_turn("are you there?")
                log = [thaw(event_to_record(e)) for e in agent.session.events]
                print(orjson.dumps({"result": result.reason, "log": log}).decode(), flush=True)
                await agent.dispose()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
