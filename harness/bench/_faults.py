"""W13: the fault explorer's own overhead per attempt (issue 23).

A 10-task scenario (a producer, eight workers and a collector over memory channels,
every hand-off a checkpoint) explored at every step by one canceller: attempts per
second, against the floor of a plain ``trio.run`` of the same scenario on a MockClock
(what an attempt would cost without the explorer: no probe, instrument, thread or
temporary directory).
"""

from __future__ import annotations

import statistics
import time

import trio

from harness.bench._runner import Result, median_ms

TASKS = 10
ITEMS = 20


async def _ten_tasks(probe: object | None) -> None:
    send, recv = trio.open_memory_channel[int](0)
    out_send, out_recv = trio.open_memory_channel[int](0)
    total = 0

    async def producer() -> None:
        async with send:
            for i in range(ITEMS):
                await send.send(i)

    async def worker(out: trio.MemorySendChannel[int]) -> None:
        async with out:
            async for item in recv:
                await out.send(item * 2)

    async def collector() -> None:
        nonlocal total
        async for item in out_recv:
            total += item

    with trio.CancelScope() as scope:
        if probe is not None:
            probe.canceller("caller", scope.cancel)  # type: ignore[attr-defined]
            probe.arm()  # type: ignore[attr-defined]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            for _ in range(TASKS - 2):
                nursery.start_soon(worker, out_send.clone())
            nursery.start_soon(collector)
            await out_send.aclose()


def w13(n: int, runs: int) -> list[Result]:
    """Explore the 10-task scenario at every step (``n`` is ignored: the scenario is
    fixed so figures compare across versions)."""
    # Imported here, not at module level: trio.testing imports pytest, and a bench
    # process that carried pytest's modules would give every other workload a heap
    # twice an application's (W17's full collections took 25-30 ms instead of 6-10).
    import trio.testing

    from harness.faults import Settings, explore

    settings = Settings(autojump_threshold=0.0)
    report = explore(_ten_tasks, seeds=1, settings=settings)
    attempts = report.attempts

    cpu: dict[str, list[float]] = {"explored": [], "plain": []}

    def explored() -> float:
        c0, t0 = time.process_time(), time.perf_counter()
        explore(_ten_tasks, seeds=1, settings=settings)
        cpu["explored"].append(time.process_time() - c0)
        return time.perf_counter() - t0

    def plain() -> float:
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(attempts):
            trio.run(_ten_tasks, None, clock=trio.testing.MockClock(autojump_threshold=0))
        cpu["plain"].append(time.process_time() - c0)
        return time.perf_counter() - t0

    floor = median_ms(plain, runs)
    total = median_ms(explored, runs)
    per_attempt = total / attempts
    # CPU time (every thread of the process) is steadier than wall time on a shared machine.
    cpu_ms = statistics.median(cpu["explored"]) * 1000.0 / attempts
    cpu_floor_ms = statistics.median(cpu["plain"]) * 1000.0 / attempts
    return [
        Result(
            "W13",
            per_attempt,
            floor / attempts,
            {
                "tasks": TASKS,
                "attempts": attempts,
                "attempts_per_s": round(1000.0 / per_attempt, 1),
                "cpu_ms": round(cpu_ms, 3),
                "cpu_floor_ms": round(cpu_floor_ms, 3),
            },
            "explorer: ms per attempt of a 10-task scenario (floor: a plain trio.run of it)",
        )
    ]
