"""The bridge family: ``agents-session`` (the OpenAI Agents SDK Session of
harness.bridge, each mutation durable)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from actors import Owner
from harness.faults._backends import check_at_rest, close_backend, make_backend, track_session
from harness.faults._explore import Probe
from harness.faults._scenarios._frame import (
    Caller,
    bind_teardown,
    check_runtime_exited,
    check_runtime_live,
    guarded,
    rig,
)
from harness.session import event_to_record, thaw


async def agents_session(probe: Probe, kind: str) -> None:
    """The OpenAI Agents SDK Session on a stored session (``TrioAgentsSession``): items
    added in two batches, one popped, the list cleared, one more added; each mutation
    durable when it returns (acknowledged then). A cancelled or failed operation
    changed nothing or everything it meant to; the list is a fold of the log."""
    from harness._runtime_api import Runtime  # imported here: the bridge imports the agent loop
    from harness.bridge import TrioAgentsSession

    backend = make_backend(probe, kind)
    answers: list[Any] = []
    try:
        async with rig(probe, backend, write_delay=0.05) as r, Owner("chaos") as owner:
            rt = Runtime(store=r.store, persistence=r.persistence, loop=r.loop, owner=owner)
            session = TrioAgentsSession(rt, "sdk", cwd="/chaos")
            ops: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("add_items", partial(session.add_items, [{"role": "user", "content": "a"}])),
                ("add_items", partial(session.add_items, [{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])),
                ("pop_item", session.pop_item),
                ("clear_session", session.clear_session),
                ("add_items", partial(session.add_items, [{"role": "user", "content": "d"}])),
            ]
            with trio.CancelScope() as body:
                caller = Caller()
                probe.canceller("caller", caller.cancel)
                bind_teardown(probe, None, r.store, body)
                probe.arm()
                with caller.scope():
                    for what, op in ops:
                        handle = await guarded(probe, "open", session.handle)
                        if handle is None:
                            break
                        track_session(probe, handle)
                        ok = [False]

                        async def run(op: Callable[[], Awaitable[Any]] = op, ok: list[bool] = ok) -> None:
                            answers.append(await op())
                            ok[0] = True

                        await guarded(probe, what, run)
                        if not ok[0]:
                            break
                        events = handle.events  # the mutation flushed all of them
                        if len(events):
                            probe.acknowledge(handle.id, len(events) - 1, [event_to_record(e) for e in events])
                listed = await guarded(probe, "get_items", session.get_items)
                live = r.store.get_nowait("sdk")
                if listed is not None and live is not None:
                    folded = [thaw(e.data)["item"] for e in live.events if e.type == "openai-agents/item"]
                    probe.check(all(item in folded for item in listed), f"get_items {listed} not in the log {folded}")
                    if not (caller.cancelled or body.cancel_called) and probe.faults is None:
                        probe.check(
                            listed == [{"role": "user", "content": "d"}] and answers[2] == {"role": "user", "content": "c"},
                            f"clean run: items {listed}, answers {answers}",
                        )
                await check_runtime_live(probe, r)
        check_runtime_exited(probe, None)
    finally:
        close_backend(backend)
    probe.disarm()
    check_at_rest(probe, kind)
