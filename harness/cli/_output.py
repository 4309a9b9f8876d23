"""What every ``harness`` command shares: the default store root, colour and width
rules (colour only on a terminal, never with ``NO_COLOR``; clipping only on a
terminal, full detail into a pipe), Rich consoles and progress bars on stderr."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import click
    from rich.console import Console

CONTEXT: Final[dict[str, Any]] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
"""The Click context settings of every command."""

ROOT_ENV: Final = "HARNESS_SESSIONS_ROOT"
NO_CLIP: Final = 1 << 30
"""The width of a stream that is not a terminal: nothing is clipped."""


def default_root() -> Path:
    """The store root every command uses without ``--root``: ``$HARNESS_SESSIONS_ROOT``,
    else ``$XDG_DATA_HOME/trio-harness/sessions`` (``~/.local/share`` without it)."""
    explicit = os.environ.get(ROOT_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "trio-harness" / "sessions"


def is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def use_color(stream: IO[str], mode: str = "auto") -> bool:
    """``--color auto|always|never``: auto is a terminal without ``NO_COLOR``."""
    return mode == "always" or (mode == "auto" and is_terminal(stream) and not os.environ.get("NO_COLOR"))


def text_width(stream: IO[str], width: int | None = None) -> int:
    """The width to clip lines to: ``width`` if given, the terminal's on a terminal,
    else :data:`NO_CLIP` (a pipe or a file gets every character)."""
    if width is not None:
        return max(int(width), 40)
    if is_terminal(stream):
        return max(shutil.get_terminal_size((120, 24)).columns, 40)
    return NO_CLIP


def console(stream: IO[str], mode: str = "auto") -> Console:
    """A Rich console on ``stream`` following the colour rules above."""
    from rich.console import Console

    color = use_color(stream, mode)
    return Console(
        file=stream,
        force_terminal=color or None,
        no_color=not color,
        color_system="auto" if color else None,
        highlight=False,
        soft_wrap=not is_terminal(stream),
    )


@contextmanager
def progress(stream: IO[str], label: str, total: int | None) -> Iterator[Callable[..., None]]:
    """A Rich progress bar on ``stream`` (stderr) while the block runs, only when it is
    a terminal; yields ``advance(n=1, *, label=None)``. Erased at the end."""
    if not is_terminal(stream):
        yield lambda n=1, *, label=None: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    import sys

    # Lines printed meanwhile go above the bar, but only a terminal's: a redirected
    # stdout keeps its own lines (``harness bench > results.txt``).
    bar = Progress(
        *columns,
        TimeElapsedColumn(),
        console=console(stream),
        transient=True,
        redirect_stdout=is_terminal(sys.stdout),
        redirect_stderr=False,
    )
    task = bar.add_task(label, total=total)

    def advance(n: int = 1, *, label: str | None = None) -> None:
        if label is not None:
            bar.update(task, description=label)
        bar.advance(task, n)

    with bar:
        yield advance


def run_alone(command: click.Command, argv: list[str]) -> None:
    """Run ``harness ARGV`` where ``argv[0]`` names ``command``, with only that command in
    the group (``python -m harness.cli.chat``, ``harness.cli.sessions.run``): usage lines
    and errors read as under the full ``harness`` group, which sits above the command
    modules (they do not import it). Exits with the command's status."""
    import click

    click.Group("harness", commands=[command], context_settings=CONTEXT).main(args=argv, prog_name="harness")
