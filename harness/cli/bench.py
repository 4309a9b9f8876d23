"""``harness bench``: the benchmark workloads (docs/architecture.md, Performance)."""

from __future__ import annotations

import click

from harness.cli._output import CONTEXT


def _workload_list() -> str:
    from harness.bench._descriptions import DESCRIPTIONS

    # \b keeps Click from re-wrapping the list into one paragraph.
    return "\b\nWorkloads:\n" + "\n".join(f"  {name:<5} {text}" for name, text in DESCRIPTIONS.items())


def command() -> click.Command:
    @click.command("bench", context_settings=CONTEXT, epilog=_workload_list(), short_help="Run benchmark workloads (W1..W20, M1).")
    @click.argument("workloads", nargs=-1, metavar="[WORKLOAD]...")
    @click.option("--n", type=click.IntRange(min=100), default=100_000, show_default=True, help="events per workload")
    @click.option("--runs", type=click.IntRange(min=1), default=5, show_default=True, help="runs per workload; the median is reported")
    @click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
    @click.option(
        "--backend",
        type=click.Choice(("all", "jsonl", "sqlite", "postgres")),
        default="all",
        show_default=True,
        help="backends the durable workloads W9/W10 run on; postgres: W5/W7 also on SQLite and PostgreSQL "
        "(HARNESS_BENCH_POSTGRES_URL, or a throwaway local cluster)",
    )
    def bench(workloads: tuple[str, ...], n: int, runs: int, as_json: bool, backend: str) -> None:
        """Run benchmark workloads (default: all), e.g. `harness bench W4 W6 --runs 3`;
        a variant name (W2b, W9-sqlite, ...) runs its workload and keeps that result.
        A progress bar on stderr when it is a terminal."""
        import harness.bench

        raise SystemExit(harness.bench.run_bench(list(workloads), n=n, runs=runs, as_json=as_json, backend=backend))

    return bench
