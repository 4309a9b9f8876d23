"""``harness chaos``: fault-exploration campaigns over the built-in scenarios."""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from typing import Final, TextIO

import attrs

from harness.faults._backends import BACKENDS, postgres_server
from harness.faults._explore import ExploreReport, ProgressFn, ReplayKey, Scenario, explore
from harness.faults._io import explore_crash, explore_io, kill_campaign, replay

MODES: Final = ("checkpoints", "io", "crash")
POSTGRES: Final = "postgres"


@attrs.frozen
class Budget:
    """How much of the step space a campaign covers.

    ``stride``: per (scenario base name, mode), explore every ``stride``-th step (seed
    ``s`` starts at ``1 + s % stride``, so ``stride`` seeds cover every step). ``kills``:
    SIGKILL rounds per backend (at least; 4 per seed with more seeds).
    """

    name: str
    stride: dict[tuple[str, str], int]
    kills: int

    def stride_for(self, scenario: Scenario, mode: str) -> int:
        return self.stride.get((scenario.name.split("/")[0], mode), 1)


#: ``ci`` keeps the whole campaign (every scenario, both backends, every mode) to a few
#: minutes on 2 cores: every step of every scenario, one seed (``--seeds`` multiplies
#: it), 8 SIGKILL rounds per backend. ``full`` differs in its 50 rounds per backend; give
#: a stride per (scenario, mode) here to bound a budget further.
BUDGETS: Final = {
    "ci": Budget("ci", {}, kills=8),
    "full": Budget("full", {}, kills=50),
}


@attrs.define
class Campaign:
    """What a ``harness chaos`` run found."""

    reports: list[ExploreReport] = attrs.Factory(list)
    wall_time: float = 0.0

    @property
    def violations(self) -> int:
        return sum(len(r.violations) for r in self.reports)

    def to_json(self) -> dict[str, object]:
        return {
            "reports": [r.to_json() for r in self.reports],
            "violations": self.violations,
            "attempts": sum(r.attempts for r in self.reports),
            "wall_time": round(self.wall_time, 3),
        }


