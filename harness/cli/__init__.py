"""The ``harness`` command line, on Click: one module per command (``demo``, ``chat``,
``sessions``, ``bench``, ``chaos``, ``fuzz``) and shared output rules in ``_output``.

``main(argv)`` runs it and exits with the command's status (the console script
``harness = "harness.cli:main"``; ``python -m harness.cli`` too). Each command module
imports its heavy dependencies only when it runs, so ``harness --help`` stays fast.
"""

from __future__ import annotations

import click

from harness.cli._output import CONTEXT, ROOT_ENV, default_root


def app() -> click.Group:
    """The ``harness`` group with every command; built per call, so ``--help`` shows the
    store root of the current environment."""
    from harness.cli import bench, chaos, chat, demo, fuzz, sessions

    @click.group(
        context_settings=CONTEXT,
        # \b: Click keeps these lines as they are (a path is never wrapped).
        epilog=(
            "\b\n"
            "Store root of every command without --root:\n"
            f"  {default_root()}\n"
            f"  (${ROOT_ENV}, else $XDG_DATA_HOME/trio-harness/sessions)\n"
            "Shell completion (bash; zsh_source, fish_source for the others):\n"
            '  eval "$(_HARNESS_COMPLETE=bash_source harness)"'
        ),
    )
    @click.version_option(package_name="trio-harness", prog_name="harness", message="%(prog)s %(version)s")
    def harness() -> None:
        """An actor-model runtime for event-sourced AI-agent sessions, on Trio."""

    for command in (demo.command(), chat.command(), sessions.command(), bench.command(), chaos.command(), fuzz.command()):
        harness.add_command(command)
    return harness


def main(argv: list[str] | None = None) -> None:
    """Run ``harness ARGV`` (``sys.argv`` by default) and exit with its status: usage
    errors print the subcommand's usage and exit 2."""
    app().main(args=argv, prog_name="harness")


__all__ = ["app", "main"]
