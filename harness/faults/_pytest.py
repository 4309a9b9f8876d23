"""The hooks of ``@pytest.mark.explore`` (re-exported by the ``harness.testing`` plugin):
a marked ``async def`` test is run by :func:`harness.faults.explore`, not by pytest-trio."""

from __future__ import annotations

import inspect
from typing import Final

import pytest

from harness.faults._checkpoints import ExploreCheckpoints
from harness.faults._explore import Probe

_EXPLORE_OPTIONS: Final = frozenset(
    {"name", "arm", "seeds", "stride", "max_steps", "cancellers", "settings", "allowed", "max_attempts", "max_seconds"}
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "explore(cancellers=None, seeds=None, stride=1, max_steps=None, settings=None, arm=True, allowed=None, "
        "max_attempts=None, max_seconds=None): run this async test under harness.faults.explore (every "
        "schedule seed, a cancellation at every checkpoint); it takes the attempt's `probe`",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The explorer runs a marked test itself (one trio.run per attempt): it must not
    # also be run by pytest-trio, whose trio_mode marks every async test.
    for item in items:
        if item.get_closest_marker("explore") is not None:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "trio"]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker("explore")
    if marker is None:
        return None
    fn = pyfuncitem.obj
    if not inspect.iscoroutinefunction(fn):
        raise pytest.UsageError(f"@pytest.mark.explore needs an async test: {pyfuncitem.nodeid}")
    unknown = set(marker.kwargs) - _EXPLORE_OPTIONS
    if marker.args or unknown:
        raise pytest.UsageError(f"@pytest.mark.explore takes keywords {sorted(_EXPLORE_OPTIONS)}, got {marker.args} {sorted(unknown)}")
    names = pyfuncitem._fixtureinfo.argnames
    fixtures = {n: pyfuncitem.funcargs[n] for n in names if n != "probe"}
    takes_probe = "probe" in names

    async def body(probe: Probe) -> None:
        await (fn(probe=probe, **fixtures) if takes_probe else fn(**fixtures))

    options = dict(marker.kwargs)
    options.setdefault("name", pyfuncitem.name.replace(":", "_"))
    ExploreCheckpoints(pyfuncitem.name.replace(":", "_"))(body, **options)
    return True