class Progress:
    """A progress line on ``stream``: ``\\r`` updates on a terminal, otherwise one line
    per finished report (CI logs stay readable)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._last = 0.0

    def update(self, label: str, done: int, total: int) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        width = 24
        filled = width * done // max(total, 1)
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r[{bar}] {done:>5}/{total:<5} {label[:60]:<60}")
        self.stream.flush()

    def finished(self, report: ExploreReport) -> None:
        if self.tty:
            self.stream.write("\r" + " " * 100 + "\r")
        steps = ", ".join(f"{c} {n}" for c, n in report.steps.items())
        self.stream.write(
            f"chaos: {report.scenario} {report.mode}: {report.attempts} attempts ({steps}), "
            f"{len(report.violations)} violation(s), {report.wall_time:.1f}s\n"
        )
        self.stream.flush()


@attrs.frozen
class Item:
    """One unit of a campaign: a scenario in one mode (or a SIGKILL campaign)."""

    scenario: str
    mode: str
    seeds: int
    stride: int = 1
    kills: int = 0


def plan_campaign(scenarios: Sequence[Scenario], *, modes: Sequence[str], seeds: int, budget: Budget) -> list[Item]:
    """Every scenario in every mode it supports (of ``modes``); with mode ``crash``, a
    SIGKILL campaign per backend the scenarios use."""
    items: list[Item] = []
    for mode in modes:
        for scenario in scenarios:
            if mode in scenario.modes:
                items.append(Item(scenario.name, mode, seeds, budget.stride_for(scenario, mode)))
        if mode == "crash":
            for kind in BACKENDS:
                if any(s.backend == kind for s in scenarios):
                    # More seeds, more kills (4 per seed), but at least the budget's.
                    items.append(Item(f"sigkill/{kind}", "kill", seeds, kills=max(budget.kills, 4 * seeds)))
    return items


def run_item(item: Item, progress: ProgressFn | None = None) -> ExploreReport:
    """Run one campaign item (blocking; also the worker function of ``--jobs``)."""
    from harness.faults._scenarios import select_scenarios

    if item.mode == "kill":
        return kill_campaign(item.scenario.split("/")[1], kills=item.kills, progress=progress)
    scenario = select_scenarios([item.scenario])[0]
    if item.mode == "checkpoints":
        return explore(scenario, seeds=item.seeds, stride=item.stride, progress=progress)
    if item.mode == "io":
        return explore_io(scenario, seeds=item.seeds, stride=item.stride, progress=progress)
    return explore_crash(scenario, seeds=item.seeds, stride=item.stride, progress=progress)


def run_campaign(
    scenarios: Sequence[Scenario],
    *,
    modes: Sequence[str],
    seeds: int,
    budget: Budget,
    jobs: int = 1,
    progress: ProgressFn | None = None,
    on_report: Callable[[ExploreReport], None] | None = None,
) -> Campaign:
    """Run :func:`plan_campaign`'s items, in order, or on ``jobs`` worker processes
    (each exploration owns Trio's process-global scheduler state, so parallelism is
    by process). Reports come back in plan order either way. Blocking."""
    started = time.perf_counter()
    items = plan_campaign(scenarios, modes=modes, seeds=seeds, budget=budget)
    reports: list[ExploreReport | None] = [None] * len(items)
    if jobs <= 1:
        for i, item in enumerate(items):
            reports[i] = report = run_item(item, progress)
            if on_report is not None:
                on_report(report)
    else:
        context = multiprocessing.get_context("spawn")  # no fork of a process with threads
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            futures = {pool.submit(run_item, item): i for i, item in enumerate(items)}
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                reports[futures[future]] = report = future.result()
                if progress is not None:
                    progress(f"{report.scenario} {report.mode}", done, len(items))
                if on_report is not None:
                    on_report(report)
    campaign = Campaign([r for r in reports if r is not None])
    campaign.wall_time = time.perf_counter() - started
    return campaign


def summary_table(campaign: Campaign) -> str:
    """One row per (scenario, mode, canceller or fault): steps explored, violations;
    attempts and wall time on each report's first row."""
    header = ("scenario", "backend", "mode", "canceller", "steps", "attempts", "violations", "wall")
    rows: list[tuple[str, ...]] = [header]
    for r in campaign.reports:
        by_canceller: dict[str, int] = {}
        for v in r.violations:
            by_canceller[v.canceller] = by_canceller.get(v.canceller, 0) + 1
        names = list(r.steps) or ["-"]
        extra = sorted(set(by_canceller) - set(names))  # e.g. violations of a dry run
        for i, name in enumerate([*names, *extra]):
            first = i == 0
            rows.append(
                (
                    r.scenario.split("/")[0] if first else "",
                    (r.backend or "-") if first else "",
                    r.mode if first else "",
                    name,
                    str(r.steps.get(name, 0)),
                    str(r.attempts) if first else "",
                    str(by_canceller.get(name, 0)),
                    f"{r.wall_time:.1f}s" if first else "",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    total = sum(r.attempts for r in campaign.reports)
    lines.append(f"{total} attempts, {campaign.violations} violation(s), {campaign.wall_time:.1f}s")
    return "\n".join(lines)


def violations_text(campaign: Campaign) -> str:
    """Each distinct violation once: its replay key, how often it was hit, the message,
    and where the fault was injected."""
    out: list[str] = []
    for r in campaign.reports:
        for v, n in r.distinct():
            out.append(f"{v.key}  (x{n})\n    {v.message}")
            if v.task:
                out.append(f"    injected before a step of {v.task}")
                out.extend(f"      {frame}" for frame in v.stack[-6:])
    return "\n".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="scenario names (default: all); NAME selects every backend it runs on, NAME/BACKEND one (jsonl, sqlite, jsonl-zstd, postgres: a throwaway local cluster unless HARNESS_BENCH_POSTGRES_URL is set)")
    parser.add_argument("--seeds", type=int, default=1, help="schedule seeds to explore per step (default 1)")
    parser.add_argument("--mode", choices=[*MODES, "all"], default="all", help="what to inject (default: all)")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="full", help="ci: every step, 8 SIGKILL rounds per backend (CI); full: 50 rounds (default)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--json", action="store_true", help="print the campaign as JSON on stdout")
    parser.add_argument("--list", action="store_true", help="list the built-in scenarios and exit")
    parser.add_argument("--replay", metavar="KEY", help="re-run one attempt by its replay key and show what it found")


