"""`harness fuzz`'s runner: the coverage-guided targets run beside the Hypothesis
section, and a crash or a failure in either fails the section (the two halves are
stubbed here; the real ones run in `python3 dev.py test`)."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import pytest

from harness.fuzz import _runner


def _args(**kw: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _runner.add_arguments(parser)
    args = parser.parse_args([])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


@pytest.fixture
def halves(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Stubs: the Hypothesis half returns only once every coverage run has started (so
    the section can only pass when the two run side by side); a coverage run can be
    made to crash."""
    state: dict[str, object] = {"started": threading.Event(), "crash": None, "hyp_code": 0, "order": []}
    order: list[str] = state["order"]  # type: ignore[assignment]

    def run_hypothesis(root: Path, budget: str, workdir: Path) -> tuple[int, dict[str, int], float]:
        started: threading.Event = state["started"]  # type: ignore[assignment]
        # A safety bound only: the verdict is whether the event was set, never the time.
        assert started.wait(60), "the coverage runs did not start while the Hypothesis half ran"
        order.append("hypothesis")
        return int(state["hyp_code"]), {"entry.point": 7}, 1.0  # type: ignore[call-overload]

    def run_coverage(target: str, seconds: int, root: Path, workdir: Path, update: bool) -> _runner.TargetRun:
        order.append(target)
        if len(order) == len(_runner.TARGETS):
            state["started"].set()  # type: ignore[attr-defined]
        crashes = [workdir / f"crash-{target}"] if state["crash"] == target else []
        for c in crashes:
            c.write_bytes(b"x")
        return _runner.TargetRun(target, 10, 1.0, crashes, 0, 0, "libFuzzer: deadly signal\n" if crashes else "")

    monkeypatch.setattr(_runner, "run_hypothesis", run_hypothesis)
    monkeypatch.setattr(_runner, "run_coverage", run_coverage)
    monkeypatch.setattr(_runner.importlib.util, "find_spec", lambda name: object())
    return state


def test_the_coverage_runs_go_beside_the_hypothesis_half(halves: dict[str, object],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert _runner.main(_args()) == 0
    out = capsys.readouterr().out
    # Every target ran before the Hypothesis half returned: they overlapped.
    assert halves["order"] == [*_runner.TARGETS, "hypothesis"]
    for target in _runner.TARGETS:
        assert f"+ coverage-guided fuzzing of {target} for 8s" in out
        assert f"coverage-guided: {target}" in out
    assert "entry.point" in out
    assert out.rstrip().endswith("ok")


def test_a_crash_beside_the_hypothesis_half_fails_the_section(
        halves: dict[str, object], capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    halves["crash"] = "jsonl-zstd"
    assert _runner.main(_args()) == 1
    captured = capsys.readouterr()
    assert "harness fuzz: jsonl-zstd crashed; inputs kept:" in captured.err
    # The fuzzer's own output comes with its verdict, after the Hypothesis half, not
    # in the middle of it.
    assert captured.err.index("libFuzzer: deadly signal") < captured.err.index("jsonl-zstd crashed")
    assert (tmp_path / "fuzz-jsonl-zstd-crash-jsonl-zstd").read_bytes() == b"x"
    assert captured.out.rstrip().endswith("FAILED")


def test_a_failed_hypothesis_half_fails_the_section(halves: dict[str, object],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    halves["hyp_code"] = 1
    assert _runner.main(_args()) == 1
    assert capsys.readouterr().out.rstrip().endswith("FAILED")


def test_a_coverage_thread_that_dies_fails_the_section(halves: dict[str, object], monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    def boom(*a: object) -> _runner.TargetRun:
        halves["started"].set()  # type: ignore[attr-defined]
        raise OSError("no such fuzzer")

    monkeypatch.setattr(_runner, "run_coverage", boom)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the traceback is not the verdict
    assert _runner.main(_args()) == 1
    assert capsys.readouterr().out.rstrip().endswith("FAILED")


def test_coverage_alone_runs_in_the_foreground(halves: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    halves["started"].set()  # type: ignore[attr-defined]
    assert _runner.main(_args(no_hypothesis=True, target=["sqlite-rows"])) == 0
    assert halves["order"] == ["sqlite-rows"]
    assert "hypothesis section" not in capsys.readouterr().out


def test_runs_that_ended_before_the_thread_died_are_reported(halves: dict[str, object], monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    real = _runner.run_coverage

    def second_fails(target: str, *a: object) -> _runner.TargetRun:
        if target != _runner.TARGETS[0]:
            halves["started"].set()  # type: ignore[attr-defined]
            raise OSError("no such fuzzer")
        return real(target, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(_runner, "run_coverage", second_fails)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    assert _runner.main(_args()) == 1
    out = capsys.readouterr().out
    assert f"coverage-guided: {_runner.TARGETS[0]}" in out
    assert out.rstrip().endswith("FAILED")
