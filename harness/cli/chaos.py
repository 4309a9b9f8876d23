"""``harness chaos``: the cancellation / I/O fault / crash explorer (harness.faults._cli,
unchanged: its own options, output and progress)."""

from __future__ import annotations

import argparse

import click


def _run(args: argparse.Namespace) -> int:
    import harness.faults._cli

    return harness.faults._cli.main(args)


def command() -> click.Command:
    from harness.cli._passthrough import passthrough
    from harness.faults._cli import add_arguments

    return passthrough("chaos", "explore cancellations, I/O failures and crashes over built-in scenarios", add_arguments, _run)