def main(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``harness chaos``; returns the exit status (1 if any violation)."""
    from harness.faults._scenarios import builtin_scenarios, select_scenarios

    out = out or sys.stdout
    err = err or sys.stderr
    if args.seeds < 1 or args.jobs < 1:
        err.write("harness chaos: --seeds and --jobs must be >= 1\n")
        return 2
    if args.list:
        for s in builtin_scenarios():
            out.write(f"{s.name:<22} {', '.join(s.modes):<22} cancellers: {', '.join(s.cancellers)}\n    {s.description}\n")
        return 0
    if args.replay is not None:
        # `--replay ""` is a bad key, not "no key": it must not start a full campaign.
        return _replay(args.replay, out, err)
    try:
        scenarios = select_scenarios(args.scenarios)
    except KeyError as exc:
        names = sorted({s.name.split("/")[0] for s in builtin_scenarios()})
        err.write(f"harness chaos: unknown scenario {exc.args[0]!r} (known: {', '.join(names)})\n")
        return 2
    modes = MODES if args.mode == "all" else (args.mode,)
    progress = Progress(err)
    with contextlib.ExitStack() as stack:
        if any(s.backend == POSTGRES for s in scenarios):
            # Its own server (or HARNESS_BENCH_POSTGRES_URL's) for the whole campaign;
            # without one the kind is skipped, saying why.
            if stack.enter_context(postgres_server(err)) is None:
                scenarios = [s for s in scenarios if s.backend != POSTGRES]
        campaign = run_campaign(
            scenarios,
            modes=modes,
            seeds=args.seeds,
            budget=BUDGETS[args.budget],
            jobs=args.jobs,
            progress=progress.update,
            on_report=progress.finished,
        )
    if args.json:
        json.dump(campaign.to_json(), out, indent=2)
        out.write("\n")
    else:
        out.write(summary_table(campaign) + "\n")
        if campaign.violations:
            out.write("\nviolations (replay with: harness chaos --replay KEY)\n" + violations_text(campaign) + "\n")
    return 1 if campaign.violations else 0


def _replay(text: str, out: TextIO, err: TextIO) -> int:
    from harness.faults._scenarios import select_scenarios

    try:
        key = ReplayKey.parse(text)
        scenario = select_scenarios([key.scenario])[0]
    except (ValueError, KeyError) as exc:
        err.write(f"harness chaos: cannot replay {text!r}: {exc}\n")
        return 2
    if scenario.name != key.scenario:
        err.write(f"harness chaos: {key.scenario!r} names several scenarios; add /BACKEND\n")
        return 2
    with contextlib.ExitStack() as stack:
        if scenario.backend == POSTGRES and stack.enter_context(postgres_server(err)) is None:
            return 2
        attempt = replay(scenario, key)
    out.write(
        f"{attempt.key}: {attempt.outcome}, {attempt.steps} steps, "
        f"{'fired' if attempt.fired else 'not fired'}, {attempt.wall_time:.2f}s\n"
    )
    if attempt.task:
        out.write(f"injected before a step of {attempt.task}\n")
        out.writelines(f"  {frame}\n" for frame in attempt.stack)
    for v in attempt.violations:
        out.write(f"violation: {v.message}\n")
        if v.traceback:
            out.write(v.traceback + "\n")
    return 1 if attempt.violations else 0
