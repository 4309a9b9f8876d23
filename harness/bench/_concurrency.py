"""W17: many sessions in one process appending durably at once (issue 26's "W12:
concurrency"; the id W12 was taken by the close-a-store workload, so it is W17 here).

``W17-<backend>-<sessions>`` for 1, 8, 64 and 512 sessions in one store with
persistence: every session runs its own task that appends one message through its
session actor and flushes it (durable when the flush returns), as fast as it can, until
the run's time budget (:data:`SECONDS`) is spent or ``min(N, 20000)`` messages are
acknowledged in all. The acknowledgement latency of a message is append + flush, as its
caller sees it. Session creation and each session's first durable write (its first message, which
materializes the log: header, start event, file or rows) happen before the clock starts.

Reported per level: ``msgs_per_s`` (aggregate acknowledged messages per second),
``p50_us``/``p99_us`` (acknowledgement latency over every message of the run; medians
over runs), ``acks``; and, against the one-session level of the same backend measured in
the same run: ``aggregate_vs_1`` (throughput ratio; issue 26's target at 64 sessions:
>= 10x, fsyncs shared) and ``p99_vs_1`` (p99 over the single session's p99; target at
64 sessions: <= 3x) with ``p99_vs_1_p50`` (the same p99 over the single session's p50).
``median_ms`` is the p50 latency in ms; there is no floor (the ratios to one session are
the figures of interest).

Backends: JSONL and SQLite (``--backend all``), one of them, or, with ``--backend
postgres``, PostgreSQL as well (``HARNESS_BENCH_POSTGRES_URL`` or a throwaway cluster,
as :mod:`harness.bench._backends`). ``runs`` is capped at 3: each level is a fixed time
budget, and the levels of a run are measured back to back so load hits them alike.
"""

from __future__ import annotations

import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import trio
import trio.lowlevel

from harness.bench._backends import Factory, _factory
from harness.bench._events import bench_payload
from harness.bench._runner import Result
from harness.persistence import Backend, JsonlBackend, open_persistence
from harness.runtime import SessionHandle, open_store

LEVELS: Final = (1, 8, 64, 512)
SECONDS: Final = 1.0
"""Time budget of one level in one run (seconds of appending, setup excluded)."""
MAX_MESSAGES: Final = 20_000
BACKENDS: Final = ("jsonl", "sqlite", "postgres")


