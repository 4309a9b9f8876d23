"""`harness bench`: the workloads of architecture §8.

``WORKLOADS`` and ``run_bench`` are imported on first use: importing the package (as
``harness bench --help`` does for the workload list, :mod:`harness.bench._descriptions`)
must not pull in the runtime, Trio and the database drivers the workloads need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.bench._cli import WORKLOADS, run_bench


def __getattr__(name: str) -> Any:
    if name in ("WORKLOADS", "run_bench"):
        from harness.bench import _cli

        return getattr(_cli, name)
    raise AttributeError(f"module 'harness.bench' has no attribute {name!r}")


__all__ = ["WORKLOADS", "run_bench"]
