"""``harness sessions``: list, show, inspect, verify, repair, fork, export and rm the
sessions of a store root (a JSONL directory or a SQLite file).

A thin layer over the public persistence API (``Persistence.list``, ``inspect``,
``read_from``, ``load``, ``prepare``/``dispose``, ``delete``, ``locate``; the
``Backend`` protocol's ``revision`` and ``load`` only to report a torn tail and the
stored length) and the session core (``Session.restore`` with
``RelationalInvariants``; fork through ``Store.fork``). Every command runs in one ``trio.run``; storage calls run on worker
threads (the persistence API's own rule).

Exit codes (also in docs/cli.md):

* 0 success
* 1 ``verify``: at least one log failed verification (with ``--strict``, a warning
  fails too)
* 2 usage: bad arguments, an empty id, a malformed ``ID@SEQ``, a root of the wrong kind,
  an export ``-o`` that is a directory
* 3 not found: the store root, or the session id
* 4 locked: another live writer holds the session (``repair``, ``rm``)
* 5 corrupt or unsupported: a log that does not read (``SESSION_CORRUPT``,
  ``SESSION_FORMAT_UNSUPPORTED``, a log that does not restore), a file that is not a
  session store, a root of the other JSONL encoding
* 6 refused: a fork boundary that is not in the stored log or ends inside an open turn
  (``INVALID_BOUNDARY``, ``OPEN_TURN``), a child id that already exists, an export file
  that exists
* 7 storage or environment error (I/O, ``zstandard`` missing, any other typed error)
* 8 ``verify``: nothing failed, but a log needs repair (a torn tail, or an open turn a
  load closes); ``harness sessions repair ID`` fixes it
* 130 interrupted (Ctrl-C); 141 stdout closed early (``| head``), quietly
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import IO, Any, Final

# The exit codes and errors, importable from here as before the split (tests use them).
from harness.cli.sessions._common import (
    COMMANDS,
    EXIT_BROKEN_PIPE,
    EXIT_CORRUPT,
    EXIT_INTERRUPTED,
    EXIT_LOCKED,
    EXIT_NEEDS_REPAIR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_STORAGE,
    EXIT_USAGE,
    EXIT_VERIFY_FAILED,
    ROOT_ENV,
    CliError,
    Ctx,
    StoreRoot,
    _unwrap,
    exit_code_for,
)
from harness.cli.sessions._list import cmd_list
from harness.cli.sessions._out import Out, Progress
from harness.cli.sessions._show import cmd_inspect, cmd_show
from harness.cli.sessions._verify import cmd_repair, cmd_verify
from harness.cli.sessions._write import cmd_export, cmd_fork, cmd_rm

_COMMON: Final = ("root", "backend", "compression", "json", "width", "color")


def _common(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options every subcommand takes, on the group and on each subcommand, so
    ``harness sessions --json list`` and ``harness sessions list --json`` both work (a
    subcommand's own value wins)."""
    import click

    from harness.cli._output import default_root

    for option in reversed(
        (
            click.option(
                "--root",
                metavar="PATH",
                default=None,
                help=f"the store: a JSONL root directory, a SQLite file or a postgresql://…[#schema] URL "
                f"(default: ${ROOT_ENV}, else {default_root()})",
            ),
            click.option(
                "--backend",
                type=click.Choice(("auto", "jsonl", "sqlite", "postgres")),
                default="auto",
                help="force the backend (auto: a directory is JSONL, a file is SQLite, a postgresql:// URL PostgreSQL)",
            ),
            click.option(
                "--compression",
                type=click.Choice(("auto", "none", "zstd")),
                default="auto",
                help="JSONL encoding (auto: zstd when the root holds only .jsonl.zstd transcripts)",
            ),
            click.option("--json", is_flag=True, help="machine-readable output on stdout"),
            click.option("--width", type=int, default=None, help="clip text lines to this width (default: the terminal's; a pipe is not clipped)"),
            click.option(
                "--color",
                type=click.Choice(("auto", "always", "never")),
                default="auto",
                help="colour (auto: only on a terminal, and not when NO_COLOR is set)",
            ),
        )
    ):
        f = option(f)
    return f


