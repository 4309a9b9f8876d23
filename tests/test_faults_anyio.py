"""Issue 23: AnyIO code on the Trio backend is explored like Trio code — task groups,
AnyIO cancel scopes and events; the report names AnyIO tasks by their paths."""

from __future__ import annotations

import anyio
import pytest

from harness.faults import Probe, explore


class Gauge:
    def __init__(self) -> None:
        self.open = 0


async def job(gauge: Gauge, started: anyio.Event, fixed: bool) -> None:
    gauge.open += 1
    started.set()
    if fixed:
        try:
            await anyio.sleep(0.01)
        finally:
            gauge.open -= 1
        return
    await anyio.sleep(0.01)  # BUG: a cancel here leaves the gauge raised
    gauge.open -= 1


def scenario(fixed: bool):  # type: ignore[no-untyped-def]
    async def anyio_gauge(probe: Probe) -> None:
        gauge = Gauge()
        with anyio.CancelScope() as scope:
            probe.canceller("caller", scope.cancel)
            probe.arm()
            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    started = anyio.Event()
                    tg.start_soon(job, gauge, started, fixed)
                    await started.wait()
        probe.disarm()
        probe.check(gauge.open == 0, f"gauge left at {gauge.open}")

    return anyio_gauge


def test_anyio_on_trio_is_explored_and_reported() -> None:
    report = explore(scenario(False))
    [group] = report.groups
    v = group.first
    assert v.injection is not None and v.injection.site.endswith(" job"), str(report)
    assert v.injection.path in ("scenario/job", "scenario/job#1")
    assert {t.path for t in v.cancelled} <= {"scenario", "scenario/job", "scenario/job#1"}


@pytest.mark.parametrize("fixed", [True])
def test_the_fixed_anyio_code_is_clean(fixed: bool) -> None:
    report = explore(scenario(fixed))
    assert report.ok and report.attempts > 8, str(report)
