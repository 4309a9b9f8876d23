"""``harness fuzz``: the Hypothesis fuzz tests, then the coverage-guided runs, with the
cases explored per entry point printed at the end."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import attrs

from harness.fuzz._budget import BUDGETS, CORPUS_DIRS, ENV, TARGETS
from harness.fuzz._report import COUNTS_FILE_ENV

#: Seconds of coverage-guided fuzzing per target, per budget (``--seconds`` overrides).
SECONDS: Final = {"dev": 5, "ci": 8, "long": 600}
_DONE = re.compile(rb"Done (\d+) runs in")
_STAT_RUNS = re.compile(rb"stat::number_of_executed_units:\s*(\d+)")


def repo_root() -> Path | None:
    """The checkout this package runs from (``tests/`` next to ``harness/``), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "tests").is_dir() and (root / "pyproject.toml").is_file() else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="ci",
                        help="example budget of the Hypothesis tests and default seconds per target (default ci)")
    parser.add_argument("--seconds", type=int, default=None,
                        help="seconds of coverage-guided fuzzing per target (default: 5 dev, 8 ci, 600 long)")
    parser.add_argument("--target", action="append", choices=TARGETS, default=None,
                        help="coverage-guided target (repeatable; default: all)")
    parser.add_argument("--no-hypothesis", action="store_true", help="skip the Hypothesis fuzz tests")
    parser.add_argument("--no-coverage", action="store_true", help="skip the coverage-guided runs")
    parser.add_argument("--update-corpus", action="store_true",
                        help="merge the new interesting inputs into tests/fuzz_corpus (for an on-demand run)")


@attrs.define
class TargetRun:
    target: str
    runs: int
    seconds: float
    crashes: list[Path]
    returncode: int
    new_inputs: int
    #: The fuzzer's output tail when it crashed or reported no runs (printed by the
    #: section with the target's verdict, not as it happens: the runs may go on
    #: beside the Hypothesis half).
    output: str = ""