def _namespace(ctx: Any, command: str, values: dict[str, Any]) -> argparse.Namespace:
    """The parsed command as the handlers read it: common options from the subcommand
    when given there, else from the group."""
    import click

    group = ctx.parent
    merged = dict(values)
    for name in _COMMON:
        if ctx.get_parameter_source(name) in (click.core.ParameterSource.DEFAULT, None) and group is not None:
            merged[name] = group.params.get(name, merged.get(name))
    if merged.get("child") is None and merged.get("child_alias") is not None:
        merged["child"] = merged["child_alias"]  # the old spelling: fork --to NEW_ID
    merged.pop("child_alias", None)
    return argparse.Namespace(command="sessions", sessions_command=command, **merged)


_EXIT_TEXT: Final = (
    "Exit codes: 0 ok, 1 verification failed, 2 usage, 3 not found, 4 locked, 5 corrupt or unsupported, "
    "6 refused, 7 storage error, 8 verify: a log needs repair (torn tail or open turn), 130 interrupted."
)


def command(runner: Callable[[argparse.Namespace], int] | None = None) -> Any:
    """The ``harness sessions`` Click group; each subcommand exits with ``runner``'s
    status for the parsed namespace (default: :func:`main`)."""
    import click

    from harness.cli._output import CONTEXT, default_root

    @click.group("sessions", context_settings=CONTEXT, epilog=_EXIT_TEXT, short_help="List, show, verify, repair, fork, export and remove stored sessions.")
    @_common
    def sessions(**_: Any) -> None:
        """List, show, verify, repair, fork, export and remove stored sessions of a store
        root: a JSONL directory, a SQLite file or a PostgreSQL URL."""

    # Dedented first: the appended line has no indent, so Click's own cleandoc would
    # keep the docstring's (and wrap "store         root").
    sessions.help = inspect.cleandoc(sessions.help or "") + f"\n\nStore root without --root: {default_root()}."

    def sub(name: str, summary: str) -> Callable[[Callable[..., Any]], Any]:
        def wrap(f: Callable[..., Any]) -> Any:
            @click.pass_context
            def callback(ctx: click.Context, /, **values: Any) -> None:
                raise SystemExit((runner or main)(_namespace(ctx, name, values)))

            callback.__name__ = f.__name__
            callback.__doc__ = summary
            decorated: Any = _common(callback)
            params = getattr(f, "__click_params__", [])
            decorated.__click_params__ = [*getattr(decorated, "__click_params__", []), *params]
            return sessions.command(name, context_settings=CONTEXT, epilog=_EXIT_TEXT)(decorated)

        return wrap

    @sub("list", "The stored sessions: id, cwd, created, lineage.")
    @click.option("--events", is_flag=True, help="also read every log: event count and status")
    def _list() -> None: ...

    @sub("show", "A readable timeline of a session (or, with --surface, what the model sees).")
    @click.argument("id")
    @click.option("--surface", is_flag=True, help="the derived messages the model sees")
    @click.option("--chunks", is_flag=True, help="list assistant/chunk events one by one")
    @click.option("--times", is_flag=True, help="show each event's time")
    def _show() -> None: ...

    @sub("inspect", "The raw inspection: the header record and every event as a load would see it.")
    @click.argument("id")
    @click.option("--full", is_flag=True, help="do not clip event data")
    def _inspect() -> None: ...

    @sub("verify", "Check logs without changing them (reading rules, invariants, lineage); exit 8 when one needs repair.")
    @click.argument("ids", nargs=-1, metavar="[ID]...")
    @click.option("--strict", is_flag=True, help="warnings (torn tail, pending repair, missing parent) fail too")
    def _verify() -> None: ...

    @sub("repair", "Write the crash-repair closers durably (and cut a torn tail).")
    @click.argument("id")
    def _repair() -> None: ...

    @sub("fork", "A child session from an inclusive prefix ID@SEQ of a stored session.")
    @click.argument("source", metavar="ID@SEQ")
    @click.option("--new-id", "child", metavar="NEW_ID", default=None, help="the child's id (default: minted)")
    @click.option("--to", "child_alias", metavar="NEW_ID", default=None, hidden=True)
    def _fork() -> None: ...

    @sub("export", "The stored records to stdout or a file.")
    @click.argument("id")
    @click.option("--format", type=click.Choice(("jsonl", "json")), default="jsonl", help="jsonl: header line + one record per line")
    @click.option("-o", "--output", metavar="FILE", default=None, help="write to FILE instead of stdout")
    @click.option("--force", is_flag=True, help="overwrite an existing FILE (never a directory)")
    @click.option("--closers", is_flag=True, help="include the closers a load would append")
    def _export() -> None: ...

    @sub("rm", "Delete a stored session (refused while locked); asks first unless --yes.")
    @click.argument("id")
    @click.option("-y", "--yes", is_flag=True, help="delete without asking (needed when stdin is not a terminal)")
    def _rm() -> None: ...

    return sessions


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """``harness``-style arguments (``sessions ...``) parsed into the namespace
    :func:`main` runs, without running it (for embedding and tests)."""
    parsed: list[argparse.Namespace] = []

    def keep(ns: argparse.Namespace) -> int:
        parsed.append(ns)
        return EXIT_OK

    args = list(argv)
    if args and args[0] == "sessions":
        args = args[1:]
    with contextlib.suppress(SystemExit):
        command(keep).main(args=args, prog_name="harness sessions", standalone_mode=False)
    if not parsed:
        raise ValueError(f"not a runnable sessions command: {list(argv)!r}")
    return parsed[0]


