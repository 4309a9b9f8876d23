"""What every ``harness sessions`` command shares: the exit codes and the typed errors
that map to them, the store root (a JSONL directory, a SQLite file or a PostgreSQL
URL) and the command context (:class:`Ctx`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

from harness.cli.sessions._out import Out, Progress

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
    ) or exc.code in ("SQLITE_SCHEMA_INCOMPATIBLE", "STORAGE_CORRUPT"):
        return EXIT_CORRUPT
    return EXIT_STORAGE


def _fail(exc: HarnessError) -> NoReturn:
    from harness.errors import HarnessError

    leaf = _unwrap(exc)
    if isinstance(leaf, HarnessError):
        exc = leaf
    raise CliError(exc.message, code=exc.code, exit_code=exit_code_for(exc)) from exc


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
