"""Suite-wide settings."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# CI runs on 2 shared cores: wall-clock deadlines and the "too slow" health check
# would make property tests fail for reasons that have nothing to do with the code.
settings.register_profile(
    "harness",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("harness")

# The harness pytest plugin (harness.testing). An install of the package registers it
# through its pytest11 entry point; a checkout whose install predates the entry point
# loads it here.
try:
    from importlib.metadata import entry_points

    _registered = any(ep.value == "harness.testing" for ep in entry_points(group="pytest11"))
except Exception:  # pragma: no cover - metadata unavailable
    _registered = False
# tests.pg_cluster: the throwaway PostgreSQL cluster fixtures (pg_cluster, pg_url, pg_schema).
pytest_plugins = ([] if _registered else ["harness.testing"]) + ["tests.pg_cluster"]

_PG_FIXTURES = frozenset({"pg_cluster", "pg_url", "pg_schema"})


def pytest_collection_modifyitems(config: object, items: list[object]) -> None:
    """Keep every PostgreSQL test on one xdist worker (``--dist loadgroup``).

    Each worker would otherwise start its own throwaway cluster: two ``postgres``
    servers on a 2-core machine, and two workers racing for the free port each picks.
    """
    import pytest

    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if _PG_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.xdist_group("postgres"))  # type: ignore[attr-defined]
