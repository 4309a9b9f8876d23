"""dev.py's lanes: any failed step fails the run; a step that cannot start or calls
sys.exit is a failure too (before, it ended its thread silently and the lane passed)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dev() -> object:
    spec = importlib.util.spec_from_file_location("_dev_under_test", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exit_code(*lanes: list[list[str] | Callable[[], None]]) -> object:
    dev = _dev()
    with pytest.raises(SystemExit) as exc:
        dev._lanes(*lanes)  # type: ignore[attr-defined]
    return exc.value.code


def _exits() -> None:
    sys.exit(3)


def _raises() -> None:
    raise RuntimeError("boom")


def test_a_failing_command_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code([[sys.executable, "-c", "print('lint'); raise SystemExit(5)"]],
                      [[sys.executable, "-c", "print('docs')"]]) == 5
    out = capsys.readouterr().out
    assert out.index("lint") < out.index("docs")


def test_a_command_that_cannot_start_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code([[sys.executable, "-c", "print('first')"], [str(ROOT / "no-such-program")]],
                      [[sys.executable, "-c", "print('docs')"]]) == 1
    out = capsys.readouterr().out
    assert "first" in out and "no-such-program failed" in out and "docs" in out


@pytest.mark.parametrize(("step", "code"), [(_exits, 3), (_raises, 1)])
def test_a_failing_function_step_fails_and_stops_its_lane(step: Callable[[], None], code: int,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code([[sys.executable, "-c", "print('lint')"]],
                      [step, [sys.executable, "-c", "print('after')"]]) == code
    out = capsys.readouterr().out
    assert f"{step.__name__} failed" in out and "after" not in out


def test_lanes_that_pass_return() -> None:
    _dev()._lanes([[sys.executable, "-c", "pass"]], [lambda: None, [sys.executable, "-c", "pass"]])  # type: ignore[attr-defined]
