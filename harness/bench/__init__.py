"""`harness bench`: the workloads of architecture §8."""

from harness.bench._cli import WORKLOADS, run_bench

__all__ = ["WORKLOADS", "run_bench"]
