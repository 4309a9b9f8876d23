"""Commands whose options are declared with ``argparse`` by their own package
(``harness chaos``: harness.faults; ``harness fuzz``: harness.fuzz): Click hands them
every argument and the package's parser prints its own usage."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import click

from harness.cli._output import CONTEXT


def passthrough(
    name: str, summary: str, add_arguments: Callable[[argparse.ArgumentParser], None], run: Callable[[argparse.Namespace], int]
) -> click.Command:
    """A Click command ``name`` that parses its arguments with ``add_arguments``'s
    parser (``prog`` ``harness NAME``: a bad flag prints that usage, exit 2) and exits
    with ``run``'s status."""

    @click.command(
        name,
        help=summary[:1].upper() + summary[1:] + ".",
        short_help=summary[:1].upper() + summary[1:] + ".",
        add_help_option=False,
        context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        parser = argparse.ArgumentParser(prog=f"harness {name}", description=summary)
        add_arguments(parser)
        raise SystemExit(run(parser.parse_args(list(args))))

    return command
