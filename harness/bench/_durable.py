"""Durable and batched appends through the actor runtime (W9, W10, W11) and the memory
retained by a restored session (M1), issue 15.

* **W9** durable single appends: ``min(2000, N)`` messages, each appended through the
  session actor and then flushed (durable) before the next. Floor: ``os.write`` +
  ``os.fsync`` of the same encoded lines, one line at a time, on one open file.
* **W10** durable batches: ``min(20000, N)`` messages in batches of 50, each batch
  appended in one message and flushed. Floor: the same bytes written and fsynced per
  batch.
* **W11** in-memory batched appends through the actor (no persistence), ``min(20000,
  N)`` messages in batches of 50. Floor: the pure core's ``Session.append_batch`` of the
  same drafts, in the same batches.
* **M1** memory retained by one restored N-event session: ``tracemalloc`` after a full
  collection, the decoded input (the stored records) freed; its ratio to the JSONL file.

W9/W10 time two forms, interleaved: the append then ``flush()`` (keys ``W9``, ``W10``)
and the same in one call, ``append(..., durable=True)`` (``W9-durable``,
``W10-durable``; one schedule point per message instead of two).
W9/W10 run on JSONL (keys ``W9``, ``W10``) and SQLite (``W9-sqlite``, ``W10-sqlite``);
the floor of both is the plain file write + fsync (what the disk costs, whatever the
backend does on top). ``per_message_us`` and ``floor_per_message_us`` are the medians
divided by the message count; ``overhead_per_message_us`` is the median over runs of
(run - its floor) per message, steadier than the ratio when fsync latency swings.
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import orjson
import trio

from harness.bench._disk import HEADER
from harness.bench._events import bench_payload, bench_record
from harness.bench._runner import Result, median_ms
from harness.persistence import (
    Backend,
    JsonlBackend,
    SqliteBackend,
    build_session,
    open_persistence,
)
from harness.runtime import open_store
from harness.session import KNOWN_EVENT_TYPES, EventDraft, Session, event_to_record, gc_paused

BACKENDS = ("jsonl", "sqlite")
BATCH = 50


def _clock() -> int:
    return 1_700_000_000_000


def _backend(kind: str, root: Path) -> Backend:
    if kind == "jsonl":
        return JsonlBackend(root)
    return SqliteBackend(root / "sessions.db")


def _key(base: str, kind: str) -> str:
    return base if kind == "jsonl" else f"{base}-{kind}"


def _drafts(count: int) -> list[EventDraft]:
    return [EventDraft(t, d, "append") for t, d in (bench_payload(i) for i in range(count))]


def _durable_run(
    kind: str, root: Path, drafts: list[EventDraft], batch: int, one_call: bool = False
) -> tuple[float, list[bytes]]:
    """One run through a store with persistence: append ``batch`` drafts per message,
    flush after each message (``one_call``: both in one call, ``durable=True``).
    Returns (seconds, the encoded lines of the timed events, as the floor writes them).
    The first durable write (header, file creation) is done before the clock starts:
    only appends are timed."""

    async def main() -> tuple[float, list[bytes]]:
        async with open_store(clock=_clock) as store, open_persistence(store, _backend(kind, root)):
            h = await store.create("bench", cwd="/bench")
            await h.flush()  # materialize: the header and the start event
            start = h.seq
            t0 = time.perf_counter()
            if one_call and batch == 1:
                for d in drafts:
                    await h.append(d.type, d.data, surface_op="append", durable=True)
            elif one_call:
                for i in range(0, len(drafts), batch):
                    await h.append_batch(drafts[i : i + batch], durable=True)
            elif batch == 1:
                for d in drafts:
                    await h.append(d.type, d.data, surface_op="append")
                    await h.flush()
            else:
                for i in range(0, len(drafts), batch):
                    await h.append_batch(drafts[i : i + batch])
                    await h.flush()
            dt = time.perf_counter() - t0
            assert h.seq == start + len(drafts)
            dumps = orjson.dumps
            lines = [dumps(event_to_record(e)) + b"\n" for e in h.events[start:]]
            return dt, lines

    return trio.run(main)


def _fsync_floor(path: Path, chunks: Sequence[bytes]) -> float:
    """Seconds to write and fsync each chunk in turn, on one open file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        write, fsync = os.write, os.fsync
        t0 = time.perf_counter()
        for chunk in chunks:
            write(fd, chunk)
            fsync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


