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
from typing import Any, Final, TextIO

import attrs

from harness.faults._backends import BACKENDS, postgres_server
from harness.faults._explore import ProgressFn, Scenario, explore
from harness.faults._io import explore_crash, explore_io, kill_campaign, replay
from harness.faults._report import ExploreReport, ReplayKey

MODES: Final = ("checkpoints", "io", "crash")
POSTGRES: Final = "postgres"


@attrs.frozen
class Budget:
    """How much of the step space a campaign covers.

    ``stride``: per (scenario base name, mode), explore every ``stride``-th step (seed
    ``s`` starts at ``1 + s % stride``, so ``stride`` seeds cover every step);
    ``mode_stride``: the stride of a mode's other scenarios (1 when absent). ``kills``:
    SIGKILL rounds per backend (at least; 4 per seed with more seeds).
    """

    name: str
    stride: dict[tuple[str, str], int]
    kills: int
    mode_stride: dict[str, int] = attrs.field(factory=dict)

    def stride_for(self, scenario: Scenario, mode: str) -> int:
        return self.stride.get((scenario.name.split("/")[0], mode), self.mode_stride.get(mode, 1))


#: ``ci`` keeps the whole campaign (every scenario, every backend, every mode) to under
#: two minutes on 2 cores, so that ``python3 dev.py test`` stays under eight: every
#: third scheduler step and every third file operation of each scenario (seed 0
#: explores steps 1, 4, 7, ...; ``--seeds 3`` covers them all), every crash point, one seed,
#: 8 SIGKILL rounds per backend. ``full`` explores every step of every mode, with 50
#: rounds per backend; give a stride per (scenario, mode) to bound a budget further.
BUDGETS: Final = {
    # group-commit's checkpoints: every 6th (write-behind explores a writer's own steps);
    # group-chain's: every one (24 steps; each attempt meets another chain interleaving).
    "ci": Budget(
        "ci",
        {("group-commit", "checkpoints"): 6, ("group-chain", "checkpoints"): 1},
        kills=8,
        mode_stride={"checkpoints": 3, "io": 3},
    ),
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

    @property
    def groups(self) -> int:
        """Distinct causes (:attr:`ExploreReport.groups`), summed over the reports."""
        return sum(len(r.groups) for r in self.reports)

    def to_json(self) -> dict[str, object]:
        return {
            "reports": [r.to_json() for r in self.reports],
            "violations": self.violations,
            "groups": self.groups,
            "attempts": sum(r.attempts for r in self.reports),
            "wall_time": round(self.wall_time, 3),
        }


class Progress:
    """Progress on ``stream``: a Rich progress bar on a terminal (the current item,
    attempts done of its total), otherwise one line per finished report (CI logs stay
    readable). :meth:`close` stops the bar."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._last = 0.0
        self._bar: Any = None
        self._task: Any = None
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            console = Console(file=stream, force_terminal=True)
            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                auto_refresh=False,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("chaos", total=None)

    def update(self, label: str, done: int, total: int) -> None:
        if self._bar is None:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        self._bar.update(self._task, description=label[:60], completed=done, total=max(total, 1))
        self._bar.refresh()

    def finished(self, report: ExploreReport) -> None:
        steps = ", ".join(f"{c} {n}" for c, n in report.steps.items())
        groups = len(report.groups)
        line = (
            f"chaos: {report.scenario} {report.mode}: {report.attempts} attempts ({steps}), "
            f"{len(report.violations)} violation(s) in {groups} group(s), {report.wall_time:.1f}s"
        )
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
            self._bar.refresh()
            return
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@attrs.frozen
class Item:
    """One unit of a campaign: a scenario in one mode (or a SIGKILL campaign)."""

    scenario: str
    mode: str
    seeds: int
    stride: int = 1
    kills: int = 0
    max_attempts: int | None = None
    max_seconds: float | None = None


def plan_campaign(
    scenarios: Sequence[Scenario],
    *,
    modes: Sequence[str],
    seeds: int,
    budget: Budget,
    max_attempts: int | None = None,
    max_seconds: float | None = None,
) -> list[Item]:
    """Every scenario in every mode it supports (of ``modes``); with mode ``crash``, a
    SIGKILL campaign per backend the scenarios use. ``max_attempts`` / ``max_seconds``
    bound each checkpoint item."""
    items: list[Item] = []
    for mode in modes:
        for scenario in scenarios:
            if mode in scenario.modes:
                item = Item(scenario.name, mode, seeds, budget.stride_for(scenario, mode))
                if mode == "checkpoints":
                    item = attrs.evolve(item, max_attempts=max_attempts, max_seconds=max_seconds)
                items.append(item)
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
        return explore(
            scenario,
            seeds=item.seeds,
            stride=item.stride,
            progress=progress,
            max_attempts=item.max_attempts,
            max_seconds=item.max_seconds,
        )
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
    max_attempts: int | None = None,
    max_seconds: float | None = None,
) -> Campaign:
    """Run :func:`plan_campaign`'s items, in order, or on ``jobs`` worker processes
    (each exploration owns Trio's process-global scheduler state, so parallelism is
    by process). Reports come back in plan order either way. Blocking."""
    started = time.perf_counter()
    items = plan_campaign(
        scenarios, modes=modes, seeds=seeds, budget=budget, max_attempts=max_attempts, max_seconds=max_seconds
    )
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
    header = ("scenario", "backend", "mode", "canceller", "steps", "attempts", "violations", "groups", "wall")
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
                    str(len(r.groups)) if first else "",
                    f"{r.wall_time:.1f}s" if first else "",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    total = sum(r.attempts for r in campaign.reports)
    lines.append(
        f"{total} attempts, {campaign.violations} violation(s) in {campaign.groups} group(s), {campaign.wall_time:.1f}s"
    )
    return "\n".join(lines)


def violations_text(campaign: Campaign) -> str:
    """The grouped summary (``str(report)``) of every report that found something: per
    cause, its count, smallest k, the causal report of its first violation (injection
    point, tasks that received ``Cancelled``, detection site or blocked tasks) and its
    replay keys."""
    return "\n\n".join(str(r) for r in campaign.reports if r.violations)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="scenario names (default: all); NAME selects every backend it runs on, NAME/BACKEND one (jsonl, sqlite, jsonl-zstd, postgres: a throwaway local cluster unless HARNESS_BENCH_POSTGRES_URL is set)")
    parser.add_argument("--seeds", type=int, default=1, help="schedule seeds to explore per step (default 1)")
    parser.add_argument("--mode", choices=[*MODES, "all"], default="all", help="what to inject (default: all)")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="full", help="ci: every 3rd step of the checkpoints and io modes, every crash point, 8 SIGKILL rounds per backend (CI); full: every step, 50 rounds (default)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--json", action="store_true", help="print the campaign as JSON on stdout")
    parser.add_argument("--list", action="store_true", help="list the built-in scenarios and exit")
    parser.add_argument("--replay", metavar="KEY", help="re-run one attempt by its replay key and show what it found")
    parser.add_argument("--max-attempts", type=int, metavar="N", help="stop each checkpoint exploration after N attempts")
    parser.add_argument("--max-seconds", type=float, metavar="S", help="stop each checkpoint exploration after S seconds")


def main(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``harness chaos``; returns the exit status (1 if any violation)."""
    from harness.faults._scenarios import builtin_scenarios, select_scenarios

    out = out or sys.stdout
    err = err or sys.stderr
    if args.seeds < 1 or args.jobs < 1:
        err.write("harness chaos: --seeds and --jobs must be >= 1\n")
        return 2
    if args.list:
        scenarios = builtin_scenarios()
        name_w = max(len(s.name) for s in scenarios)
        modes_w = max(len(", ".join(s.modes)) for s in scenarios)
        for s in scenarios:
            out.write(
                f"{s.name:<{name_w}}  {', '.join(s.modes):<{modes_w}}  cancellers: {', '.join(s.cancellers)}\n    {s.description}\n"
            )
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
        stack.callback(progress.close)
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
            max_attempts=getattr(args, "max_attempts", None),
            max_seconds=getattr(args, "max_seconds", None),
        )
    if args.json:
        json.dump(campaign.to_json(), out, indent=2)
        out.write("\n")
    else:
        out.write(summary_table(campaign) + "\n")
        if campaign.violations:
            out.write("\nviolations by cause (replay with: harness chaos --replay KEY)\n" + violations_text(campaign) + "\n")
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
    if attempt.injection is not None:
        out.write(f"Cancelled delivered first to {attempt.injection}\n")
    if attempt.cancelled:
        out.write("received Cancelled: " + "; ".join(str(t) for t in attempt.cancelled) + "\n")
    for v in attempt.violations:
        out.write(f"violation ({v.kind}): {v.message}\n")
        out.writelines(line + "\n" for line in v.describe("  ")[1:])
        if v.traceback:
            out.write(v.traceback + "\n")
    return 1 if attempt.violations else 0