def run_coverage(target: str, seconds: int, root: Path, workdir: Path, update: bool) -> TargetRun:
    seeds = root / "tests" / "fuzz_corpus" / CORPUS_DIRS[target]
    work = workdir / target
    work.mkdir(parents=True)
    cmd = [sys.executable, "-m", "harness.fuzz._coverage", target, str(seconds), str(work)]
    if seeds.is_dir():
        cmd.append(str(seeds))
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, timeout=seconds + 300, check=False)
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr
    m = _DONE.search(output) or _STAT_RUNS.search(output)
    runs = int(m.group(1)) if m else 0
    crashes = sorted(p for p in work.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-", "leak-")))
    tail = output.decode("utf-8", "replace")[-6000:] if crashes or (proc.returncode != 0 and not m) else ""
    new = sorted((work / "corpus").iterdir())
    if update and seeds.is_dir():
        for p in new:
            shutil.copy(p, seeds / p.name)
    return TargetRun(target, runs, elapsed, crashes, proc.returncode, len(new), tail)


def run_hypothesis(root: Path, budget: str, workdir: Path) -> tuple[int, dict[str, int], float]:
    counts_file = workdir / "counts.json"
    env = dict(os.environ, **{ENV: budget, COUNTS_FILE_ENV: str(counts_file)})
    tests = sorted(str(p.relative_to(root)) for p in (root / "tests").glob("test_fuzz_*.py"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "harness.fuzz._report",
           "-m", "fuzz", *tests]
    print("+ " + " ".join(cmd), flush=True)
    started = time.monotonic()
    code = subprocess.run(cmd, cwd=root, env=env, check=False).returncode
    elapsed = time.monotonic() - started
    counts = json.loads(counts_file.read_text()) if counts_file.exists() else {}
    return code, counts, elapsed


def _coverage_runs(targets: Sequence[str], seconds: int, root: Path, workdir: Path, update: bool,
                   advance: Callable[..., None], say: Callable[[str, bool], None], runs: list[TargetRun]) -> bool:
    """Each coverage-guided target in turn, each run appended to ``runs`` as it ends
    (kept if a later one raises); whether any failed."""
    failed = False
    for target in targets:
        say(f"+ coverage-guided fuzzing of {target} for {seconds}s", False)
        advance(0, label=f"fuzz {target} ({seconds}s)")
        run = run_coverage(target, seconds, root, workdir, update)
        advance()
        runs.append(run)
        if run.output:
            say(run.output.rstrip("\n"), True)
        kept = []
        for crash in run.crashes:
            dest = Path.cwd() / f"fuzz-{target}-{crash.name}"
            shutil.copy(crash, dest)
            kept.append(dest)
        if run.crashes:
            failed = True
            say(f"harness fuzz: {target} crashed; inputs kept: {', '.join(map(str, kept))} "
                f"(replay: python -m harness.fuzz._coverage {target} 1 DIR INPUT)", True)
        elif run.runs == 0:
            failed = True
            say(f"harness fuzz: {target}: the fuzzer reported no runs (exit {run.returncode})", True)
    return failed


def _say(line: str, err: bool) -> None:
    print(line, file=sys.stderr if err else sys.stdout, flush=True)


def main(args: argparse.Namespace) -> int:
    """Run the fuzz section: the Hypothesis fuzz tests and, beside them (each is one
    process on one core), each coverage-guided target in turn; print the cases explored
    per entry point. Exit status 1 on any failure or crash."""
    root = repo_root()
    if root is None:
        print("harness fuzz: needs a source checkout (tests/ and tests/fuzz_corpus/)", file=sys.stderr)
        return 2
    seconds = args.seconds if args.seconds is not None else SECONDS[args.budget]
    if seconds < 1:
        print(f"harness fuzz: --seconds must be at least 1, got {seconds}", file=sys.stderr)
        return 2
    failed = False
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="harness-fuzz-") as tmp:
        workdir = Path(tmp)
        counts: dict[str, int] = {}
        runs: list[TargetRun] = []
        coverage: threading.Thread | None = None
        said: list[tuple[str, bool]] = []
        outcome: list[bool] = []  # whether the coverage runs failed, once they returned
        if not args.no_coverage:
            if importlib.util.find_spec("atheris") is None:
                # A declared test dependency on Linux x86-64 (its only wheels): missing
                # there, the section fails; elsewhere it is skipped, loudly.
                required = sys.platform == "linux" and platform.machine() == "x86_64"
                print("harness fuzz: atheris is not installed (pip install -e '.[test]'): the coverage-guided "
                      f"runs are {'missing' if required else 'SKIPPED on this platform'}", file=sys.stderr)
                failed |= required
            else:
                targets = args.target or TARGETS
                if args.no_hypothesis:
                    from harness.cli._output import progress

                    with progress(sys.stderr, "fuzz", len(targets)) as advance:
                        outcome.append(_coverage_runs(targets, seconds, root, workdir, args.update_corpus, advance,
                                                      _say, runs))
                else:
                    # Beside the Hypothesis run, which owns the terminal meanwhile: no
                    # bar, and the lines are printed once both have ended.
                    coverage = threading.Thread(
                        target=lambda: outcome.append(_coverage_runs(
                            targets, seconds, root, workdir, args.update_corpus, lambda *a, **k: None,
                            lambda line, err: said.append((line, err)), runs)),
                        name="harness-fuzz-coverage", daemon=True)
                    coverage.start()
        if not args.no_hypothesis:
            code, counts, h_elapsed = run_hypothesis(root, args.budget, workdir)
            failed |= code != 0
        if coverage is not None:
            coverage.join()
            for line, err in said:
                _say(line, err)
        if outcome:
            failed |= outcome[0]
        elif coverage is not None:
            failed = True  # the thread died before it returned (its traceback is above)
        print("\nfuzz cases explored per entry point")
        width = max([len(k) for k in counts] + [40])
        for name, n in counts.items():
            print(f"  {name:<{width}}  {n:>9}")
        for run in runs:
            name = f"coverage-guided: {run.target}"
            print(f"  {name:<{width}}  {run.runs:>9}  ({run.seconds:.0f}s, {run.new_inputs} new corpus inputs)")
        if not args.no_hypothesis:
            print(f"  hypothesis section: {h_elapsed:.0f}s")
        print(f"fuzz section: {time.monotonic() - started:.0f}s, {'FAILED' if failed else 'ok'}")
    return 1 if failed else 0
