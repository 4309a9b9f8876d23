"""``harness demo``: the walk through a session, the store, resume and compaction
(the story itself is harness.demo)."""

from __future__ import annotations

import click

from harness.cli._output import CONTEXT


def command() -> click.Command:
    @click.command("demo", context_settings=CONTEXT, short_help="A walk through a session, the store, resume, fork and compaction.")
    @click.option(
        "--root",
        metavar="DIR",
        default=None,
        help="directory for the demo's session logs (default: a fresh temporary one, so the demo never "
        "touches your store)",
    )
    def demo(root: str | None) -> None:
        """A short walk through a session: the log, the store, a crash and its repair,
        resume, fork and compaction."""
        import harness.demo

        raise SystemExit(harness.demo.run_demo(root=root))

    return demo
