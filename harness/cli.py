"""The `harness` command: `harness demo`, `harness chat`, `harness sessions`, `harness bench`, `harness chaos`, `harness fuzz`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a short walk through a session")
    demo.add_argument("--root", default=None, help="directory for session logs (default: a fresh temporary one)")
    bench = sub.add_parser("bench", help="run benchmark workloads")
    bench.add_argument("workloads", nargs="*", help="workload ids (default: all), e.g. W4 W6")
    bench.add_argument("--n", type=int, default=100_000, help="events per workload (default 100000)")
    bench.add_argument("--runs", type=int, default=5, help="runs per workload; the median is reported")
    bench.add_argument("--json", action="store_true", help="print machine-readable JSON")
    bench.add_argument(
        "--backend",
        choices=("all", "jsonl", "sqlite", "postgres"),
        default="all",
        help="backends the durable workloads W9/W10 run on (default: all); postgres: W5/W7 also on "
        "SQLite and PostgreSQL (HARNESS_BENCH_POSTGRES_URL, or a throwaway local cluster)",
    )
    from harness.faults._cli import add_arguments

    chaos = sub.add_parser("chaos", help="explore cancellations, I/O failures and crashes over built-in scenarios")
    add_arguments(chaos)
    from harness.fuzz._runner import add_arguments as add_fuzz_arguments

    fuzz = sub.add_parser("fuzz", help="fuzz every entry point: Hypothesis cases, then coverage-guided readers")
    add_fuzz_arguments(fuzz)
    from harness._chat import register as register_chat
    from harness._sessions_cli import register as register_sessions

    register_chat(sub)
    register_sessions(sub)
    args = parser.parse_args(argv)
    if args.command == "chat":
        from harness._chat import run as chat_run

        sys.exit(chat_run(args))
    if args.command == "sessions":
        from harness._sessions_cli import main as sessions_main

        sys.exit(sessions_main(args))
    if args.command == "chaos":
        from harness.faults._cli import main as chaos_main

        sys.exit(chaos_main(args))
    if args.command == "fuzz":
        from harness.fuzz._runner import main as fuzz_main

        sys.exit(fuzz_main(args))
    if args.command == "bench":
        from harness.bench import run_bench

        if args.n < 100 or args.runs < 1:
            parser.error("--n must be >= 100 and --runs >= 1")
        sys.exit(run_bench(args.workloads, n=args.n, runs=args.runs, as_json=args.json, backend=args.backend))
    from harness.demo import run_demo

    sys.exit(run_demo(root=args.root))


if __name__ == "__main__":
    main()
