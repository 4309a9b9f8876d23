"""Selecting and running workloads, printing text or JSON."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from functools import partial

import orjson

from harness.bench import (
    _actors,
    _backends,
    _compaction,
    _concurrency,
    _core,
    _disk,
    _durable,
    _faults,
    _handoff,
    _peer,
    _procs,
    _scoped,
    _streaming,
)
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
    "W9": _durable.w9,
    "W10": _durable.w10,
    "W11": _durable.w11,
    "W12": _actors.w12,
    "W13": _faults.w13,
    "W15": _streaming.w15,
    "W16": _scoped.w16,
    "W17": _concurrency.w17,
    "W18": _procs.w18,
    "W19": _handoff.w19,
    "W20": _peer.w20,
    "M1": _durable.m1,
}
"""Workload ids; each may produce several variants (e.g. W2 -> W2, W2b)."""


_VARIANT_OF = {"W2b": "W2", "W4-snapshot": "W4", "W1-actor": "W1", "W1-actor-batch": "W1", "W5-write": "W5", "W5-load": "W5", "W4-disk": "W5", "W9-sqlite": "W9", "W10-sqlite": "W10"}
_VARIANT_OF.update({f"{base}-durable{kind}": base for base in ("W9", "W10") for kind in ("", "-sqlite")})
_VARIANT_OF.update({f"W15{kind}-{mb}MB": "W15" for kind in ("", "-provider", "-sse") for mb in _streaming.SIZES_MB})
_VARIANT_OF.update({f"W16-{count}": "W16" for count in _scoped.AGENTS})
_VARIANT_OF.update(
    {f"W17{form}-{kind}-{k}": "W17" for form in ("", "-durable") for kind in _concurrency.BACKENDS for k in _concurrency.LEVELS}
)
_VARIANT_OF.update({f"W18-{kind}": "W18" for kind in _procs.BACKENDS})
_VARIANT_OF.update({f"W19-{form}": "W19" for form in _handoff.FORMS})
_VARIANT_OF.update({f"W20-{form}-{b}": "W20" for form in _peer.FORMS for b in _peer.SHAPES})


BACKEND_CHOICES = ("all", *_durable.BACKENDS)
"""``--backend``: the backends W9/W10 run on (``all``: JSONL and SQLite)."""


def run_bench(selection: Sequence[str], *, n: int, runs: int, as_json: bool, backend: str = "all") -> int:
    """Run the selected workloads (all when empty); print one line per result (or JSON at
    the end) and, on a terminal, a progress bar on stderr over the workloads."""
    from harness.cli._output import progress

    # --backend postgres: W5/W7 on JSONL, SQLite and PostgreSQL side by side (W9/W10 as "all").
    on_postgres = backend == "postgres"
    backends = _durable.BACKENDS if on_postgres else _durable.backends_of(backend)
    workloads: dict[str, Workload] = {
        **WORKLOADS,
        "W9": partial(_durable.w9, backends=backends),
        "W10": partial(_durable.w10, backends=backends),
        # W17/W18: --backend postgres adds PostgreSQL beside the others.
        "W17": partial(_concurrency.w17, backends=(*_durable.BACKENDS, "postgres") if on_postgres else backends),
        "W18": partial(_procs.w18, backends=_procs.BACKENDS if on_postgres else _procs.backends_of(backend)),
    }
    if on_postgres:
        kinds = ("sqlite", "postgres")
        workloads["W5"] = _backends.beside(_disk.w5, _backends.w5_on, kinds)
        workloads["W7"] = _backends.beside(_disk.w7, _backends.w7_on, kinds)
    wanted: list[str] = []
    keep: set[str] | None = None
    for name in selection:
        base = _VARIANT_OF.get(name, name)
        if base not in workloads:
            print(f"harness bench: unknown workload {name!r}; known: {', '.join(workloads)}", file=sys.stderr)
            return 2
        if base not in wanted:
            wanted.append(base)
        if name != base:
            keep = (keep or set()) | {name}
        elif keep is not None:
            keep.add(name)
    if not wanted:
        wanted = list(workloads)
    results: list[Result] = []
    with progress(sys.stderr, "bench", len(wanted)) as advance:
        for name in wanted:
            advance(0, label=f"bench {name} (n={n}, runs={runs})")
            for r in workloads[name](n, runs):
                if keep is None or r.key in keep or (r.key == name and name in selection):
                    results.append(r)
                    if not as_json:
                        print(r.line(), flush=True)
            advance()
    if as_json:
        sys.stdout.write(orjson.dumps({r.key: r.to_json() for r in results}, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
