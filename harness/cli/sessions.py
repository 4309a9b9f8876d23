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
* 2 usage: bad arguments, an empty id, a malformed ``ID@SEQ``, a root of the wrong kind
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
import datetime
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, NoReturn

if TYPE_CHECKING:
    from harness.errors import HarnessError
    from harness.persistence import Persistence
    from harness.runtime import Store

EXIT_OK: Final = 0
EXIT_VERIFY_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_FOUND: Final = 3
EXIT_LOCKED: Final = 4
EXIT_CORRUPT: Final = 5
EXIT_REFUSED: Final = 6
EXIT_STORAGE: Final = 7
EXIT_NEEDS_REPAIR: Final = 8
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141

ROOT_ENV: Final = "HARNESS_SESSIONS_ROOT"  # harness.cli._output.ROOT_ENV
COMMANDS: Final = ("list", "show", "inspect", "verify", "repair", "fork", "export", "rm")


class CliError(Exception):
    """A refusal of the command layer itself: one line, a code, an exit status."""

    def __init__(self, message: str, *, code: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.exit_code = exit_code


# -- argument parsing (Click) ---------------------------------------------------------------

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

    sessions.help = (sessions.help or "") + f"\n\nStore root without --root: {default_root()}."

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
    @click.option("--force", is_flag=True, help="overwrite an existing FILE")
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


# -- output --------------------------------------------------------------------------------


_STYLES: Final = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}


class Out:
    """stdout (text or JSON) and stderr (errors, progress); colour only on a terminal."""

    def __init__(self, args: argparse.Namespace, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> None:
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.json = bool(getattr(args, "json", False))
        from harness.cli._output import text_width, use_color

        self.color = use_color(self.stdout, getattr(args, "color", "auto") or "auto")
        # Clipped to the terminal's width on a terminal only: a pipe gets every character.
        self.width = text_width(self.stdout, getattr(args, "width", None))

    def c(self, style: str, text: str) -> str:
        if not self.color or not text or not style:
            return text
        codes = ";".join(_STYLES[s] for s in style.split())
        return f"\x1b[{codes}m{text}\x1b[0m"

    def line(self, text: str = "") -> None:
        self.stdout.write(text + "\n")

    def emit(self, value: Any) -> None:
        import orjson

        self.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=_json_default).decode() + "\n")

    def error(self, command: str, message: str, code: str) -> None:
        where = f"harness sessions {command}" if command else "harness sessions"
        self.stderr.write(f"{where}: error: {_one_line(message)} [{code}]\n")

    def warn(self, message: str) -> None:
        self.stderr.write(f"harness sessions: warning: {_one_line(message)}\n")


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _json_default(value: Any) -> Any:
    from harness.session import raw_of

    raw = raw_of(value)
    if raw is not value:
        return raw
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _clip(text: str, width: int) -> str:
    text = _one_line(text)
    return text if len(text) <= width else text[: max(width - 1, 1)] + "…"


class Progress:
    """Progress on stderr, only on a terminal: a Rich spinner with the step's label once
    a step has run for a short delay, or, while a command walks many sessions, the
    label on that walk's bar (:attr:`advance`). Erased when done."""

    DELAY: Final = 0.3

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.enabled = _isatty(stream)
        self.label = ""
        self.prefix = ""  # e.g. "[3/120] " while a command walks many sessions
        self.advance: Callable[..., None] | None = None

    @contextlib.contextmanager
    def walk(self, label: str, total: int) -> Iterator[Callable[..., None]]:
        """A bar over ``total`` sessions; the steps inside label it."""
        from harness.cli._output import progress

        with progress(self.stream, label, total) if self.enabled else contextlib.nullcontext(_ignore) as advance:
            self.advance = advance
            try:
                yield advance
            finally:
                self.advance = None

    @asynccontextmanager
    async def step(self, label: str) -> AsyncIterator[None]:
        import trio

        self.label = self.prefix + label
        if self.advance is not None:
            self.advance(0, label=self.label)
            yield
            return
        if not self.enabled:
            yield
            return

        async def show() -> None:
            from harness.cli._output import progress

            await trio.sleep(self.DELAY)
            with progress(self.stream, self.label, None):
                await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(show)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()


def _ignore(*_: object, **__: object) -> None:
    return None


# -- the store root ------------------------------------------------------------------------


class StoreRoot:
    """Which backend reads ``path``: a directory is JSONL, a file is SQLite."""

    def __init__(self, path: Path, kind: str, compression: str, url: str | None = None) -> None:
        self.path = path
        self.kind = kind
        self.compression = compression
        self.url = url  # a PostgreSQL store's URL (``path`` is then unused)

    @property
    def display(self) -> str:
        """The store as shown to the user (a URL without its password)."""
        if self.url is None:
            return str(self.path)
        from harness.persistence._postgres_schema import redact_url

        return redact_url(self.url)

    @classmethod
    def resolve(cls, args: argparse.Namespace) -> StoreRoot:
        from harness.cli._output import default_root

        # The one default of every command: $HARNESS_SESSIONS_ROOT, else the XDG data dir.
        raw = args.root if args.root is not None else str(default_root())
        if not raw:
            raise CliError("empty store root: pass --root PATH", code="USAGE", exit_code=EXIT_USAGE)
        forced = args.backend
        from harness.persistence._postgres_schema import is_postgres_url

        if forced == "postgres" or (forced == "auto" and is_postgres_url(raw)):
            if not is_postgres_url(raw):
                raise CliError(f'--backend postgres needs a postgresql:// URL as the root, got "{raw}"', code="USAGE", exit_code=EXIT_USAGE)
            return cls(Path(), "postgres", "none", url=raw)
        path = Path(raw).expanduser()
        if not path.exists():
            hint = "" if args.root is not None else f" (the default root: `harness chat` creates it; or pass --root PATH, or set {ROOT_ENV})"
            raise CliError(f'store root "{path}" does not exist{hint}', code="STORE_NOT_FOUND", exit_code=EXIT_NOT_FOUND)
        kind = forced if forced != "auto" else ("jsonl" if path.is_dir() else "sqlite")
        if kind == "jsonl" and not path.is_dir():
            raise CliError(f'"{path}" is not a directory: a JSONL store root is one', code="USAGE", exit_code=EXIT_USAGE)
        if kind == "sqlite":
            if path.is_dir():
                raise CliError(f'"{path}" is a directory: a SQLite store is a file', code="USAGE", exit_code=EXIT_USAGE)
            _check_sqlite_file(path)
        compression = args.compression
        if kind == "jsonl" and compression == "auto":
            compression = _detect_compression(path)
        elif kind == "sqlite" and compression == "zstd":
            raise CliError("--compression applies to JSONL roots only", code="USAGE", exit_code=EXIT_USAGE)
        return cls(path, kind, "none" if compression == "auto" else compression)

    def backend(self) -> Any:
        from harness.persistence import JsonlBackend, SqliteBackend

        if self.kind == "jsonl":
            return JsonlBackend(self.path, compression="zstd" if self.compression == "zstd" else "none")
        if self.url is not None:
            from harness.persistence import PostgresBackend

            return PostgresBackend.from_url(self.url, create=False)  # a reading command creates nothing
        return SqliteBackend(self.path)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"root": self.display, "backend": self.kind}
        if self.kind == "jsonl":
            out["compression"] = self.compression
        return out


