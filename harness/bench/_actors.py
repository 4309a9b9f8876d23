"""Workloads through the actor runtime: W1-actor, W1-actor-batch, W3, W12."""

from __future__ import annotations

import time

import trio

from harness.bench._events import bench_payload
from harness.bench._runner import Result, median_ms
from harness.runtime import open_store
from harness.session import EventDraft, Session


def _clock() -> int:
    return 1_700_000_000_000


def w1_actor(n: int, runs: int) -> list[Result]:
    """Append n events through a session actor: one per call, and in batches of 100.

    Floor: the pure in-process append of the same events, measured in the same run.
    """
    payloads = [bench_payload(i) for i in range(n)]
    drafts = [EventDraft(t, d, "append") for t, d in payloads]

    def pure() -> float:
        s = Session.create("bench", clock=_clock)
        t0 = time.perf_counter()
        for t, d in payloads:
            s.append(t, d, surface_op="append")
        return time.perf_counter() - t0

    def through_actor(batch: int) -> float:
        async def main() -> float:
            async with open_store(clock=_clock) as store:
                h = await store.create("bench")
                t0 = time.perf_counter()
                if batch == 1:
                    for t, d in payloads:
                        await h.append(t, d, surface_op="append")
                else:
                    for i in range(0, n, batch):
                        await h.append_batch(drafts[i : i + batch])
                dt = time.perf_counter() - t0
                assert h.seq == n
                return dt

        return trio.run(main)

    floor = median_ms(pure, runs)
    return [
        Result("W1-actor", median_ms(lambda: through_actor(1), runs), floor, {"n": n}, "one event per call"),
        Result("W1-actor-batch", median_ms(lambda: through_actor(100), runs), floor, {"n": n, "batch": 100}, "batches of 100"),
    ]


def w3(n: int, runs: int) -> list[Result]:
    """Fork a live n-event session at its last seq."""
    drafts = [EventDraft(t, d, "append") for t, d in (bench_payload(i) for i in range(n))]

    async def main() -> list[float]:
        async with open_store(clock=_clock) as store:
            h = await store.create("bench")
            await h.append_batch(drafts)
            samples = []
            for i in range(runs):
                t0 = time.perf_counter()
                child = await store.fork(h, n - 1, f"child-{i}")
                samples.append(time.perf_counter() - t0)
                assert child.seq == n + 1
                await store.detach(child)
                del child  # freed here, not inside the next timed fork
            return samples

    def floor() -> float:
        # The least a sharing fork must do: copy the event list (pointers only).
        log = list(range(n))
        t0 = time.perf_counter()
        _ = log[:]
        return time.perf_counter() - t0

    samples = iter(trio.run(main))
    return [Result("W3", median_ms(lambda: next(samples), runs), median_ms(floor, runs), {"n": n}, "fork at the last seq")]


def w12(n: int, runs: int) -> list[Result]:
    """Close a store holding many live sessions (issue #9 §2.6: detaching is O(1)).

    ``n // 6`` sessions (16,666 at the default N); the floor is closing a store of
    1,000 sessions scaled to the same count, measured in the same run, so a ratio
    near 1 means the cost per detach does not grow with the number of sessions.
    """
    many = max(n // 6, 1_000)
    few = 1_000

    def close(count: int) -> float:
        async def main() -> float:
            async with open_store(clock=_clock) as store:
                for i in range(count):
                    await store.create(f"s{i}")
                t0 = time.perf_counter()
                await store.aclose()
                return time.perf_counter() - t0

        return trio.run(main)

    floor = median_ms(lambda: close(few) * many / few, runs)
    return [Result("W12", median_ms(lambda: close(many), runs), floor, {"sessions": many}, "close a store of live sessions")]
