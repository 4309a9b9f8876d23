"""Issue 23: the five bug shapes of tests/fault_shapes.py are each found by
``explore`` at its default settings, reported as one group whose causal report names the
task that received ``Cancelled`` and the injection site inside the buggy function; each
fixed variant comes back clean."""

from __future__ import annotations

import json

import pytest

from harness.faults import ExploreReport, Group, explore, replay
from tests import fault_shapes
from tests.fault_shapes import SHAPES

pytest_plugins = ["pytester"]

CANCEL_SHAPES = ["handoff", "notification", "pool", "counter"]


def _explore(shape: str, fixed: bool) -> ExploreReport:
    make, _ = SHAPES[shape]
    return explore(make(fixed))


@pytest.mark.parametrize("shape", CANCEL_SHAPES)
def test_a_cancellation_bug_is_one_group_naming_the_cancelled_task_and_site(shape: str) -> None:
    report = _explore(shape, fixed=False)
    buggy_fn = SHAPES[shape][1]
    assert report.violations, f"{shape}: not found at default settings"
    groups = report.groups
    assert len(groups) == 1, str(report)
    group = groups[0]
    assert isinstance(group, Group) and group.count == len(report.violations)
    v = group.first
    assert v.injection is not None, str(report)
    # The injection site is a line of the buggy function, in this module.
    assert v.injection.site.startswith("tests.fault_shapes:") and v.injection.site.endswith(f" {buggy_fn}"), v.injection
    assert v.injection.file is not None and v.injection.file.endswith(f"fault_shapes.py:{v.injection.site.split(':')[1].split()[0]}")
    # The task that received Cancelled is named by its path, and is among the receivers.
    assert v.injection.path.startswith("scenario")
    assert v.injection in v.cancelled
    assert v.detected is not None and v.detected.site.startswith("tests.fault_shapes:")
    text = str(report)
    assert "1 group(s)" in text and str(group.first.key) in text and v.injection.site in text
    # The minimal replay reproduces the same cause.
    assert report.confirmed == {group.signature: True}
    again = replay(SHAPES[shape][0](False), group.smallest.key)
    assert [x.signature for x in again.violations] == [group.signature]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_fixed_variant_is_clean(shape: str) -> None:
    report = _explore(shape, fixed=True)
    assert report.ok, str(report)
    assert report.attempts > len(report.dry_steps)  # cancellations were explored, not only schedules
    assert str(report).splitlines()[0].endswith(f"0 violation(s) in 0 group(s), {report.wall_time:.1f}s")


def test_two_tasks_that_race_in_one_batch_are_in_different_groups_paths() -> None:
    # Two requests run the same function: their paths tell them apart.
    report = _explore("pool", fixed=False)
    paths = {v.injection.path for v in report.violations if v.injection is not None}
    assert paths == {"scenario/client", "scenario/client#1"}


def test_the_close_handshake_hang_is_an_order_bug_found_by_the_default_schedules() -> None:
    make, _ = SHAPES["close"]
    old_default = explore(make(False), seeds=1)
    assert old_default.ok, "seed 0 alone (the former default) reaches the interleaving"
    report = explore(make(False))
    groups = report.groups
    assert len(groups) == 1 and groups[0].kind == "hang", str(report)
    v = groups[0].first
    assert v.seed >= 1 and v.k == 0 and v.perturbations >= 0  # a schedule, nothing injected
    # The hang report names the blocked task and what it waits on.
    assert [b.path for b in v.blocked] == ["scenario/WebSocket.reader"]
    assert v.blocked[0].site.endswith(" reader") and v.blocked[0].waiting_on is not None
    assert "blocked: scenario/WebSocket.reader at tests.fault_shapes:" in str(report)
    assert "step #" in fault_shapes_normalised(v.message)


def fault_shapes_normalised(text: str) -> str:
    from harness.faults import normalise

    return normalise(text)


def test_json_carries_the_groups_and_summary() -> None:
    report = _explore("counter", fixed=False)
    data = json.loads(json.dumps(report.to_json()))
    assert data["summary"] == str(report)
    [group] = data["groups"]
    assert group["count"] == len(report.violations) and group["smallest_k"] == 1
    assert group["first"] == str(report.violations[0].key)
    assert group["violation"]["injection"]["site"].endswith(" tracked")


def test_the_minimal_replay_is_printed_as_a_pytest_test(pytester: pytest.Pytester) -> None:
    report = _explore("counter", fixed=False)
    [group] = report.groups
    code = group.pytest_test("tests.fault_shapes:COUNTER_BUGGY")
    assert f"replay(COUNTER_BUGGY, {str(group.smallest.key)!r})" in code
    pytester.makepyfile(test_replayed=code)
    pytester.syspathinsert(str(__import__("pathlib").Path(fault_shapes.__file__).parents[1]))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(failed=1)  # fails until the bug is fixed
    assert "active = 1 after every call returned" in result.stdout.str()


def test_the_tutorial_shows_what_the_code_prints() -> None:
    """docs/tutorials/faults.md, section 6: each block's output is the text block after
    it (wall times aside)."""
    import contextlib
    import io
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "tutorials" / "faults.md").read_text()
    section = doc[doc.index("## 6. Five bug shapes") :]
    pairs = re.findall(r"```python\n(.*?)```\n\n```text\n(.*?)```", section, re.S)
    assert len(pairs) == 5
    seconds = re.compile(r"\d+\.\d+s$", re.M)
    for code, shown in pairs:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "<tutorial>", "exec"), {"__name__": "__main__"})
        assert seconds.sub("Ts", out.getvalue()) == seconds.sub("Ts", shown), code.splitlines()[-1]
