"""Fork a session at a turn boundary, continue both branches differently, compare them.

    python docs/examples/fork_and_compare.py [ROOT]

Runs offline on the scripted provider; the sessions are written as JSONL under ROOT
(a temporary directory if not given). See docs/tutorials/fork.md.
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import trio

import harness
from harness.agent import AgentHandle, Say, ScriptedProvider


def texts(agent: AgentHandle) -> list[str]:
    """The model-visible conversation as `role: text` lines (a snapshot; no round trip)."""
    messages: list[Any] = list(agent.messages)  # frozen JSON values
    return [
        f"{m['role']}: {' '.join(p['text'] for p in m['content'] if p['type'] == 'text')}"
        for m in messages
    ]


async def main(root: str) -> None:
    async with harness.open_runtime(root) as rt:
        script = [[Say("Lisbon or Porto?")], [Say("Noted: 3 days.")], [Say("Lisbon: trams and the Alfama.")]]
        main_line = await rt.create("trip", provider=ScriptedProvider(script))
        await main_line.run_turn("Plan a trip to Portugal.")
        await main_line.run_turn("Three days.")
        # Fork at the end of turn 1: the child shares the prefix, then has a life of its own.
        boundary = next(e.seq for e in main_line.session.events if e.type == "turn/end")
        child = await rt.store.fork(main_line.session, boundary, "trip-porto")
        await child.flush()
        await rt.store.detach(child)  # hand the stored branch to an agent of its own:
        branch = await rt.resume("trip-porto", provider=ScriptedProvider([[Say("Porto it is: port cellars and the Douro.")]]))
        await branch.run_turn("Porto, please.")
        await main_line.run_turn("Lisbon, then.")

        for agent in (main_line, branch):
            header = agent.session.header
            print(f"== {agent.id}: parent={header.parent_session!r} seed_length={header.seed_length} "
                  f"events={agent.session.seq + 1}")
            for line in texts(agent):
                print(f"   {line}")
        shared = [a for a, b in zip(texts(main_line), texts(branch), strict=False) if a == b]
        print(f"shared prefix: {len(shared)} messages; branch forked at seq {boundary}")
        assert branch.session.header.parent_session == "trip"
        assert texts(branch)[: len(shared)] == texts(main_line)[: len(shared)] and len(shared) == 2


if __name__ == "__main__":
    if len(sys.argv) > 1:
        trio.run(main, sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            trio.run(main, tmp)