FORMS: Final = (False, True)
"""The two forms W9/W10 time, interleaved: append then ``flush()`` (two calls), and
``durable=True`` (one call; key suffix ``-durable``)."""


def _durable_on(
    kind: str, tmp: Path, drafts: list[EventDraft], batch: int, runs: int
) -> dict[bool, tuple[float, float, float]]:
    """Per form (:data:`FORMS`): (workload ms, floor ms, overhead ms), medians over
    ``runs`` interleaved samples. Each sample of a workload is followed by one of the
    floor over the lines that run wrote, and the forms alternate, so a burst of load
    on a shared machine hits all of them alike. The overhead is the median of the
    per-sample differences: what the runtime adds to the disk's cost, a steadier
    figure than the ratio when fsync latency swings (a disk shared with other work)."""
    work: dict[bool, list[float]] = {form: [] for form in FORMS}
    floor: dict[bool, list[float]] = {form: [] for form in FORMS}
    for i in range(runs):
        # ABBA: the form that runs second in a pair was measured slower (the first
        # one's writeback still going on), so the order alternates run by run.
        for form in FORMS if i % 2 == 0 else FORMS[::-1]:
            root = tmp / f"run-{i}-{form}"
            root.mkdir()
            dt, lines = _durable_run(kind, root, drafts, batch, one_call=form)
            shutil.rmtree(root, ignore_errors=True)
            work[form].append(dt * 1000.0)
            chunks = [b"".join(lines[j : j + batch]) for j in range(0, len(lines), batch)]
            fpath = tmp / f"floor-{i}-{form}.jsonl"
            floor[form].append(_fsync_floor(fpath, chunks) * 1000.0)
            fpath.unlink()
    out: dict[bool, tuple[float, float, float]] = {}
    for form in FORMS:
        overhead = statistics.median(w - f for w, f in zip(work[form], floor[form], strict=True))
        out[form] = (statistics.median(work[form]), statistics.median(floor[form]), overhead)
    return out


def _durable(
    base: str, count: int, batch: int, runs: int, backends: Sequence[str], notes: tuple[str, str]
) -> list[Result]:
    drafts = _drafts(count)
    results: list[Result] = []
    for kind in backends:
        tmp = Path(tempfile.mkdtemp(prefix="harness-bench-"))
        try:
            measured = _durable_on(kind, tmp, drafts, batch, runs)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for form in FORMS:
            w, f, over = measured[form]
            extra = {
                "n": count,
                "batch": batch,
                "backend": kind,
                "per_message_us": round(w * 1000.0 / count, 3),
                "floor_per_message_us": round(f * 1000.0 / count, 3),
                "overhead_per_message_us": round(over * 1000.0 / count, 3),
            }
            name = _key(f"{base}-durable" if form else base, kind)
            results.append(Result(name, w, f, extra, notes[form]))
    return results


def w9(n: int, runs: int, backends: Sequence[str] = BACKENDS) -> list[Result]:
    """Durable single appends: append one message through the actor, flush, repeat
    (``W9``); the same with ``append(..., durable=True)`` (``W9-durable``)."""
    notes = ("append + durable flush, one message at a time", "append(durable=True), one message at a time")
    return _durable("W9", min(2000, n), 1, runs, backends, notes)


def w10(n: int, runs: int, backends: Sequence[str] = BACKENDS) -> list[Result]:
    """Durable batches of 50: append a batch through the actor, flush, repeat
    (``W10``); the same with ``append_batch(..., durable=True)`` (``W10-durable``)."""
    notes = ("append_batch(50) + durable flush", "append_batch(50, durable=True)")
    return _durable("W10", min(20_000, n), BATCH, runs, backends, notes)