def _clock() -> int:
    return 1_700_000_000_000


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``samples``."""
    ordered = sorted(samples)
    rank = min(len(ordered), max(1, math.ceil(q * len(ordered))))
    return ordered[rank - 1]


def run_level(
    make: Callable[[], Backend], sessions: int, seconds: float, limit: int, one_call: bool = False
) -> tuple[int, float, list[float]]:
    """One run at ``sessions`` concurrent writers: (acks, elapsed seconds, latencies).
    ``one_call``: each message is ``append(..., durable=True)`` instead of append then
    ``flush()``."""
    payloads = [bench_payload(i) for i in range(64)]

    async def main() -> tuple[int, float, list[float]]:
        backend = make()
        try:
            async with open_store(clock=_clock) as store, open_persistence(store, backend):
                handles: list[SessionHandle] = []

                async def create(i: int) -> None:
                    h = await store.create(f"s{i}", cwd="/bench")
                    # The first appended event materializes the log (header, start
                    # event, file or row creation): not timed.
                    await h.append(*payloads[0], surface_op="append")
                    await h.flush()
                    handles.append(h)

                async with trio.open_nursery() as nursery:
                    for i in range(sessions):
                        nursery.start_soon(create, i)
                latencies: list[float] = []
                acks = [0]
                go = trio.Event()
                clock = time.perf_counter
                deadline = [0.0]

                async def writer(h: SessionHandle) -> None:
                    await go.wait()
                    k = 0
                    while acks[0] < limit:
                        t, d = payloads[k % len(payloads)]
                        t0 = clock()
                        if t0 >= deadline[0]:
                            return
                        if one_call:
                            await h.append(t, d, surface_op="append", durable=True)
                        else:
                            await h.append(t, d, surface_op="append")
                            await h.flush()
                        latencies.append(clock() - t0)
                        acks[0] += 1
                        k += 1

                async with trio.open_nursery() as nursery:
                    for h in handles:
                        nursery.start_soon(writer, h)
                    await trio.lowlevel.checkpoint()  # every writer waits on `go`
                    start = clock()
                    deadline[0] = start + seconds
                    go.set()
                elapsed = clock() - start
                return acks[0], elapsed, latencies
        finally:
            close = getattr(backend, "close", None)
            if close is not None:
                close()

    return trio.run(main)


FORMS: Final = (False, True)
"""Append then ``flush()`` (``W17-…``), and ``append(..., durable=True)``
(``W17-durable-…``), measured level by level in turn."""


def _on(kind: str, levels: Sequence[int], runs: int, seconds: float, limit: int) -> list[Result]:
    tmp = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    try:
        keys = [(form, k) for form in FORMS for k in levels]
        rates: dict[tuple[bool, int], list[float]] = {key: [] for key in keys}
        p50s: dict[tuple[bool, int], list[float]] = {key: [] for key in keys}
        p99s: dict[tuple[bool, int], list[float]] = {key: [] for key in keys}
        acks: dict[tuple[bool, int], list[int]] = {key: [] for key in keys}
        with _jsonl_factory(tmp) if kind == "jsonl" else _factory(kind, tmp) as make:
            for run in range(runs):
                # Back to back, the two forms of a level in turn: a burst of load hits
                # every level and both forms alike; which form goes first alternates
                # (ABBA), as in W9/W10.
                for k in levels:
                    for form in FORMS if run % 2 == 0 else FORMS[::-1]:
                        n, elapsed, latencies = run_level(make, k, seconds, limit, one_call=form)
                        rates[form, k].append(n / elapsed)
                        p50s[form, k].append(percentile(latencies, 0.50))
                        p99s[form, k].append(percentile(latencies, 0.99))
                        acks[form, k].append(n)
        out: list[Result] = []
        for form in FORMS:
            out += _results(kind, form, levels, seconds, rates, p50s, p99s, acks)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _results(
    kind: str,
    form: bool,
    levels: Sequence[int],
    seconds: float,
    rates: dict[tuple[bool, int], list[float]],
    p50s: dict[tuple[bool, int], list[float]],
    p99s: dict[tuple[bool, int], list[float]],
    acks: dict[tuple[bool, int], list[int]],
) -> list[Result]:
    """One form's results, each level against the same form's one-session level."""
    out: list[Result] = []
    med = statistics.median
    one = (form, levels[0]) if levels and levels[0] == 1 else None
    name = "W17-durable" if form else "W17"
    note = (
        "append(durable=True), all sessions at once"
        if form
        else "durable single appends (append + flush), all sessions at once"
    )
    for level in levels:
        k = (form, level)
        extra: dict[str, object] = {
            "backend": kind,
            "sessions": level,
            "seconds": seconds,
            "acks": int(med(acks[k])),
            "msgs_per_s": round(med(rates[k]), 1),
            "p50_us": round(med(p50s[k]) * 1e6, 1),
            "p99_us": round(med(p99s[k]) * 1e6, 1),
        }
        if one is not None and k != one:
            extra["aggregate_vs_1"] = round(med(rates[k]) / med(rates[one]), 2)
            extra["p99_vs_1"] = round(med(p99s[k]) / med(p99s[one]), 2)
            extra["p99_vs_1_p50"] = round(med(p99s[k]) / med(p50s[one]), 2)
        out.append(Result(f"{name}-{kind}-{level}", med(p50s[k]) * 1000.0, None, extra, note))
    return out


class _jsonl_factory:
    """Fresh JSONL roots (as :func:`harness.bench._backends._factory` for the others)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.count = 0

    def __enter__(self) -> Factory:
        def make() -> Backend:
            self.count += 1
            return JsonlBackend(self.tmp / f"jsonl-{self.count}")

        return make

    def __exit__(self, *exc: object) -> None:
        return None


def w17(
    n: int,
    runs: int,
    backends: Sequence[str] = ("jsonl", "sqlite"),
    levels: Sequence[int] = LEVELS,
    seconds: float = SECONDS,
) -> list[Result]:
    """1..512 sessions appending durable single messages at once, per backend."""
    runs = max(1, min(runs, 3))
    limit = min(n, MAX_MESSAGES)
    out: list[Result] = []
    for kind in backends:
        out += _on(kind, levels, runs, seconds, limit)
    return out


__all__ = ["BACKENDS", "LEVELS", "percentile", "run_level", "w17"]
