"""W16: appends with one owner-scoped event listener per agent (issue 24 §3).

``W16-<agents>``: ``agents`` owners (1, 100, 1,000, 10,000), each with one
``on_event(..., scope=owner)`` listener, as an agent loop with a per-agent listener
has; appends go round-robin to the sessions of ten of them (one event per call,
through the session actor). The per-append cost should be flat in the number of
agents: each append reaches the one listener of its own scope. Floor: the same
appends in a store with no listener at all.
"""

from __future__ import annotations

import statistics
import time
from contextlib import AsyncExitStack
from typing import Final

import trio

from actors import Owner
from harness.bench._events import bench_payload
from harness.bench._runner import Result
from harness.runtime import open_store

AGENTS: Final = (1, 100, 1_000, 10_000)
APPENDS: Final = 2_000
_SAMPLED: Final = 10


def _clock() -> int:
    return 1_700_000_000_000


def _run(agents: int, listening: bool) -> float:
    """Seconds per append (median of the sampled sessions' rounds)."""
    payloads = [bench_payload(i) for i in range(APPENDS)]

    async def main() -> float:
        heard = [0]

        def listener(handle: object, event: object) -> None:
            heard[0] += 1

        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(open_store(clock=_clock))
            root = await stack.enter_async_context(Owner("agents"))
            owners = []
            for i in range(agents):
                owner = await stack.enter_async_context(Owner(f"agent-{i}", parent=root))
                owners.append(owner)
                if listening:
                    store.on_event(listener, scope=owner)
            sampled = owners[:: max(1, agents // _SAMPLED)][:_SAMPLED]
            sessions = [await store.create(f"s{i}", owner=o) for i, o in enumerate(sampled)]
            t0 = time.perf_counter()
            for i, (t, d) in enumerate(payloads):
                await sessions[i % len(sessions)].append(t, d, surface_op="append")
            dt = time.perf_counter() - t0
            assert heard[0] == (APPENDS if listening else 0), heard
            return dt / APPENDS

    return trio.run(main)


def w16(n: int, runs: int, agents: tuple[int, ...] = AGENTS) -> list[Result]:
    """Per-append cost with 1..10,000 owner-scoped listeners (``n`` unused)."""
    runs = max(1, min(runs, 5))
    out: list[Result] = []
    for count in agents:
        floors: list[float] = []
        works: list[float] = []
        for _ in range(runs):  # interleaved: a burst of load hits both alike
            floors.append(_run(count, listening=False))
            works.append(_run(count, listening=True))
        w, floor = statistics.median(works) * 1000.0, statistics.median(floors) * 1000.0
        out.append(
            Result(
                f"W16-{count}",
                w * APPENDS,
                floor * APPENDS,
                {"agents": count, "appends": APPENDS, "per_append_us": round(w * 1000.0, 2)},
                "appends with one owner-scoped event listener per agent",
            )
        )
    return out
