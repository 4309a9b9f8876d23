"""``harness demo``: the walk through a session, the store, resume and compaction
(the story itself is harness.demo)."""

from __future__ import annotations

from pathlib import Path

import click

from harness._paths import blocking_file
from harness.cli._output import CONTEXT

EXIT_USAGE = 2  # the exit codes of docs/cli.md (harness sessions' table)
EXIT_REFUSED = 6


def held_sessions(root: Path) -> Path | None:
    """A session log already under ``root``, at a store's depth (``<cwd>/<id>/``) or a
    demo's (``<act>/<cwd>/<id>/``); ``None`` when there is none. The demo creates
    sessions with fixed ids, so a second run on the same root would collide."""
    for pattern in ("*/*/session.jsonl*", "*/*/*/session.jsonl*"):
        found = next(root.glob(pattern), None)
        if found is not None:
            return found
    return None


def _refuse(message: str, code: str, status: int) -> None:
    click.echo(f"harness demo: error: {message} [{code}]", err=True)
    raise SystemExit(status)


def command() -> click.Command:
    @click.command("demo", context_settings=CONTEXT, short_help="A walk through a session, the store, resume, fork and compaction.")
    @click.option(
        "--root",
        metavar="DIR",
        default=None,
        help="a new or empty directory for the demo's session logs (default: a fresh temporary one, so the demo "
        "never touches your store); one that already holds sessions is refused",
    )
    def demo(root: str | None) -> None:
        """A short walk through a session: the log, the store, a crash and its repair,
        resume, fork and compaction."""
        if root is not None:
            where = Path(root).expanduser()
            blocked = blocking_file(where)
            if blocked is not None:
                _refuse(f'"{blocked}" is not a directory: --root names the directory the demo writes under', "NOT_A_DIRECTORY", EXIT_USAGE)
            held = held_sessions(where) if where.is_dir() else None
            if held is not None:
                _refuse(
                    f'"{where}" already holds sessions ({held}): the demo writes its own, with fixed ids; '
                    "pass a new or empty directory, or omit --root",
                    "SESSION_ALREADY_EXISTS",
                    EXIT_REFUSED,
                )
            root = str(where)
        import harness.demo

        raise SystemExit(harness.demo.run_demo(root=root))

    return demo
