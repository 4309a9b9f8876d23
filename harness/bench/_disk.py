"""Workloads on disk: W5-write, W5-load, W4-disk (JSONL backend)."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from pathlib import Path

import orjson

from harness.bench._events import bench_record
from harness.bench._runner import Result, loads_floor, median_ms
from harness.persistence import Backend, JsonlBackend, build_session
from harness.session import gc_paused

HEADER = {"version": 0, "id": "bench", "createdAt": 1, "cwd": "/bench"}


def w5(n: int, runs: int) -> list[Result]:
    """Persist n events with one durable write; load them back; restore from disk."""
    records = [bench_record(i) for i in range(n)]
    tmp = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    try:
        counter = [0]

        def write_floor() -> float:
            path = tmp / f"floor-{counter[0]}.jsonl"
            counter[0] += 1
            t0 = time.perf_counter()
            dumps = orjson.dumps
            payload = b"".join(dumps(r) + b"\n" for r in records)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, payload)
                os.fsync(fd)
            finally:
                os.close(fd)
            return time.perf_counter() - t0

        def write() -> float:
            backend = JsonlBackend(tmp / f"root-{counter[0]}")
            counter[0] += 1
            t0 = time.perf_counter()
            backend.materialize(dict(HEADER), records)
            return time.perf_counter() - t0

        write_floor_ms = median_ms(write_floor, runs)
        write_ms = median_ms(write, runs)
        backend = JsonlBackend(tmp / "load")
        backend.materialize(dict(HEADER), records)
        path = backend.locate("bench")
        assert path is not None
        size = path.stat().st_size
        lines = path.read_bytes().splitlines()[1:]

        def load() -> float:
            t0 = time.perf_counter()
            stored = backend.load("bench")
            dt = time.perf_counter() - t0
            assert len(stored.records) == n
            return dt

        def restore() -> float:
            t0 = time.perf_counter()
            with gc_paused():
                stored = backend.load("bench")
                session = build_session("bench", stored.header, stored.records)
                stored.records.clear()  # adopted: drop the envelopes before the collector resumes
            dt = time.perf_counter() - t0
            assert session.seq == n + 1
            return dt

        floor = median_ms(lambda: loads_floor(lines), runs)
        return [
            Result("W5-write", write_ms, write_floor_ms, {"n": n, "bytes": size}, "materialize + fsync vs orjson + one fsync"),
            Result("W5-load", median_ms(load, runs), floor, {"n": n, "bytes": size}, "read + scan + decode"),
            Result("W4-disk", median_ms(restore, runs), floor, {"n": n}, "load + restore mode from disk"),
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resume_samples(backend: Backend, n: int, runs: int) -> list[float]:
    """Seconds per end-to-end resume (load + repair + publish) of the stored n-event
    session ``bench`` in ``backend``, ``runs`` times, each from cold (W7 on every
    backend). Runs its own ``trio.run``; owns the runtime it opens."""
    import trio

    from actors import Owner
    from harness.agent import ScriptedProvider, open_agent_loop
    from harness.persistence import open_persistence
    from harness.runtime import open_store

    async def main() -> list[float]:
        samples = []
        async with (
            open_store() as store,
            open_persistence(store, backend) as p,
            open_agent_loop(store, provider=ScriptedProvider([]), persistence=p) as loop,
            Owner("bench") as owner,
        ):
            for _ in range(runs):
                t0 = time.perf_counter()
                handle = await loop.resume("bench", owner=owner)
                samples.append(time.perf_counter() - t0)
                assert handle.session.seq >= n + 1
                await handle.dispose()
                del handle
                # Each run starts cold: the previous incarnation's final write and
                # teardown (freeing it, cycles included) are not part of the next resume.
                await p.wait_retired("bench")
                gc.collect()
        return samples

    return trio.run(main)


def w7(n: int, runs: int) -> list[Result]:
    """Resume end to end: load + repair + publish of an n-event session from disk.

    Floor: ``orjson.loads`` of the same lines with the collector off (W4's floor).
    """
    tmp = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    try:
        backend = JsonlBackend(tmp)
        # Not kept: live source records would sit in every collection the runs meet.
        backend.materialize(dict(HEADER), [bench_record(i) for i in range(n)])
        path = backend.locate("bench")
        assert path is not None
        lines = path.read_bytes().splitlines()[1:]
        samples = iter(resume_samples(JsonlBackend(tmp), n, runs))
        return [
            Result("W7", median_ms(lambda: next(samples), runs), median_ms(lambda: loads_floor(lines), runs), {"n": n}, "resume: load + repair + publish")
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
