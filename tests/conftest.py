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
