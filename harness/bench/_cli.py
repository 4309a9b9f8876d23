"""Selecting and running workloads, printing text or JSON."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import orjson

from harness.bench import _actors, _compaction, _core, _disk
from harness.bench._runner import Result

Workload = Callable[[int, int], list[Result]]

WORKLOADS: dict[str, Workload] = {
    "W1": lambda n, runs: [*_core.w1(n, runs), *_actors.w1_actor(n, runs)],
    "W2": _core.w2,
    "W3": _actors.w3,
    "W4": _core.w4,
    "W5": _disk.w5,
    "W6": _core.w6,
    "W7": _disk.w7,
    "W8": _compaction.w8,
    "W12": _actors.w12,
}
"""Workload ids; each may produce several variants (e.g. W2 -> W2, W2b)."""

_VARIANT_OF = {"W2b": "W2", "W4-snapshot": "W4", "W1-actor": "W1", "W1-actor-batch": "W1", "W5-write": "W5", "W5-load": "W5", "W4-disk": "W5"}


def run_bench(selection: Sequence[str], *, n: int, runs: int, as_json: bool) -> int:
    wanted: list[str] = []
    keep: set[str] | None = None
    for name in selection:
        base = _VARIANT_OF.get(name, name)
        if base not in WORKLOADS:
            print(f"harness bench: unknown workload {name!r}; known: {', '.join(WORKLOADS)}", file=sys.stderr)
            return 2
        if base not in wanted:
            wanted.append(base)
        if name != base:
            keep = (keep or set()) | {name}
        elif keep is not None:
            keep.add(name)
    if not wanted:
        wanted = list(WORKLOADS)
    results: list[Result] = []
    for name in wanted:
        for r in WORKLOADS[name](n, runs):
            if keep is None or r.key in keep or (r.key == name and name in selection):
                results.append(r)
                if not as_json:
                    print(r.line(), flush=True)
    if as_json:
        sys.stdout.write(orjson.dumps({r.key: r.to_json() for r in results}, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
