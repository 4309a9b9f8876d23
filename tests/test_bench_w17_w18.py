"""`harness bench W17 W18` (issue 26's concurrency and many-process workloads): smoke runs
at the smallest sizes, shape only (speed targets live in the benchmarks, never in a test;
W18's correctness verdict is tests/test_many_processes.py)."""

from __future__ import annotations

import pytest

from harness.bench import _concurrency, _procs
from harness.bench._cli import _VARIANT_OF, WORKLOADS
from harness.bench._descriptions import DESCRIPTIONS

pytestmark = pytest.mark.slow


def test_w17_reports_throughput_latency_and_the_ratios_to_one_session() -> None:
    results = {r.key: r for r in _concurrency.w17(200, 1, backends=("jsonl", "sqlite"), levels=(1, 8), seconds=0.2)}
    forms = ("W17", "W17-durable")  # append + flush, and append(durable=True)
    assert set(results) == {f"{form}-{kind}-{k}" for form in forms for kind in ("jsonl", "sqlite") for k in (1, 8)}
    assert results["W17-durable-jsonl-8"].note == "append(durable=True), all sessions at once"
    for form, kind in ((form, kind) for form in forms for kind in ("jsonl", "sqlite")):
        one, eight = results[f"{form}-{kind}-1"].extra, results[f"{form}-{kind}-8"].extra
        assert one["sessions"] == 1 and eight["sessions"] == 8 and one["backend"] == kind
        # The message cap is checked before each append: at most one more per session.
        assert 0 < one["acks"] <= 200 and 0 < eight["acks"] <= 200 + 7
        assert 0 < one["p50_us"] <= one["p99_us"] and 0 < eight["p50_us"] <= eight["p99_us"]
        assert "aggregate_vs_1" not in one
        assert eight["aggregate_vs_1"] == pytest.approx(eight["msgs_per_s"] / one["msgs_per_s"], rel=0.02, abs=0.006)
        assert eight["p99_vs_1"] == pytest.approx(eight["p99_us"] / one["p99_us"], rel=0.02, abs=0.006)


def test_w18_reports_the_verdict_with_the_throughput() -> None:
    (result,) = _procs.w18(0, 1, backends=("sqlite",), procs=2, sessions=3, rounds=2, burst=2)
    assert result.key == "W18-sqlite"
    extra = result.extra
    assert extra["acked"] == 2 * 3 * 2 * 2 and extra["clean"] is True
    assert extra["errors"] == extra["lost"] == extra["reordered"] == 0
    assert extra["msgs_per_s"] > 0


def test_w17_and_w18_are_listed_and_take_the_backend_option() -> None:
    assert {"W17", "W18"} <= set(WORKLOADS) and {"W17", "W18"} <= set(DESCRIPTIONS)
    assert _VARIANT_OF["W17-postgres-512"] == "W17" and _VARIANT_OF["W18-postgres"] == "W18"
    assert _VARIANT_OF["W17-durable-sqlite-64"] == "W17"
    assert _procs.backends_of("all") == ("jsonl", "sqlite") and _procs.backends_of("sqlite") == ("sqlite",)
