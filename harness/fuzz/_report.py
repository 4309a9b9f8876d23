"""A pytest plugin (``-p harness.fuzz._report``): prints the fuzz cases explored per
entry point at the end of the run, and writes them as JSON for ``harness fuzz``."""

from __future__ import annotations

import json
import os
from typing import Any

from harness.fuzz._budget import explored_counts

COUNTS_FILE_ENV = "HARNESS_FUZZ_COUNTS"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    counts = explored_counts()
    if not counts:
        return
    terminalreporter.section("fuzz cases explored per entry point")
    width = max(map(len, counts))
    for name, n in counts.items():
        terminalreporter.write_line(f"{name:<{width}}  {n:>7}")
    path = os.environ.get(COUNTS_FILE_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(counts, f)
