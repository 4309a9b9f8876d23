"""Workloads of the pure core: W1, W2, W2b, W4, W4-snapshot, W6."""

from __future__ import annotations

import time

import orjson

from harness.bench._events import bench_payload, bench_record
from harness.bench._runner import Result, loads_floor, median_ms
from harness.session import EventDraft, ReplaceOp, Session, event_to_record


def _fixed_clock() -> int:
    return 1_700_000_000_000


def _payloads(n: int) -> list[tuple[str, dict[str, object]]]:
    return [bench_payload(i) for i in range(n)]


def w1(n: int, runs: int) -> list[Result]:
    """Append n events to one pure session, one call per event."""
    payloads = _payloads(n)

    def run() -> float:
        s = Session.create("bench-w1", clock=_fixed_clock)
        append = s.append
        t0 = time.perf_counter()
        for type_, data in payloads:
            append(type_, data, surface_op="append")
        return time.perf_counter() - t0

    def floor() -> float:
        # The least a snapshot append must do: deep-copy the payload (orjson round
        # trip, C speed) and keep it in a list.
        loads, dumps = orjson.loads, orjson.dumps
        kept: list[object] = []
        push = kept.append
        t0 = time.perf_counter()
        for _type, data in payloads:
            push(loads(dumps(data)))
        return time.perf_counter() - t0

    return [Result("W1", median_ms(run, runs), median_ms(floor, runs), {"n": n}, "pure append, one event per call")]


def w2(n: int, runs: int) -> list[Result]:
    """20,000 appends with an incremental derive after each; W2b: rebuild after a replace."""
    k = min(20_000, n)
    payloads = _payloads(k)

    def run_incremental() -> float:
        s = Session.create("bench-w2", clock=_fixed_clock)
        total = 0.0
        for type_, data in payloads:
            s.append(type_, data, surface_op="append")
            t0 = time.perf_counter()
            s.derive_messages()
            total += time.perf_counter() - t0
        return total

    def run_plain() -> float:
        s = Session.create("bench-w2", clock=_fixed_clock)
        for type_, data in payloads:
            s.append(type_, data, surface_op="append")
        return 0.0

    inc = median_ms(run_incremental, runs)
    per_call_us = inc * 1000.0 / k
    # Flatness: per-call cost over the last 1,000 derives vs the first 1,000.
    s = Session.create("bench-w2-flat", clock=_fixed_clock)
    first = last = 0.0
    for i, (type_, data) in enumerate(payloads):
        s.append(type_, data, surface_op="append")
        t0 = time.perf_counter()
        s.derive_messages()
        dt = time.perf_counter() - t0
        if i < 1000:
            first += dt
        elif i >= k - 1000:
            last += dt
    del run_plain
    results = [
        Result(
            "W2",
            inc,
            None,
            {
                "n": k,
                "per_call_us": round(per_call_us, 3),
                "first_1000_us": round(first * 1000, 3),
                "last_1000_us": round(last * 1000, 3),
            },
            "derive after each append (time in derive only)",
        )
    ]

    big = Session.create("bench-w2b", clock=_fixed_clock)
    big.append_batch([EventDraft(t, d, "append") for t, d in _payloads(n)])
    big.derive_messages()
    counter = [0]

    def run_rebuild() -> float:
        # A tiny replace (one node) bumps the generation: the next derive rebuilds
        # over all ~n nodes. Each run replaces a different node.
        counter[0] += 1
        target = big.surface[counter[0]]
        big.append(
            "user/message",
            {"id": f"r{counter[0]}", "role": "user", "content": [], "source": {"kind": "user"}},
            surface_op=ReplaceOp(target, target),
            source_event_seqs=[target],
        )
        t0 = time.perf_counter()
        big.derive_messages()
        return time.perf_counter() - t0

    results.append(
        Result("W2b", median_ms(run_rebuild, runs), None, {"n": n}, "full derive rebuild after a replace")
    )
    return results


def w4(n: int, runs: int) -> list[Result]:
    """Decode n JSONL lines and restore them (restore mode) vs snapshot mode."""
    header = {"version": 0, "id": "bench-w4", "createdAt": 1}
    lines = [orjson.dumps(bench_record(i)) for i in range(n)]
    loads = orjson.loads

    def restore() -> float:
        t0 = time.perf_counter()
        s = Session.restore_lines("bench-w4", lines, dict(header), clock=_fixed_clock)
        dt = time.perf_counter() - t0
        assert s.seq == n + 1
        return dt

    def snapshot() -> float:
        records = [loads(line) for line in lines]
        t0 = time.perf_counter()
        s = Session.create("bench-w4", records, dict(header), clock=_fixed_clock)
        dt = time.perf_counter() - t0
        assert s.seq == n + 1
        return dt

    floor_ms = median_ms(lambda: loads_floor(lines), runs)
    return [
        Result("W4", median_ms(restore, runs), floor_ms, {"n": n}, "orjson.loads + restore mode"),
        Result(
            "W4-snapshot",
            median_ms(snapshot, runs),
            floor_ms,
            {"n": n},
            "snapshot mode over decoded records (decode not timed)",
        ),
    ]


def w6(n: int, runs: int) -> list[Result]:
    """One replace covering surface nodes 1,000..90,000 of an n-event session."""
    lo, hi = min(1000, n // 100), min(90_000, n * 9 // 10)
    base = [event_to_record(e) for e in _session_of(n).events]

    def floor() -> float:
        # The least a replace must do: a set of the cited seqs and one list splice.
        nodes = list(range(n))
        seqs = nodes[lo : hi + 1]
        t0 = time.perf_counter()
        cited = set(seqs)
        assert all(s in cited for s in seqs)
        nodes[lo : hi + 1] = [n]
        return time.perf_counter() - t0

    def run() -> float:
        s = Session.restore("bench-w6", [dict(r) for r in base], {"version": 0, "id": "bench-w6", "createdAt": 1})
        start, end = s.surface[lo], s.surface[hi]
        seqs = list(s.surface[lo : hi + 1])
        t0 = time.perf_counter()
        s.append(
            "user/message",
            {"id": "summary", "role": "user", "content": [{"type": "text", "text": "summary"}], "source": {"kind": "user"}},
            surface_op=ReplaceOp(start, end),
            source_event_seqs=seqs,
        )
        dt = time.perf_counter() - t0
        assert len(s.surface) == n - (hi - lo)
        return dt

    return [Result("W6", median_ms(run, runs), median_ms(floor, runs), {"n": n, "shadowed": hi - lo + 1}, "one replace")]


def _session_of(n: int) -> Session:
    s = Session.create("bench", clock=_fixed_clock)
    s.append_batch([EventDraft(t, d, "append") for t, d in _payloads(n)])
    return s