def w11(n: int, runs: int) -> list[Result]:
    """In-memory batched appends through the actor; floor: the pure core's append_batch."""
    count = min(20_000, n)
    drafts = _drafts(count)
    batches = [drafts[i : i + BATCH] for i in range(0, count, BATCH)]

    def pure() -> float:
        s = Session.create("bench", clock=_clock)
        append_batch = s.append_batch
        t0 = time.perf_counter()
        for b in batches:
            append_batch(b)
        return time.perf_counter() - t0

    def through_actor() -> float:
        async def main() -> float:
            async with open_store(clock=_clock) as store:
                h = await store.create("bench")
                start = h.seq
                t0 = time.perf_counter()
                for b in batches:
                    await h.append_batch(b)
                dt = time.perf_counter() - t0
                assert h.seq == start + count
                return dt

        return trio.run(main)

    # Interleaved (floor, workload) samples: a burst of load hits both alike.
    floors: list[float] = []
    works: list[float] = []
    for _ in range(runs):
        floors.append(median_ms(pure, 1))
        works.append(median_ms(through_actor, 1))
    floor, w = statistics.median(floors), statistics.median(works)
    return [
        Result(
            "W11",
            w,
            floor,
            {
                "n": count,
                "batch": BATCH,
                "per_message_us": round(w * 1000.0 / count, 3),
                "floor_per_message_us": round(floor * 1000.0 / count, 3),
            },
            "in-memory append_batch(50) through the actor vs the pure core",
        )
    ]


def m1(n: int, runs: int) -> list[Result]:
    """Memory retained by one restored n-event session, against its JSONL file size.

    The restore is the resume's read (``JsonlBackend.load_lines`` +
    ``Session.restore_stored_lines``, decision 0010). ``median_ms`` is its time
    (untraced, median of ``runs``); the memory figure comes from one extra traced run:
    ``tracemalloc``'s current size after the restore, the read's leftovers dropped and a
    full collection, minus the size before the read. ``general_path_mib`` is the same
    figure for the general reader (``load`` + ``build_session``: decoded trees).
    """
    tmp = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    try:
        backend = JsonlBackend(tmp)
        backend.materialize(dict(HEADER), [bench_record(i) for i in range(n)])
        path = backend.locate("bench")
        assert path is not None
        size = path.stat().st_size

        def restore() -> Session:
            stored = backend.load_lines("bench")
            assert stored is not None
            session = Session.restore_stored_lines("bench", stored.lines, stored.header, KNOWN_EVENT_TYPES)
            assert session is not None, "the bench log takes the fast path"
            return session

        def restore_general() -> Session:
            with gc_paused():
                stored = backend.load("bench")
                session = build_session("bench", stored.header, stored.records)
                stored.records.clear()  # adopted: the envelopes go before the collector resumes
            return session

        def timed() -> float:
            t0 = time.perf_counter()
            session = restore()
            dt = time.perf_counter() - t0
            assert session.seq == n + 1
            del session
            gc.collect()
            return dt

        def traced(build: Callable[[], Session]) -> int:
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                session = build()
                gc.collect()
                retained = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            assert session.seq == n + 1
            del session
            return retained

        ms = median_ms(timed, runs)
        retained = traced(restore)
        general = traced(restore_general)
        mib = 1024 * 1024
        return [
            Result(
                "M1",
                ms,
                None,
                {
                    "n": n,
                    "retained_bytes": retained,
                    "retained_mib": round(retained / mib, 2),
                    "file_bytes": size,
                    "file_mib": round(size / mib, 2),
                    "ratio_to_file": round(retained / size, 3),
                    "general_path_mib": round(general / mib, 2),
                },
                "memory retained by a restored session (median_ms: the restore)",
            )
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def backends_of(choice: str) -> tuple[str, ...]:
    """``--backend`` value -> the backends W9/W10 run on."""
    return BACKENDS if choice == "all" else (choice,)


__all__ = ["BACKENDS", "backends_of", "m1", "w9", "w10", "w11"]
