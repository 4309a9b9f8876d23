"""Child process for the crash test: resume (or create) a session, then append turns
with tool calls forever, printing ``durable <n>`` after every flush that returned."""

from __future__ import annotations

import sys

import trio

from harness.errors import PersistedSessionNotFoundError
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import open_store
from harness.session import EventDraft


def user(mid: str) -> dict[str, object]:
    return {"id": mid, "role": "user", "content": [{"type": "text", "text": "go " * 20}], "source": {"kind": "user"}}


async def main(root: str) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(root), write_delay=0.005) as p:
        try:
            prep = await p.prepare("crashy")
            session = await p.publish(prep)
        except PersistedSessionNotFoundError:
            session = await store.create("crashy", cwd="/crash")
        turn = 1 + sum(1 for e in session.events if e.type == "turn/start")
        print(f"ready {session.seq}", flush=True)
        while True:
            n = session.seq
            call = f"c{n}"
            await session.append_batch(
                [
                    EventDraft("turn/start", {"turn": turn}),
                    EventDraft("user/message", user(f"u{n}"), "append"),
                    EventDraft("step/start", {"turn": turn, "step": 1}),
                    EventDraft(
                        "assistant/message",
                        {
                            "turn": turn,
                            "step": 1,
                            "message": {
                                "id": f"a{n}",
                                "role": "assistant",
                                "content": [{"type": "tool-call", "id": call, "name": "t", "arguments": "{}"}],
                                "source": {"kind": "model", "provider": "p", "model": "m"},
                            },
                        },
                        "append",
                    ),
                ]
            )
            await session.append("tool/call", {"turn": turn, "step": 1, "callId": call, "name": "t", "arguments": "{}"})
            await session.flush()
            print(f"durable {session.seq}", flush=True)
            result = {
                "turn": turn,
                "step": 1,
                "message": {
                    "id": f"r{n}",
                    "role": "user",
                    "content": [{"type": "tool-result", "toolCallId": call, "content": [{"type": "text", "text": "ok"}]}],
                    "source": {"kind": "tool", "callId": call},
                },
            }
            await session.append("tool/result", result, surface_op="append")
            await session.append_batch(
                [EventDraft("step/end", {"turn": turn, "step": 1}), EventDraft("turn/end", {"turn": turn, "reason": {"kind": "completed"}})]
            )
            await session.flush()
            print(f"durable {session.seq}", flush=True)
            turn += 1


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
