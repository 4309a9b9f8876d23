"""`harness bench W15 W16` (issue 24 §2, §3): smoke runs at the smallest sizes, shape only
(speed targets live in the benchmarks, never in a test)."""

from __future__ import annotations

from harness.bench import _scoped, _streaming
from harness.bench._cli import _VARIANT_OF, WORKLOADS


def test_w15_streams_large_tool_arguments_through_every_layer() -> None:
    results = {r.key: r for r in _streaming.w15(0, 1, sizes_mb=(1,))}
    assert set(results) == {"W15-1MB", "W15-provider-1MB", "W15-sse-1MB"}
    assert all(r.median_ms > 0 and r.extra["bytes"] > 900_000 for r in results.values())
    assert "W15" in WORKLOADS and _VARIANT_OF["W15-provider-10MB"] == "W15"


def test_w16_runs_with_scoped_listeners() -> None:
    results = _scoped.w16(0, 1, agents=(1, 20))
    assert [r.key for r in results] == ["W16-1", "W16-20"]
    assert all(r.floor_ms is not None and r.extra["appends"] == _scoped.APPENDS for r in results)
    assert "W16" in WORKLOADS and _VARIANT_OF["W16-10000"] == "W16"
