"""Running workloads: medians, floors, ratios, and the report."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen
class Result:
    key: str
    median_ms: float
    floor_ms: float | None
    extra: dict[str, Any] = attrs.field(factory=dict)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.floor_ms is None or self.floor_ms <= 0:
            return None
        return self.median_ms / self.floor_ms

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "median_ms": round(self.median_ms, 4),
            "floor_ms": None if self.floor_ms is None else round(self.floor_ms, 4),
            "ratio": None if self.ratio is None else round(self.ratio, 3),
        }
        out.update(self.extra)
        return out

    def line(self) -> str:
        floor = "" if self.floor_ms is None else f"  floor {self.floor_ms:9.2f} ms  ratio {self.ratio:5.2f}x"
        extra = "".join(f"  {k}={v}" for k, v in self.extra.items())
        return f"{self.key:22s} {self.median_ms:10.3f} ms{floor}{extra}  {self.note}".rstrip()


def loads_floor(lines: list[bytes]) -> float:
    """The decode floor: ``orjson.loads`` of every line, collector off (seconds)."""
    import gc

    import orjson

    was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        _ = [orjson.loads(line) for line in lines]
        return time.perf_counter() - t0
    finally:
        if was:
            gc.enable()


def median_ms(fn: Callable[[], float | None], runs: int) -> float:
    """Median wall time in ms of ``fn`` over ``runs`` runs.

    ``fn`` may return its own measured duration in seconds (to exclude setup); if it
    returns None the whole call is timed.
    """
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        measured = fn()
        elapsed = time.perf_counter() - t0 if measured is None else measured
        samples.append(elapsed * 1000.0)
    return statistics.median(samples)