def _check_sqlite_file(path: Path) -> None:
    """A SQLite store must already be a SQLite file: an empty one would be initialised
    by opening it, which a reading command must not do."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise CliError(f'cannot read "{path}": {exc.strerror or exc}', code="STORAGE_IO", exit_code=EXIT_STORAGE) from exc
    if not head:
        raise CliError(f'"{path}" is an empty file, not a session database', code="NOT_A_STORE", exit_code=EXIT_CORRUPT)
    if head != b"SQLite format 3\x00":
        raise CliError(f'"{path}" is not a SQLite database (nor a JSONL root directory)', code="NOT_A_STORE", exit_code=EXIT_CORRUPT)


def _detect_compression(root: Path) -> str:
    """zstd when the root holds ``.jsonl.zstd`` transcripts and no plain ones (a root
    holds one encoding; a mixed root is refused by the backend, with its own message)."""
    zstd = next(root.glob("*/*/session.jsonl.zstd"), None) is not None
    plain = next(root.glob("*/*/session.jsonl"), None) is not None
    return "zstd" if zstd and not plain else "none"


# -- errors -> exit codes ------------------------------------------------------------------


def _unwrap(exc: BaseException) -> BaseException:
    """The one leaf of nested single-exception groups, and a flush failure's cause."""
    from harness.errors import FlushError, HarnessError

    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, FlushError) and isinstance(exc.__cause__, HarnessError):
        return _unwrap(exc.__cause__)
    return exc


