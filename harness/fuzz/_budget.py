"""Example budgets for the Hypothesis fuzz tests and the per-entry-point case count."""

from __future__ import annotations

import os
from collections import Counter
from typing import Final

#: ``HARNESS_FUZZ`` -> the factor applied to each test's base example count. ``dev``
#: keeps a local run of one fuzz file to seconds on a shared machine; ``ci`` is the
#: bounded section of ``python3 dev.py test``; ``long`` is the on-demand campaign.
BUDGETS: Final = {"dev": 0.2, "ci": 0.6, "long": 20.0}
ENV: Final = "HARNESS_FUZZ"

#: The coverage-guided targets (:mod:`harness.fuzz._targets`), named here so that the
#: CLI can offer them without importing the readers.
TARGETS: Final = ("jsonl", "jsonl-zstd", "sqlite-rows")
#: The corpus directory (under ``tests/fuzz_corpus``) of each target.
CORPUS_DIRS: Final = {"jsonl": "jsonl", "jsonl-zstd": "jsonl_zstd", "sqlite-rows": "sqlite_rows"}

_counts: Counter[str] = Counter()


def budget(base: int) -> int:
    """The number of Hypothesis examples for a test whose CI budget is ``base``."""
    name = os.environ.get(ENV, "ci")
    if name not in BUDGETS:
        raise ValueError(f"{ENV} must be one of {', '.join(BUDGETS)}, got {name!r}")
    return max(1, round(base * BUDGETS[name]))


def explored(entry_point: str, n: int = 1) -> None:
    """Count ``n`` fuzz cases run against ``entry_point`` (printed by the report)."""
    _counts[entry_point] += n


def explored_counts() -> dict[str, int]:
    """The cases explored so far in this process, per entry point."""
    return dict(sorted(_counts.items()))