def run(argv: Sequence[str] | None = None) -> int:
    """Run ``harness``-style arguments (``sessions ...``) in this process; returns the
    exit code (usage errors 2, ``--help`` 0). Only ``sessions`` is known here (the
    ``harness`` group of :mod:`harness.cli` holds the other commands)."""
    from harness.cli._output import run_alone

    try:
        run_alone(command(), list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        if exc.code is None:
            return EXIT_OK
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return EXIT_OK


def main(args: argparse.Namespace, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """Run a parsed ``harness sessions`` command; returns the exit code."""
    import trio

    from harness.errors import HarnessError

    out = Out(args, stdout, stderr)
    command = str(getattr(args, "sessions_command", ""))
    try:
        if command not in COMMANDS:
            raise CliError(f"unknown command {command!r}", code="USAGE", exit_code=EXIT_USAGE)
        root = StoreRoot.resolve(args)
        return trio.run(_run, root, command, args, out)
    except KeyboardInterrupt:
        out.stderr.write("harness sessions: interrupted\n")
        return EXIT_INTERRUPTED
    except BaseException as raw:
        exc = _unwrap(raw)
        if isinstance(exc, KeyboardInterrupt):
            out.stderr.write("harness sessions: interrupted\n")
            return EXIT_INTERRUPTED
        if isinstance(exc, BrokenPipeError):
            # The reader went away (``| head``): stop quietly, as a SIGPIPE death would.
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        if isinstance(exc, CliError):
            error = exc
        elif isinstance(exc, HarnessError):
            error = CliError(exc.message, code=exc.code, exit_code=exit_code_for(exc))
        elif isinstance(exc, OSError):
            error = CliError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), code="STORAGE_IO", exit_code=EXIT_STORAGE)
        else:
            raise
        out.error(command, error.message, error.code)
        if out.json:
            out.emit({"error": {"code": error.code, "message": error.message, "exit": error.exit_code}})
        return error.exit_code


async def _run(root: StoreRoot, command: str, args: argparse.Namespace, out: Out) -> int:
    from harness.persistence import open_persistence
    from harness.runtime import open_store

    backend = root.backend()
    result: list[int] = []
    failure: list[BaseException] = []
    ctx_progress = Progress(out.stderr)
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            ctx = Ctx(root, store, p, args, out, ctx_progress)
            try:
                # Caught inside the block: nothing crosses the store's nurseries (an
                # error there would come out wrapped in an exception group).
                result.append(await _HANDLERS[command](ctx))
            except Exception as exc:
                failure.append(exc)
    except Exception:
        if failure:  # closing failed too (e.g. a fork's unwritten child): the first error wins
            raise failure[0] from None
        raise
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            import trio

            await trio.to_thread.run_sync(close)
    if failure:
        raise failure[0]
    return result[0]


_HANDLERS: Final[dict[str, Callable[[Ctx], Awaitable[int]]]] = {
    "list": cmd_list,
    "show": cmd_show,
    "inspect": cmd_inspect,
    "verify": cmd_verify,
    "repair": cmd_repair,
    "fork": cmd_fork,
    "export": cmd_export,
    "rm": cmd_rm,
}


# Re-exported: the names tests and callers imported from here before the split.
__all__ = [
    "COMMANDS",
    "CliError",
    "EXIT_BROKEN_PIPE",
    "EXIT_CORRUPT",
    "EXIT_INTERRUPTED",
    "EXIT_LOCKED",
    "EXIT_NEEDS_REPAIR",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_STORAGE",
    "EXIT_USAGE",
    "EXIT_VERIFY_FAILED",
    "ROOT_ENV",
    "command",
    "exit_code_for",
    "main",
    "parse",
    "run",
]
