"""The agent story of ``harness demo``: run, crash mid-turn, resume, fork.

The first act runs in a child process (``python -m harness.demo._agent ROOT``) so it
can be killed for real with SIGKILL in the middle of a tool call; the parent then
resumes the session from disk, continues it, and forks it at a turn boundary.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from actors import Owner
from harness.agent import (
    Agent,
    Call,
    Delay,
    Say,
    ScriptedProvider,
    Think,
    ToolSet,
    open_agent_loop,
    tool,
)
from harness.agent._scripted import Reply
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import SessionHandle, open_store
from harness.session import RelationalInvariants, thaw

FILES = {"/repo/README.md": "trio-harness: sessions as actors", "/repo/VERSION": "0.1.0"}


@tool("read_file", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}})
async def read_file(args: dict[str, Any]) -> Any:
    await trio.sleep(0.01)
    path = str(args.get("path"))
    if path not in FILES:
        raise FileNotFoundError(path)
    return FILES[path]


@tool("run_tests", "Run the test suite (slow)")
async def run_tests(args: dict[str, Any]) -> Any:
    print("    [tool] run_tests started; the process will be killed now", flush=True)
    await trio.sleep(3600)
    return "all green"


TOOLS = ToolSet([read_file, run_tests])

ACT1: list[Reply] = [
    [Think("The user wants the version."), Say("Let me read it."), Call("read_file", {"path": "/repo/VERSION"})],
    [Say("The version is 0.1.0.")],
    [Say("Running the tests."), Delay(0.05), Call("run_tests")],
]
ACT2: list[Reply] = [
    [Say("The previous test run was interrupted; its outcome is unknown, so I will not assume it passed."), Call("read_file", {"path": "/repo/README.md"})],
    [Say("README says: sessions as actors. Shall I rerun the tests?")],
]
BRANCH: list[Reply] = [[Say("On this branch: the version file says 0.1.0, and nothing else happened.")]]


async def act1(root: str) -> None:
    """Child process: create the agent, run a turn, start a second one and hang."""
    async with (
        open_store(validator_factory=RelationalInvariants) as store,
        open_persistence(store, JsonlBackend(root)) as persistence,
        open_agent_loop(store, provider=ScriptedProvider(ACT1), tools=TOOLS, persistence=persistence) as loop,
        Owner("demo") as owner,
    ):
        agent = await loop.create("assistant", owner=owner, cwd="/repo")
        r1 = await agent.run_turn("What version is this?")
        print(f"    turn {r1.turn}: {r1.kind}", flush=True)
        await agent.run_turn("Now run the tests.")


def _summary(e: Any) -> str:
    d = thaw(e.data)
    t = e.type
    if t == "user/message":
        return "user: " + " ".join(b.get("text", "") for b in d["content"])[:70]
    if t == "assistant/message":
        parts = []
        for b in d["message"]["content"]:
            if b["type"] == "text":
                parts.append(b["text"])
            elif b["type"] == "tool-call":
                parts.append(f"-> {b['name']}({b['arguments']})")
            elif b["type"] == "reasoning":
                parts.append(f"(thinks: {b['text']})")
        flag = " [interrupted]" if d.get("interrupted") else ""
        return ("assistant: " + " ".join(parts))[:90] + flag
    if t == "tool/result":
        block = d["message"]["content"][0]
        text = " ".join(b.get("text", "") for b in block["content"])
        err = f" [{d['error']['code']}]" if "error" in d else ""
        return f"result {block['toolCallId']}: {text[:60]}{err}"
    if t == "tool/call":
        return f"dispatch {d['name']} ({d['callId']})"
    if t in ("turn/start", "turn/end"):
        reason = d.get("reason")
        return f"turn {d['turn']}" + (f": {reason['kind']}" + (f" ({reason['reason']['kind']})" if "reason" in reason else "") if reason else "")
    if t == "request/header":
        return f"request header ({d['reason']})"
    return ""


def timeline(title: str, session: SessionHandle) -> None:
    print(f"\n  timeline of {title} ({session.seq} events; chunks folded):")
    chunks = 0
    for e in session.events:
        if e.type == "assistant/chunk":
            chunks += 1
            continue
        if chunks:
            print(f"      ... {chunks} assistant/chunk")
            chunks = 0
        if e.type in ("step/start", "step/end", "request/context"):
            continue
        text = _summary(e)
        marker = ">" if e.seq >= session.first_live_seq else " "
        print(f"    {marker}{e.seq:4d} {e.type:<18} {text}")


async def acts_2_and_3(root: Path) -> None:
    provider = ScriptedProvider(ACT2 + BRANCH)
    async with (
        open_store(validator_factory=RelationalInvariants) as store,
        open_persistence(store, JsonlBackend(root)) as persistence,
        open_agent_loop(store, provider=provider, tools=TOOLS, persistence=persistence) as loop,
        Owner("demo") as owner,
    ):
        print("\n  act 2: resume in this process")
        agent = await loop.resume("assistant", owner=owner)
        s = agent.session
        repaired = [e for e in s.events if e.seq < s.first_live_seq][-4:]
        print(f"    loaded {s.first_live_seq} events from disk; crash repair closed turn 2 with:")
        for e in repaired:
            if e.type in ("tool/result", "step/end", "turn/end"):
                print(f"      {e.seq:4d} {e.type:<12} {_summary(e)}")
        r3 = await agent.run_turn("What happened? Carry on.")
        print(f"    turn {r3.turn}: {r3.kind}")

        print("\n  act 3: fork at the end of turn 1")
        boundary = next(e.seq for e in s.events if e.type == "turn/end")
        branch = await store.fork(s, boundary, "assistant-branch")
        h = branch.header
        print(f"    forked {branch.id} from {h.parent_session} at seq {boundary} (it starts with a copy of its first {h.seed_length} events)")
        branch_agent = Agent(branch, provider, TOOLS)
        r = await branch_agent.run_turn("Summarise, on the branch.")
        print(f"    branch turn {r.turn}: {r.kind}")
        timeline("'assistant' (> marks events appended after the resume)", s)
        timeline("'assistant-branch' (> marks events after the fork)", branch)
        await branch.flush()
        await agent.dispose()


def _list_logs(root: Path) -> None:
    print(f"\n  both sessions are on disk under {root}:")
    from harness.demo._show import stored_sessions

    stored_sessions(root)


def run_agent_story(root: Path) -> int:
    print(f"== the agent story: run, crash, resume, fork (logs under {root}) ==")
    print("\n  act 1: a scripted agent in a child process")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    with subprocess.Popen([sys.executable, "-m", "harness.demo._agent", str(root)], stdout=subprocess.PIPE, env=env) as child:
        assert child.stdout is not None
        for raw in child.stdout:
            line = raw.decode().rstrip()
            print(line)
            if "run_tests started" in line:
                child.send_signal(signal.SIGKILL)
                break
        child.wait()
    print(f"    child killed with SIGKILL (exit {child.returncode}) in the middle of turn 2")
    trio.run(acts_2_and_3, root)
    _list_logs(root)
    return 0


if __name__ == "__main__":
    trio.run(act1, sys.argv[1])
