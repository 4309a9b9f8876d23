"""``harness chaos``: the cancellation / I/O fault / crash explorer (harness.faults._cli,
unchanged: its own options, output and progress)."""

from __future__ import annotations

import argparse

import click


def _run(args: argparse.Namespace) -> int:
    import harness.faults._cli

    return harness.faults._cli.main(args)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    # Imported when the command runs, not when the CLI is built: harness.faults imports
    # trio.testing and so pytest, which every other command (and `harness bench`'s heap)
    # would otherwise carry.
    from harness.faults._cli import add_arguments

    add_arguments(parser)


def command() -> click.Command:
    from harness.cli._passthrough import passthrough

    return passthrough(
        "chaos",
        "explore cancellations, I/O failures and crashes over built-in scenarios",
        _add_arguments,
        _run,
    )