def exit_code_for(exc: HarnessError) -> int:
    """The documented exit status of a typed error."""
    from harness import errors as e

    if isinstance(exc, e.SessionLockedError | e.SessionLiveError):
        return EXIT_LOCKED
    if isinstance(exc, e.PersistedSessionNotFoundError | e.SessionNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(exc, e.ForkError | e.SessionAlreadyExistsError | e.SessionLogExistsError | e.SessionTrackedError):
        return EXIT_REFUSED
    if isinstance(
        exc,
        e.SessionCorruptionError | e.SessionFormatUnsupportedError | e.StorageLayoutError | e.SessionError,
    ) or exc.code == "SQLITE_SCHEMA_INCOMPATIBLE":
        return EXIT_CORRUPT
    return EXIT_STORAGE


def _fail(exc: HarnessError) -> NoReturn:
    from harness.errors import HarnessError

    leaf = _unwrap(exc)
    if isinstance(leaf, HarnessError):
        exc = leaf
    raise CliError(exc.message, code=exc.code, exit_code=exit_code_for(exc)) from exc


# -- entry point ---------------------------------------------------------------------------


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


class Ctx:
    def __init__(
        self, root: StoreRoot, store: Store, p: Persistence, args: argparse.Namespace, out: Out, progress: Progress
    ) -> None:
        self.root = root
        self.store = store
        self.p = p
        self.args = args
        self.out = out
        self.progress = progress


# -- reading a session ---------------------------------------------------------------------


class View:
    """A session as a load would see it: the header record, the stored events and the
    closers a load would append (raw records, read-only), the torn tail a repair would
    cut, and the restored session (``None`` if the log reads but does not restore:
    ``restore_error`` says why)."""

    def __init__(
        self,
        meta: dict[str, Any],
        records: list[dict[str, Any]],
        stored: int,
        torn_at: int | None,
        torn_bytes: int | None,
        path: str | None,
        session: Any,
        restore_error: HarnessError | None,
    ) -> None:
        self.meta = meta
        self.records = records
        self.stored = stored
        self.torn_at = torn_at
        self.torn_bytes = torn_bytes
        self.path = path
        self.session = session
        self.restore_error = restore_error

    @property
    def id(self) -> str:
        return str(self.meta["id"])

    @property
    def closers(self) -> list[dict[str, Any]]:
        return self.records[self.stored :]

    def torn_json(self, kind: str) -> dict[str, Any] | None:
        if self.torn_at is None:
            return None
        if kind == "sqlite":
            return {"atSeq": self.torn_at}
        return {"atByte": self.torn_at, "bytes": self.torn_bytes}

    def torn_text(self, kind: str) -> str:
        if self.torn_at is None:
            return ""
        if kind == "sqlite":
            return f"torn tail from seq {self.torn_at}"
        return f"torn tail of {self.torn_bytes} bytes at byte {self.torn_at}"


def _check_id(value: str, what: str = "session id") -> str:
    if not value or not value.strip() or any(ord(ch) < 32 for ch in value):
        raise CliError(f"bad {what} {value!r}: an id is a non-empty string without control characters", code="USAGE", exit_code=EXIT_USAGE)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Bytes of the command line that are not UTF-8 arrive as lone surrogates
        # (surrogateescape); both backends would raise UnicodeEncodeError on them.
        raise CliError(f"bad {what} {value!r}: not valid UTF-8", code="USAGE", exit_code=EXIT_USAGE) from None
    return value


async def load_view(ctx: Ctx, session_id: str) -> View:
    """``Persistence.load`` (no lock, nothing written: the stored events, the closers a
    load appends, restored), and the backend's own read of the same revision (the
    stored length, a torn tail). A log that reads but does not restore is shown
    through ``Persistence.inspect`` instead, with the load's error kept."""
    import trio

    from harness.errors import HarnessError, SessionCorruptionError
    from harness.persistence import header_record
    from harness.session import END_SEED, event_to_record, raw_of

    p = ctx.p
    backend = p.backend
    _check_id(session_id)
    session: Any = None
    restore_error: HarnessError | None = None
    try:
        async with ctx.progress.step(f"reading {session_id}"):
            for _ in range(3):
                before = await trio.to_thread.run_sync(backend.revision, session_id)
                try:
                    session = await p.read_session(session_id)
                    restore_error = None
                except SessionCorruptionError as exc:
                    session, restore_error = None, exc
                stored = await trio.to_thread.run_sync(backend.load, session_id)
                if stored.revision == before:
                    break
            count = len(stored.records)
            meta = header_record(stored.header)
            del stored.records[:]
            if session is not None:
                # The records behind the session's events (read-only; arrays may be tuples).
                records = [event_to_record(e) for e in session.events]
                if records and records[-1]["type"] == END_SEED and records[-1]["seq"] >= count:
                    records.pop()  # appended in memory by the restore, never stored
            else:
                try:
                    insp = await p.inspect(session_id)
                except HarnessError:
                    assert restore_error is not None
                    raise restore_error from None  # the log does not read: the load's error
                records = [raw_of(r) for r in insp.events]
            count = min(count, len(records))
            path = p.locate(meta)
    except HarnessError as exc:
        _fail(exc)
    torn_bytes: int | None = None
    if stored.truncate_to is not None and ctx.root.kind == "jsonl" and path is not None:
        try:
            size = (await trio.Path(path).stat()).st_size
            torn_bytes = max(size - stored.truncate_to, 0)
        except OSError:
            torn_bytes = None
    return View(meta, records, count, stored.truncate_to, torn_bytes, path, session, restore_error)


# -- event descriptions ----------------------------------------------------------------------


def _d(rec: dict[str, Any]) -> dict[str, Any]:
    data = rec.get("data")
    return data if isinstance(data, dict) else {}


def _message_text(message: Any, limit: int = 400) -> str:
    if not isinstance(message, dict):
        return ""
    parts: list[str] = []
    content = message.get("content")
    for block in content if isinstance(content, list | tuple) else ():
        if not isinstance(block, dict):
            continue
        t = block.get("type")
        if t == "text":
            parts.append(str(block.get("text", "")))
        elif t == "tool-call":
            parts.append(f"→ {block.get('name')}({_one_line(str(block.get('arguments', '')))[:60]})")
        elif t == "tool-result":
            inner = block.get("content")
            texts = [str(b.get("text", "")) for b in inner if isinstance(b, dict)] if isinstance(inner, list | tuple) else []
            parts.append(("ERROR " if block.get("isError") else "") + " ".join(texts))
        elif t in ("reasoning", "thinking"):
            parts.append("(reasoning)")
        else:
            parts.append(f"<{t}>")
        if sum(len(x) for x in parts) > limit:
            break
    return _one_line(" ".join(parts))


def _is_checkpoint(message: Any) -> bool:
    source = message.get("source") if isinstance(message, dict) else None
    return isinstance(source, dict) and source.get("kind") == "plugin" and source.get("plugin") == "compact"


def _checkpoint_summary(message: Any) -> str:
    """The summary inside a framed checkpoint (the frame's preamble and tags dropped)."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list | tuple) and len(content) >= 3:
        inner = {"content": content[1:-1]}
        return _message_text(inner)
    return _message_text(message)


def _replace_range(rec: dict[str, Any]) -> tuple[Any, Any] | None:
    op = rec.get("surfaceOp")
    if isinstance(op, dict) and op.get("op") == "replace":
        return op.get("start"), op.get("end")
    return None


def _short(value: Any) -> str:
    return str(value)[:8]


def _error_text(error: Any) -> str:
    if isinstance(error, str):
        return error
    if isinstance(error, dict):
        code = error.get("code")
        message = error.get("message", "")
        return f"{code}: {message}" if code else str(message)
    return _one_line(str(error))


def _owner(d: dict[str, Any]) -> str:
    turn = d.get("turn")
    return "standalone" if turn is None else f"turn {turn}"


def _reason(d: dict[str, Any]) -> tuple[str, str]:
    """(kind, text) of a ``turn/end`` reason."""
    reason = d.get("reason")
    kind = str(reason.get("kind")) if isinstance(reason, dict) else "?"
    if kind == "interrupted":
        return kind, "interrupted (crash repair)"
    if kind == "aborted" and isinstance(reason, dict):
        cause = reason.get("reason")
        why = cause.get("kind") if isinstance(cause, dict) else None
        return kind, f"aborted ({why})" if why else "aborted"
    if kind == "error" and isinstance(reason, dict):
        return kind, f"error: {_error_text(reason.get('error'))}"
    return kind, kind


def describe(rec: dict[str, Any]) -> tuple[str, str]:
    """(style, text) of one event for the timeline."""
    t = rec.get("type")
    d = _d(rec)
    if t == "turn/start":
        return "bold", f"turn {d.get('turn')} begins"
    if t == "turn/end":
        kind, text = _reason(d)
        style = {"completed": "bold green", "interrupted": "bold yellow", "aborted": "bold yellow", "error": "bold red"}
        return style.get(kind, "bold"), f"turn {d.get('turn')} {text}"
    if t == "step/start":
        return "", f"step {d.get('step')} begins"
    if t == "step/end":
        return "", f"step {d.get('step')} ends"
    if t == "user/message":
        span = _replace_range(rec)
        if span is not None and _is_checkpoint(rec.get("data")):
            source = d.get("source") if isinstance(d.get("source"), dict) else {}
            cid = _short(source.get("compactionId")) if isinstance(source, dict) else "?"
            return "cyan", f"| checkpoint {cid} replaces {span[0]}..{span[1]}: {_checkpoint_summary(d)}"
        return "", f"user: {_message_text(d)}"
    if t == "assistant/message":
        return "", f"assistant: {_message_text(d.get('message'))}"
    if t == "assistant/chunk":
        return "dim", "chunk"
    if t == "tool/call":
        return "", f"call {d.get('callId')} {d.get('name')}({_one_line(str(d.get('arguments', '')))[:60]})"
    if t == "tool/result":
        message = d.get("message")
        source = message.get("source") if isinstance(message, dict) else None
        call = source.get("callId") if isinstance(source, dict) else "?"
        span = _replace_range(rec)
        if span is not None:
            return "cyan", f"| pruned result of {call} replaces {span[0]}..{span[1]}"
        error = d.get("error")
        if isinstance(error, dict) and error.get("code"):
            return "red", f"result of {call}: ERROR {error.get('code')}"
        return "", f"result of {call}: {_message_text(message)}"
    if t == "request/header":
        header = d.get("header") if isinstance(d.get("header"), dict) else {}
        config = header.get("config") if isinstance(header, dict) else None
        target = f" {config.get('provider')}/{config.get('model')}" if isinstance(config, dict) else ""
        return "dim", f"request header ({d.get('reason')}){target}"
    if t == "request/context":
        return "dim", "request context"
    if t == "compaction/start":
        return "magenta", f"[ compaction {_short(d.get('compactionId'))} begins ({_owner(d)})"
    if t == "compaction/summary":
        r = d.get("shadowedRange") if isinstance(d.get("shadowedRange"), dict) else {}
        seqs = d.get("shadowedSeqs")
        n = len(seqs) if isinstance(seqs, list | tuple) else "?"
        start, end = (r.get("start"), r.get("end")) if isinstance(r, dict) else ("?", "?")
        # A range is by surface position: after an earlier compaction its checkpoint (a
        # later seq) stands first, so start > end is right and is said so.
        order = " in surface order" if isinstance(start, int) and isinstance(end, int) and start > end else ""
        return "magenta", f"| summary shadows {start}..{end}{order} ({n} surface nodes, ~{d.get('shadowedTokenCount')} tokens)"
    if t == "compaction/end":
        cid = _short(d.get("compactionId"))
        if "error" in d:
            return "red", f"] compaction {cid} failed: {_error_text(d.get('error'))}"
        return "magenta", f"] compaction {cid} committed ({_owner(d)})"
    if t == "compaction/prune":
        r = d.get("shadowedRange") if isinstance(d.get("shadowedRange"), dict) else {}
        start, end = (r.get("start"), r.get("end")) if isinstance(r, dict) else ("?", "?")
        return "magenta", f"prune shadows {start}..{end} (~{d.get('shadowedTokenCount')} tokens)"
    if t == "session/end-seed":
        return "dim", "end of seed"
    if t == "command/run":
        return "", f"/{d.get('name')} {_one_line(str(d.get('args', '')))}".rstrip()
    if t == "command/done":
        return "", f"{d.get('kind')}: {_one_line(str(d.get('text', '')))}"
    import orjson

    return "dim", orjson.dumps(rec.get("data"), default=_json_default).decode()


# -- the timeline ----------------------------------------------------------------------------


class Timeline:
    """Events with their nesting, surface state and repair marks; turns; brackets."""

    def __init__(self, view: View, surface: set[int] | None) -> None:
        self.entries: list[dict[str, Any]] = []
        self.turns: list[dict[str, Any]] = []
        self.compactions: list[dict[str, Any]] = []
        turn: dict[str, Any] | None = None
        in_step = False
        bracket: dict[str, Any] | None = None
        for i, rec in enumerate(view.records):
            t = rec.get("type")
            d = _d(rec)
            seq = rec.get("seq")
            closer = i >= view.stored
            depth = (1 if turn is not None else 0) + (1 if in_step else 0)
            if t == "turn/start":
                depth = 0
                turn = {"turn": d.get("turn"), "start": seq, "end": None, "outcome": None, "repair": None}
                self.turns.append(turn)
                in_step = False
            elif t == "turn/end":
                depth = 0
                kind, _ = _reason(d)
                if turn is None or turn.get("turn") != d.get("turn"):
                    turn = {"turn": d.get("turn"), "start": None, "end": None, "outcome": None, "repair": None}
                    self.turns.append(turn)
                turn["end"] = seq
                turn["outcome"] = kind
                if closer:
                    turn["repair"] = "pending"
                elif kind == "interrupted":
                    turn["repair"] = "durable"
                turn = None
                in_step = False
            elif t == "step/start":
                depth = 1 if turn is not None else 0
                in_step = True
            elif t == "step/end":
                depth = 1 if turn is not None else 0
                in_step = False
            if t == "compaction/start":
                bracket = {
                    "compactionId": d.get("compactionId"),
                    "owner": d.get("turn"),
                    "start": seq,
                    "end": None,
                    "status": "open",
                    "shadowedRange": None,
                    "shadowedSeqs": None,
                    "shadowedTokenCount": None,
                    "checkpoint": None,
                    "error": None,
                }
                self.compactions.append(bracket)
            elif bracket is not None and d.get("compactionId") == bracket["compactionId"]:
                if t == "compaction/summary":
                    bracket["shadowedRange"] = d.get("shadowedRange")
                    bracket["shadowedSeqs"] = d.get("shadowedSeqs")
                    bracket["shadowedTokenCount"] = d.get("shadowedTokenCount")
                elif t == "compaction/end":
                    bracket["end"] = seq
                    bracket["status"] = "failed" if "error" in d else "committed"
                    if "error" in d:
                        bracket["error"] = _error_text(d.get("error"))
                    bracket = None
            if bracket is not None and t == "user/message" and _replace_range(rec) is not None:
                source = d.get("source")
                if isinstance(source, dict) and source.get("compactionId") == bracket["compactionId"]:
                    bracket["checkpoint"] = seq
            style, text = describe(rec)
            on: str | None = None
            if surface is not None and "surfaceOp" in rec:
                on = "on" if seq in surface else "shadowed"
            self.entries.append(
                {
                    "seq": seq,
                    "type": t,
                    "time": rec.get("time"),
                    "depth": depth,
                    "text": text,
                    "style": style,
                    "surface": on,
                    "closer": closer,
                }
            )
        for b in self.compactions:
            if b["status"] == "open":
                # A start left open by a crash: stale once a later end-seed exists.
                later = [r for r in view.records if r.get("type") == "session/end-seed" and (r.get("seq") or 0) > b["start"]]
                b["status"] = "stale" if later else "open"


def _fmt_time(ms: Any, *, full: bool = True) -> str:
    if not isinstance(ms, int | float):
        return "?"
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ") if full else moment.strftime("%H:%M:%S.") + f"{int(ms) % 1000:03d}"


def _lineage(meta: dict[str, Any]) -> str:
    parent = meta.get("parentSession")
    if parent is None:
        return "-"
    seed = meta.get("seedLength")
    if meta.get("origin") == "subagent":
        return f"subagent of {parent} (depth {meta.get('delegationDepth')})"
    if isinstance(seed, int):
        return f"fork of {parent}@{seed - 1}" if seed > 0 else f"fork of {parent} (empty prefix)"
    return f"child of {parent}"


# -- list ------------------------------------------------------------------------------------


async def cmd_list(ctx: Ctx) -> int:
    from harness.errors import HarnessError

    out = ctx.out
    try:
        async with ctx.progress.step("listing sessions"):
            headers = await ctx.p.list()
    except HarnessError as exc:
        _fail(exc)
    headers.sort(key=lambda h: (h.get("createdAt") or 0, str(h.get("id"))))
    rows: list[dict[str, Any]] = []
    walk = ctx.progress.walk("list", len(headers)) if ctx.args.events else contextlib.nullcontext(_ignore)
    with walk as advance:
        for header in headers:
            meta = {k: v for k, v in header.items() if k != "type"}
            row: dict[str, Any] = {**meta, "lineage": _lineage(meta)}
            if ctx.args.events:
                status, events, detail = await _status(ctx, str(meta["id"]))
                row.update(status=status, events=events)
                if detail:
                    row["detail"] = detail
                advance()
            rows.append(row)
    unreadable = await _unlisted(ctx, headers)
    if out.json:
        out.emit({**ctx.root.describe(), "sessions": rows, "unreadable": unreadable})
        return EXIT_OK
    if not rows and not unreadable:
        out.line(out.c("dim", f"no sessions in {ctx.root.display}"))
        return EXIT_OK
    columns = ["ID", "CREATED", "CWD", *(["EVENTS", "STATUS"] if ctx.args.events else []), "LINEAGE"]
    table: list[list[str]] = []
    for row in rows:
        cells = [str(row["id"]), _fmt_time(row.get("createdAt")), str(row.get("cwd") or "-")]
        if ctx.args.events:
            cells += [str(row.get("events", "?")), str(row.get("status"))]
        cells.append(str(row["lineage"]))
        table.append(cells)
    if _isatty(out.stdout):
        _rich_table(out, columns, table, status_column=4 if ctx.args.events else None)
        table = []  # shown
    widths = [max(len(c), *(len(r[i]) for r in table)) if table else len(c) for i, c in enumerate(columns)]
    if table:
        out.line(out.c("bold", "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()))
    for cells in table:
        shown = []
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True)):
            text = cell.ljust(w)
            if ctx.args.events and i == 4:
                text = out.c("green" if cell == "ok" else "yellow" if cell == "needs-repair" else "red", text)
            shown.append(text)
        out.line("  ".join(shown).rstrip())
    for bad in unreadable:
        out.line(out.c("red", f"unreadable: {bad['path']}: {bad['code']}: {_one_line(bad['message'])}"))
    return EXIT_OK


def _rich_table(out: Out, columns: list[str], rows: list[list[str]], *, status_column: int | None) -> None:
    """The listing as a Rich table, on a terminal (a pipe gets plain aligned columns,
    stable for scripts): folded to the terminal's width, colour per the rules."""
    from rich.table import Table

    from harness.cli._output import console

    table = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    for name in columns:
        table.add_column(name, overflow="fold")
    styles = {"ok": "green", "needs-repair": "yellow"}
    for cells in rows:
        shown = [f"[{styles.get(c, 'red')}]{c}[/]" if i == status_column else c for i, c in enumerate(cells)]
        table.add_row(*(x if i == status_column else _escape(x) for i, x in enumerate(shown)))
    console(out.stdout, "always" if out.color else "never").print(table)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


async def _status(ctx: Ctx, session_id: str) -> tuple[str, int | None, str]:
    """(status, events as a load would see them, detail) of one session."""
    try:
        view = await load_view(ctx, session_id)
    except CliError as exc:
        return exc.code, None, exc.message
    if view.torn_at is not None or view.closers:
        parts = [p for p in (view.torn_text(ctx.root.kind), f"{len(view.closers)} closers" if view.closers else "") if p]
        return "needs-repair", len(view.records), "; ".join(parts)
    return "ok", len(view.records), ""


async def _unlisted(ctx: Ctx, headers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JSONL: transcripts the listing skipped (a header that does not read, a format this
    build refuses), each with the typed error a read of it raises."""
    import trio

    if ctx.root.kind != "jsonl":
        return []
    from harness.errors import HarnessError

    located: list[str] = []
    for h in headers:
        try:
            located.append(str(ctx.p.locate(h)))
        except HarnessError:
            continue
    name = "session.jsonl.zstd" if ctx.root.compression == "zstd" else "session.jsonl"

    def scan() -> list[tuple[Path, Any]]:
        listed = {Path(p).resolve() for p in located}
        found = []
        for path in sorted(ctx.root.path.glob(f"*/*/{name}")):
            if path.resolve() in listed or not path.is_file():
                continue
            sid: Any = None
            if name == "session.jsonl":
                try:
                    import orjson

                    with open(path, "rb") as f:
                        first = f.readline()
                    if not first.endswith(b"\n"):
                        continue  # no complete header line yet: skipped by the listing as well
                    value = orjson.loads(first)
                    sid = value.get("id") if isinstance(value, dict) else None
                except (OSError, ValueError):
                    sid = None
            found.append((path, sid))
        return found

    out: list[dict[str, Any]] = []
    for path, sid in await trio.to_thread.run_sync(scan):
        entry: dict[str, Any] = {"path": str(path), "id": sid if isinstance(sid, str) else None}
        error: tuple[str, str] = ("SESSION_CORRUPT", "the transcript has no readable session header")
        if isinstance(sid, str) and sid:
            try:
                await ctx.p.inspect(sid)
            except HarnessError as exc:
                error = (exc.code, exc.message)
        entry["code"], entry["message"] = error
        out.append(entry)
    return out


# -- show ------------------------------------------------------------------------------------


async def cmd_show(ctx: Ctx) -> int:
    view = await load_view(ctx, ctx.args.id)
    session = view.session
    restore_error = (
        None if view.restore_error is None else {"code": view.restore_error.code, "message": view.restore_error.message}
    )
    if ctx.args.surface:
        if session is None:
            assert restore_error is not None
            raise CliError(
                f'session "{view.id}" does not restore: {restore_error["message"]}',
                code=restore_error["code"],
                exit_code=EXIT_CORRUPT,
            )
        return _show_surface(ctx, view, session)
    surface = set(session.surface) if session is not None else None
    timeline = Timeline(view, surface)
    out = ctx.out
    kind = ctx.root.kind
    if out.json:
        out.emit(
            {
                "meta": view.meta,
                "path": view.path,
                "storedEvents": view.stored,
                "closers": len(view.closers),
                "tornTail": view.torn_json(kind),
                "restoreError": restore_error,
                "events": [{k: v for k, v in e.items() if k != "style"} for e in timeline.entries],
                "turns": timeline.turns,
                "compactions": timeline.compactions,
                "surface": None
                if session is None
                else {"nodes": list(session.surface), "generation": session.generation},
            }
        )
        return EXIT_OK
    _show_header(ctx, view)
    if restore_error is not None:
        out.line(out.c("red", f"  does not restore: {restore_error['code']}: {restore_error['message']}"))
    out.line(out.c("dim", "  legend: * on the surface, ~ shadowed (replaced), + closer a load would append"))
    out.line()
    times = ctx.args.times
    folded = 0
    closers_announced = False

    def flush_chunks() -> None:
        nonlocal folded
        if folded:
            out.line(out.c("dim", f"   {'':>6}  {'':>{12 if times else 0}}      … {folded} assistant/chunk"))
            folded = 0

    for e in timeline.entries:
        if e["type"] == "assistant/chunk" and not ctx.args.chunks and not e["closer"]:
            folded += 1
            continue
        flush_chunks()
        if e["closer"] and not closers_announced:
            if view.torn_at is not None:
                out.line(out.c("yellow", f"   ~~ {view.torn_text(kind)}: cut by the next repair"))
            out.line(out.c("yellow", f"   -- crash repair: a load would append these {len(view.closers)} closers --"))
            closers_announced = True
        mark = "+" if e["closer"] else " "
        surf = {"on": "*", "shadowed": "~"}.get(e["surface"] or "", " ")
        when = f"{_fmt_time(e['time'], full=False)} " if times else ""
        nested = "  " * int(e["depth"]) + str(e["type"])
        head = f"{mark}{surf}{e['seq']:>6}  {when}{nested:<23} "
        text = _clip(e["text"], max(out.width - len(head), 20))
        style = "yellow" if e["closer"] else ("dim" if e["surface"] == "shadowed" else e["style"])
        out.line(out.c("yellow" if e["closer"] else "", head) + out.c(style, text))
    flush_chunks()
    if view.torn_at is not None and not closers_announced:
        out.line(out.c("yellow", f"   ~~ {view.torn_text(kind)}: cut by the next repair"))
    out.line()
    _show_footer(ctx, view, timeline, session)
    return EXIT_OK


def _show_header(ctx: Ctx, view: View) -> None:
    out = ctx.out
    meta = view.meta
    out.line(out.c("bold", f"session {view.id}"))
    out.line(f"  created  {_fmt_time(meta.get('createdAt'))}")
    if meta.get("cwd") is not None:
        out.line(f"  cwd      {meta.get('cwd')}")
    if meta.get("parentSession") is not None:
        out.line(f"  lineage  {_lineage(meta)}")
    if meta.get("agentPreset") is not None:
        out.line(f"  preset   {meta.get('agentPreset')}")
    if view.path:
        out.line(f"  stored   {view.path}")


def _show_footer(ctx: Ctx, view: View, timeline: Timeline, session: Any) -> None:
    out = ctx.out
    events = f"{len(view.records)} events"
    if view.closers:
        events += f" ({view.stored} stored + {len(view.closers)} closers)"
    outcomes: dict[str, int] = {}
    for t in timeline.turns:
        key = t["outcome"] or "open"
        outcomes[key] = outcomes.get(key, 0) + 1
    turns = f"{len(timeline.turns)} turns" + (
        " (" + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())) + ")" if outcomes else ""
    )
    out.line(f"  {events}; {turns}")
    if timeline.compactions:
        status: dict[str, int] = {}
        for b in timeline.compactions:
            status[b["status"]] = status.get(b["status"], 0) + 1
        out.line(
            f"  {len(timeline.compactions)} compactions ("
            + ", ".join(f"{n} {k}" for k, n in sorted(status.items()))
            + ")"
        )
        for b in timeline.compactions:
            r = b["shadowedRange"]
            span = f"shadowed {r.get('start')}..{r.get('end')}" if isinstance(r, dict) else "nothing shadowed"
            cp = f", checkpoint at {b['checkpoint']}" if b["checkpoint"] is not None else ""
            err = f": {b['error']}" if b["error"] else ""
            out.line(
                f"    {_short(b['compactionId'])} seq {b['start']}..{b['end'] if b['end'] is not None else '?'} "
                f"{b['status']}, {span}{cp}{err}"
            )
    if session is not None:
        out.line(f"  surface: {len(session.surface)} nodes (generation {session.generation})")
    if view.torn_at is not None or view.closers:
        out.line(out.c("yellow", f"  needs repair: harness sessions repair {view.id}"))


def _show_surface(ctx: Ctx, view: View, session: Any) -> int:
    from harness.session import thaw

    out = ctx.out
    header = session.request_header()
    header_raw: dict[str, Any] = thaw(header) if header is not None else {}
    system = header_raw.get("system")
    tools = header_raw.get("tools")
    tool_names = [str(t.get("name")) for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
    messages = []
    for seq in session.surface:
        message = session.derive_message(seq)
        if message is None:
            continue
        raw = thaw(message)
        event = session.event(seq)
        op = event.surface_op
        entry: dict[str, Any] = {"seq": seq, "checkpoint": _is_checkpoint(raw), "message": raw}
        if entry["checkpoint"] and op is not None and not isinstance(op, str):
            entry["replaces"] = {"start": op.start, "end": op.end}
        messages.append(entry)
    if out.json:
        out.emit(
            {
                "id": view.id,
                "generation": session.generation,
                "nodes": list(session.surface),
                "system": system,
                "tools": tool_names,
                "config": header_raw.get("config"),
                "messages": messages,
            }
        )
        return EXIT_OK
    out.line(out.c("bold", f"what the model sees in {view.id}: {len(messages)} messages (generation {session.generation})"))
    if header is not None:
        config = header_raw.get("config")
        if isinstance(config, dict):
            out.line(out.c("dim", f"  target   {config.get('provider')}/{config.get('model')}"))
        if system:
            text = system if isinstance(system, str) else _message_text({"content": system})
            out.line(out.c("dim", "  system   " + _clip(text, out.width - 11)))
        if tool_names:
            out.line(out.c("dim", "  tools    " + _clip(", ".join(tool_names), out.width - 11)))
    for m in messages:
        raw = m["message"]
        role = str(raw.get("role"))
        head = f"  {m['seq']:>6}  {role:>9}: "
        if m["checkpoint"]:
            r = m.get("replaces", {})
            text = f"[checkpoint replaces {r.get('start')}..{r.get('end')}] {_checkpoint_summary(raw)}"
            out.line(head + out.c("cyan", _clip(text, max(out.width - len(head), 20))))
            continue
        source = raw.get("source")
        if role == "user" and isinstance(source, dict) and source.get("kind") == "tool":
            head = f"  {m['seq']:>6}  {'tool':>9}: "
        out.line(head + _clip(_message_text(raw), max(out.width - len(head), 20)))
    return EXIT_OK


# -- inspect ---------------------------------------------------------------------------------


async def cmd_inspect(ctx: Ctx) -> int:
    import orjson

    view = await load_view(ctx, ctx.args.id)
    out = ctx.out
    if out.json:
        out.emit(
            {
                "meta": view.meta,
                "path": view.path,
                "storedEvents": view.stored,
                "closers": len(view.closers),
                "tornTail": view.torn_json(ctx.root.kind),
                "events": view.records,
            }
        )
        return EXIT_OK
    out.line(out.c("bold", orjson.dumps(view.meta, default=_json_default).decode()))
    if view.path:
        out.line(out.c("dim", f"# stored at {view.path}"))
    for i, rec in enumerate(view.records):
        if i == view.stored:
            if view.torn_at is not None:
                out.line(out.c("yellow", f"# {view.torn_text(ctx.root.kind)} (cut by the next repair)"))
            out.line(out.c("yellow", f"# {len(view.closers)} closers a load would append (not stored):"))
        body = orjson.dumps(rec, default=_json_default).decode()
        if not ctx.args.full:
            body = _clip(body, max(out.width - 2, 40))
        out.line(out.c("yellow", "+ " + body) if i >= view.stored else "  " + body)
    if view.torn_at is not None and not view.closers:
        out.line(out.c("yellow", f"# {view.torn_text(ctx.root.kind)} (cut by the next repair)"))
    return EXIT_OK


# -- verify ----------------------------------------------------------------------------------


async def cmd_verify(ctx: Ctx) -> int:
    from harness.errors import HarnessError

    out = ctx.out
    ids: list[str] = [_check_id(i) for i in ctx.args.ids]
    everything = not ids
    unreadable: list[dict[str, Any]] = []
    parents: set[str] = set()
    headers: list[dict[str, Any]] = []
    if everything:
        try:
            headers = await ctx.p.list()
        except HarnessError as exc:
            _fail(exc)
        headers.sort(key=lambda h: (h.get("createdAt") or 0, str(h.get("id"))))
        ids = [str(h["id"]) for h in headers]
        parents = {str(h["parentSession"]) for h in headers if h.get("parentSession") is not None}
        unreadable = await _unlisted(ctx, headers)
    cache: dict[str, View | CliError] = {}
    results: list[dict[str, Any]] = []
    strict = bool(ctx.args.strict)
    with ctx.progress.walk("verify", len(ids)) as advance:
        for sid in ids:
            result = await _verify_one(ctx, sid, cache)
            advance()
            if not everything and result["problems"] and result["problems"][0]["code"] == "SESSION_NOT_FOUND":
                raise CliError(result["problems"][0]["message"], code="SESSION_NOT_FOUND", exit_code=EXIT_NOT_FOUND)
            if strict and result["warnings"] and not result["problems"]:
                result["status"] = "failed"
            result["ok"] = result["status"] != "failed"
            results.append(result)
            # Keep only what a later child may still compare against.
            for key in list(cache):
                if key not in parents:
                    del cache[key]
    for bad in unreadable:
        results.append(
            {
                "id": bad["id"],
                "path": bad["path"],
                "ok": False,
                "status": "failed",
                "problems": [{"code": bad["code"], "message": bad["message"]}],
                "warnings": [],
            }
        )
    failed = sum(1 for r in results if not r["ok"])
    if out.json:
        out.emit({**ctx.root.describe(), "ok": failed == 0, "strict": strict, "sessions": results})
    else:
        pad = max((len(str(r["id"] if r["id"] is not None else r.get("path"))) for r in results), default=0)
        for r in results:
            _print_verify(ctx, r, pad)
        counts: dict[str, int] = {}
        for r in results:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing to verify"
        out.line(out.c("bold", f"{len(results)} sessions: {summary}"))
    if failed:
        return EXIT_VERIFY_FAILED
    return EXIT_NEEDS_REPAIR if any(r["status"] == "needs-repair" for r in results) else EXIT_OK


def _print_verify(ctx: Ctx, r: dict[str, Any], pad: int) -> None:
    out = ctx.out
    label = {"ok": ("green", "ok"), "needs-repair": ("yellow", "repair"), "failed": ("red", "FAILED")}[r["status"]]
    name = str(r["id"] if r["id"] is not None else r.get("path"))
    count = f"{r['events']} events" if r.get("events") is not None else ""
    out.line(f"{out.c(label[0], label[1].ljust(7))} {name.ljust(pad)}  {count}".rstrip())
    for p in r["problems"]:
        out.line("        " + out.c("red", _clip(f"{p['code']}: {p['message']}", out.width - 8)))
    for w in r["warnings"]:
        out.line("        " + out.c("yellow", _clip(f"{w['code']}: {w['message']}", out.width - 8)))


async def _verify_one(ctx: Ctx, sid: str, cache: dict[str, View | CliError]) -> dict[str, Any]:
    import trio

    from harness.errors import HarnessError
    from harness.session import RelationalInvariants

    result: dict[str, Any] = {"id": sid, "status": "ok", "problems": [], "warnings": []}
    problems: list[dict[str, str]] = result["problems"]
    warnings: list[dict[str, str]] = result["warnings"]
    view = await _cached_view(ctx, sid, cache)
    if isinstance(view, CliError):
        problems.append({"code": view.code, "message": view.message})
        result["status"] = "failed"
        return result
    result.update(
        path=view.path,
        events=len(view.records),
        storedEvents=view.stored,
        closers=len(view.closers),
        tornTail=view.torn_json(ctx.root.kind),
    )
    if view.torn_at is not None:
        warnings.append({"code": "TORN_TAIL", "message": f"{view.torn_text(ctx.root.kind)}: the next repair cuts it"})
    if view.closers:
        kinds = ", ".join(f"{c['seq']} {c['type']}" for c in view.closers)
        warnings.append(
            {"code": "PENDING_REPAIR", "message": f"the last turn is open: a load appends {len(view.closers)} closers ({kinds})"}
        )
    if view.restore_error is not None:
        problems.append({"code": view.restore_error.code, "message": view.restore_error.message})
    else:
        session = view.session
        try:
            await trio.to_thread.run_sync(lambda: session.replay(RelationalInvariants()))
        except HarnessError as exc:
            problems.append({"code": exc.code, "message": exc.message})
    parent = view.meta.get("parentSession")
    if isinstance(parent, str):
        await _verify_lineage(ctx, view, parent, cache, problems, warnings)
    result["status"] = "failed" if problems else "needs-repair" if warnings and (view.torn_at is not None or view.closers) else "ok"
    return result


async def _cached_view(ctx: Ctx, sid: str, cache: dict[str, View | CliError]) -> View | CliError:
    hit = cache.get(sid)
    if hit is not None:
        return hit
    try:
        view: View | CliError = await load_view(ctx, sid)
    except CliError as exc:
        view = exc
    cache[sid] = view
    return view


async def _verify_lineage(
    ctx: Ctx,
    view: View,
    parent: str,
    cache: dict[str, View | CliError],
    problems: list[dict[str, str]],
    warnings: list[dict[str, str]],
) -> None:
    from orjson import OPT_SORT_KEYS, dumps

    seed = view.meta.get("seedLength")
    other = await _cached_view(ctx, parent, cache)
    if isinstance(other, CliError):
        if other.code == "SESSION_NOT_FOUND":
            warnings.append({"code": "PARENT_NOT_FOUND", "message": f'parent session "{parent}" is not in this store'})
        else:
            warnings.append(
                {"code": "PARENT_UNREADABLE", "message": f'parent session "{parent}" does not read: {other.code}: {other.message}'}
            )
        return
    if not isinstance(seed, int) or seed <= 0:
        return  # no prefix to compare (a subagent, or an empty fork)
    if len(view.records) < seed:
        problems.append(
            {"code": "LINEAGE_MISMATCH", "message": f"seedLength is {seed} but the log holds only {len(view.records)} events"}
        )
        return
    if other.stored < seed:
        problems.append(
            {
                "code": "LINEAGE_MISMATCH",
                "message": f'the prefix 0..{seed - 1} is longer than parent "{parent}"\'s stored log ({other.stored} events)',
            }
        )
        return
    for mine, theirs in zip(view.records[:seed], other.records[:seed], strict=True):
        if dumps(mine, option=OPT_SORT_KEYS) != dumps(theirs, option=OPT_SORT_KEYS):
            problems.append(
                {
                    "code": "LINEAGE_MISMATCH",
                    "message": f'event {mine.get("seq")} differs from parent "{parent}"\'s event {theirs.get("seq")}',
                }
            )
            return


# -- repair ----------------------------------------------------------------------------------


async def cmd_repair(ctx: Ctx) -> int:
    from harness.errors import HarnessError
    from harness.session import event_to_record, thaw

    sid = _check_id(ctx.args.id)
    out = ctx.out
    before = await load_view(ctx, sid)  # what a repair will cut and append (reported)
    try:
        async with ctx.progress.step(f"repairing {sid}"):
            prep = await ctx.p.prepare(sid)
            try:
                written = prep.session.events[prep.cursor - prep.repaired : prep.cursor]
                closers = [thaw(event_to_record(e)) for e in written]
                events = prep.cursor
            finally:
                await prep.dispose()
    except HarnessError as exc:
        _fail(exc)
    torn = before.torn_json(ctx.root.kind)
    repaired = bool(closers) or torn is not None
    if out.json:
        out.emit({"id": sid, "repaired": repaired, "tornTail": torn, "closers": closers, "events": events, "path": before.path})
        return EXIT_OK
    if not repaired:
        out.line(f"{sid}: nothing to repair ({events} events)")
        return EXIT_OK
    parts = []
    if torn is not None:
        parts.append(f"cut the {before.torn_text(ctx.root.kind)}")
    if closers:
        parts.append(f"appended {len(closers)} closers")
    out.line(out.c("green", f"repaired {sid}: " + " and ".join(parts)) + f" ({events} events, durable)")
    for c in closers:
        _, text = describe(c)
        out.line(f"  {c['seq']:>6}  {c['type']:<18} {_clip(text, max(out.width - 30, 20))}")
    return EXIT_OK


# -- fork ------------------------------------------------------------------------------------


def _parse_fork_spec(spec: str) -> tuple[str, int | None]:
    sid, at, seq = spec.rpartition("@")
    if not at:
        return _check_id(spec), None
    try:
        boundary = int(seq, 10)
    except ValueError:
        raise CliError(f"bad fork source {spec!r}: expected ID@SEQ with SEQ a non-negative integer", code="USAGE", exit_code=EXIT_USAGE) from None
    if boundary < 0:
        raise CliError(f"bad fork source {spec!r}: SEQ must be non-negative", code="USAGE", exit_code=EXIT_USAGE)
    return _check_id(sid), boundary


async def cmd_fork(ctx: Ctx) -> int:
    from harness.errors import (
        ForkChildExistsError,
        HarnessError,
        InvalidBoundaryError,
        PersistedSessionNotFoundError,
    )

    sid, boundary = _parse_fork_spec(ctx.args.source)
    child_id = ctx.args.child
    if child_id is not None:
        _check_id(child_id, "child id")
        if child_id == sid:
            raise CliError(f'the child id "{child_id}" is the source\'s', code="SESSION_ALREADY_EXISTS", exit_code=EXIT_REFUSED)
    p = ctx.p
    store = ctx.store
    try:
        async with ctx.progress.step(f"forking {sid}"):
            stored = len(await p.read_from(sid, 0))
            if boundary is None:
                if stored == 0:
                    raise InvalidBoundaryError(f'session "{sid}" has no stored events to fork', session_id=sid)
                boundary = stored - 1
            if boundary >= stored:
                # The loaded session also holds in-memory closers and an end-seed: a
                # prefix must end in what is stored.
                raise InvalidBoundaryError(
                    f'fork boundary {boundary} does not exist in session "{sid}" (last stored seq: '
                    f"{stored - 1 if stored else 'none'})",
                    session_id=sid,
                )
            if child_id is not None:
                try:
                    await p.read_from(child_id, 0)
                except PersistedSessionNotFoundError:
                    pass
                except HarnessError as exc:
                    raise ForkChildExistsError(f'session "{child_id}" already exists ({exc.code})', session_id=child_id) from exc
                else:
                    raise ForkChildExistsError(f'session "{child_id}" already exists', session_id=child_id)
            # The source, loaded without its lock (it may be live elsewhere), is entered
            # in this store but not announced: nothing of it is written.
            source = await p.read_session(sid)
            handle = await store.enter(await store.adopt(source))
            try:
                child = await store.fork(handle, boundary, child_id)
                await child.flush()
                meta = child.header.to_record()
                events = child.seq
                path = p.locate(meta)
                await store.detach(child)
            finally:
                await store.detach(handle)
            await p.wait_retired(str(meta["id"]))
    except HarnessError as exc:
        _fail(exc)
    from harness.persistence import header_record

    record = header_record(meta)
    if ctx.out.json:
        ctx.out.emit(
            {
                "id": meta["id"],
                "parentSession": sid,
                "boundary": boundary,
                "seedLength": meta.get("seedLength"),
                "events": events,
                "meta": record,
                "path": path,
            }
        )
        return EXIT_OK
    seed = "" if events == boundary + 1 else " and a session/end-seed"
    ctx.out.line(
        ctx.out.c("green", f"forked {sid}@{boundary} -> {meta['id']}")
        + f" ({events} events: the prefix 0..{boundary}{seed}; stored at {path})"
    )
    return EXIT_OK


# -- export ----------------------------------------------------------------------------------


async def cmd_export(ctx: Ctx) -> int:
    import orjson
    import trio

    args = ctx.args
    sid = _check_id(args.id)
    view = await load_view(ctx, sid)
    meta = view.meta
    records = view.records if args.closers else view.records[: view.stored]
    dumps = orjson.dumps
    if args.format == "json":
        payload = dumps({"meta": meta, "events": records}, option=orjson.OPT_INDENT_2) + b"\n"
    else:
        payload = b"".join(dumps(r) + b"\n" for r in [meta, *records])
    if args.output is None:
        ctx.out.stdout.write(payload.decode())
        ctx.out.stdout.flush()
        return EXIT_OK
    target = Path(args.output)

    def write() -> None:
        with open(target, "wb" if args.force else "xb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())

    try:
        await trio.to_thread.run_sync(write)
    except FileExistsError:
        raise CliError(f'"{target}" exists (pass --force to overwrite it)', code="FILE_EXISTS", exit_code=EXIT_REFUSED) from None
    except OSError as exc:
        raise CliError(f'writing "{target}" failed: {exc.strerror or exc}', code="STORAGE_IO", exit_code=EXIT_STORAGE) from exc
    if ctx.out.json:
        ctx.out.emit({"id": sid, "format": args.format, "events": len(records), "output": str(target), "bytes": len(payload)})
    else:
        ctx.out.line(f"exported {sid}: {len(records)} events to {target} ({len(payload)} bytes, {args.format})")
    return EXIT_OK


# -- rm --------------------------------------------------------------------------------------


async def cmd_rm(ctx: Ctx) -> int:
    from harness.errors import HarnessError

    sid = _check_id(ctx.args.id)
    try:
        headers = await ctx.p.list()
        meta = next((h for h in headers if h.get("id") == sid), None)
        path = ctx.p.locate(meta) if meta is not None else None
        if meta is not None and not getattr(ctx.args, "yes", False):
            await _confirm_rm(ctx, sid, path)
        await ctx.p.delete(sid)
    except HarnessError as exc:
        _fail(exc)
    children = sorted(str(h["id"]) for h in headers if h.get("parentSession") == sid)
    if ctx.out.json:
        ctx.out.emit({"deleted": sid, "path": path, "children": children})
        return EXIT_OK
    ctx.out.line(f"deleted {sid}" + (f" ({path})" if path else ""))
    if children:
        ctx.out.line(ctx.out.c("dim", f"  its forks keep their own copy of the prefix: {', '.join(children)}"))
    return EXIT_OK


async def _confirm_rm(ctx: Ctx, sid: str, path: object) -> None:
    """Ask on the terminal before deleting; without one, refuse unless ``--yes``."""
    import click
    import trio

    from harness.cli._output import is_terminal

    if not is_terminal(sys.stdin):
        raise CliError(
            f'refusing to delete session "{sid}" without confirmation: pass --yes (stdin is not a terminal)',
            code="CONFIRMATION_REQUIRED",
            exit_code=EXIT_USAGE,
        )
    where = f" ({path})" if path else ""
    # The prompt blocks on the terminal: a worker thread, abandoned if cancelled (Ctrl-C).
    ok = await trio.to_thread.run_sync(
        lambda: click.confirm(f'delete session "{sid}"{where}?', default=False, err=True), abandon_on_cancel=True
    )
    if not ok:
        raise CliError(f'session "{sid}" kept: not confirmed', code="NOT_CONFIRMED", exit_code=EXIT_REFUSED)


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


if __name__ == "__main__":
    sys.exit(run(["sessions", *sys.argv[1:]]))
