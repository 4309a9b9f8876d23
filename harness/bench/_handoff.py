"""W19: what the hand-off of one durable write costs a Trio program, beside W9 (issue
26, decision 0025).

One ~300-byte line is appended and fdatasynced per message, four ways, all in one
``trio.run``:

* ``W19-inline``: ``os.write`` + ``os.fdatasync`` on the calling thread, the floor (what
  W9's floor measures; here it blocks the Trio thread, which the runtime never does);
* ``W19-thread``: the same through ``trio.to_thread.run_sync``: a worker-thread round
  trip per message, the shape of the runtime's committer thread;
* ``W19-uring``: the write and a linked fdatasync submitted from the Trio thread to
  io_uring (:mod:`harness.bench._uring`, ``IOSQE_ASYNC``: the kernel's worker does the
  write), the completion awaited on an eventfd with ``trio.lowlevel.wait_readable``:
  no thread of ours and no GIL hand-off (Linux; ``unavailable=`` says why not);
* ``W19-harness``: ``append(..., durable=True)`` on JSONL (W9-durable's path).

The disk's latency on a VM swings between minutes by more than the differences
measured, so the forms take turns in blocks of :data:`BLOCK` messages (forwards, then
backwards) and each block's time is compared with the inline block of the same turn.
Reported per form: ``per_message_us`` (median over blocks), ``ratio_to_inline``
(median of the per-turn ratios; the ``ratio`` column is the ratio of the medians),
``blocks``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import trio
import trio.lowlevel

from harness.bench import _uring
from harness.bench._events import bench_payload
from harness.bench._runner import Result
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import open_store

BLOCK: Final = 100
FORMS: Final = ("inline", "thread", "uring", "harness")
LINE: Final = b'{"seq":1,"type":"user/message","data":{"text":"' + b"x" * 240 + b'"}}\n'

_NOTES: Final = {
    "inline": "write + fdatasync on the calling thread (the floor)",
    "thread": "the same through trio.to_thread.run_sync",
    "uring": "io_uring write + linked fdatasync from the Trio thread, eventfd completion",
    "harness": "append(durable=True), JSONL",
}


def _clock() -> int:
    return 1_700_000_000_000


async def _uring_write(ring: _uring.Ring, fd: int, addr: int) -> None:
    ring.prepare(_uring.OP_WRITE, fd, flags=_uring.SQE_IO_LINK | _uring.SQE_ASYNC, addr=addr, length=len(LINE), user_data=1)
    ring.prepare(_uring.OP_FSYNC, fd, offset=0, op_flags=_uring.FSYNC_DATASYNC, user_data=2)
    ring.submit()
    # Both completions are reaped before an error is raised (a failed write also
    # completes its linked fdatasync, cancelled), so the ring is left empty.
    failed: OSError | None = None
    done = 0
    while done < 2:
        await trio.lowlevel.wait_readable(ring.efd)
        try:
            os.read(ring.efd, 8)
        except BlockingIOError:
            continue
        for user_data, result in ring.reap():
            done += 1
            if result < 0 and failed is None:
                step = "write" if user_data == 1 else "fdatasync"
                failed = OSError(-result, f"io_uring {step}: {os.strerror(-result)}")
    if failed is not None:
        raise failed


def measure(count: int, root: Path, forms: tuple[str, ...] = FORMS) -> dict[str, list[float]]:
    """Per-block µs per message of each form in ``forms`` (``inline`` always), ``count``
    messages each (rounded up to a block), files under ``root``."""
    blocks = max(1, -(-count // BLOCK))
    order = ["inline", *[f for f in forms if f != "inline"]]

    async def main() -> dict[str, list[float]]:
        fds = {f: os.open(root / f"{f}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644) for f in ("inline", "thread", "uring")}
        ring: _uring.Ring | None = None
        line = ctypes.create_string_buffer(LINE, len(LINE))
        kind, data = bench_payload(0)
        try:
            if "uring" in order:
                ring = _uring.Ring()
            async with open_store(clock=_clock) as store, open_persistence(store, JsonlBackend(root / "harness")):
                handle = await store.create("w19", cwd="/bench")
                await handle.append(kind, data, surface_op="append", durable=True)  # materialize: not timed

                def inline_one() -> None:
                    os.write(fds["inline"], LINE)
                    os.fdatasync(fds["inline"])

                def thread_one() -> None:
                    os.write(fds["thread"], LINE)
                    os.fdatasync(fds["thread"])

                async def inline() -> None:
                    inline_one()

                async def thread() -> None:
                    await trio.to_thread.run_sync(thread_one)

                async def uring() -> None:
                    assert ring is not None
                    await _uring_write(ring, fds["uring"], ctypes.addressof(line))

                async def harness() -> None:
                    await handle.append(kind, data, surface_op="append", durable=True)

                steps: dict[str, Callable[[], Awaitable[None]]] = {
                    "inline": inline, "thread": thread, "uring": uring, "harness": harness,
                }
                samples: dict[str, list[float]] = {f: [] for f in order}
                for turn in range(blocks):
                    for form in order if turn % 2 == 0 else order[::-1]:
                        step = steps[form]
                        t0 = time.perf_counter()
                        for _ in range(BLOCK):
                            await step()
                        samples[form].append((time.perf_counter() - t0) * 1e6 / BLOCK)
                return samples
        finally:
            if ring is not None:
                ring.close()
            for fd in fds.values():
                os.close(fd)

    return trio.run(main)


def w19(n: int, runs: int) -> list[Result]:
    """The four forms, ``min(n, 2000)`` messages each per run (rounded up to whole
    blocks), ``runs`` runs pooled."""
    count = -(-min(n, 2000) // BLOCK) * BLOCK  # whole turns, as measure() runs them
    missing = _uring.unavailable()
    forms = tuple(f for f in FORMS if f != "uring" or missing is None)
    samples: dict[str, list[float]] = {f: [] for f in forms}
    for _ in range(runs):
        root = Path(tempfile.mkdtemp(prefix="harness-bench-w19-"))
        try:
            for form, values in measure(count, root, forms).items():
                samples[form].extend(values)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    inline = samples["inline"]
    floor_us = statistics.median(inline)
    results = []
    for form in FORMS:
        if form not in samples:
            results.append(Result(f"W19-{form}", 0.0, None, {"unavailable": missing}, _NOTES[form]))
            continue
        values = samples[form]
        per = statistics.median(values)
        ratios = [v / f for v, f in zip(values, inline, strict=True)]
        extra = {
            "per_message_us": round(per, 1),
            "ratio_to_inline": round(statistics.median(ratios), 3),
            "blocks": len(values),
        }
        results.append(Result(f"W19-{form}", per * count / 1000.0, floor_us * count / 1000.0, extra, _NOTES[form]))
    return results
