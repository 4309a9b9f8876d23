"""``harness fuzz``: the Hypothesis fuzz cases, then the coverage-guided readers
(harness.fuzz._runner)."""

from __future__ import annotations

import argparse

import click


def _run(args: argparse.Namespace) -> int:
    from harness.fuzz._runner import main

    return main(args)


def command() -> click.Command:
    from harness.cli._passthrough import passthrough
    from harness.fuzz._runner import add_arguments

    return passthrough("fuzz", "fuzz every entry point: Hypothesis cases, then coverage-guided readers", add_arguments, _run)
