"""Backends for scenarios: wired to the attempt's fault layer, or plain for reloads.

The kinds a campaign explores (:data:`BACKENDS`): ``jsonl`` (plain JSONL), ``sqlite``
and ``jsonl-zstd`` (JSONL with the reference's default Zstandard encoding: one
checksummed frame per batch, torn final frames recovered on load). The two JSONL kinds
fail and crash through the file layer (:data:`FILE_BACKENDS`); SQLite through its
statement hook. ``jsonl-zstd`` runs a subset (:func:`scenario_modes`): the encoding
only matters where bytes reach the disk, so it runs the persistence scenarios in the
``io`` and ``crash`` modes (and a SIGKILL campaign), not the scheduler-level
``checkpoints`` mode, which its plain twin already covers.

``postgres`` (:class:`~harness.persistence.PostgresBackend`) fails and crashes through
its statement hook: the attempt's :class:`SqliteFaults` counts every statement
(``BEGIN``/``COMMIT``/``COPY`` included) and is adapted (:class:`PgStatementFaults`):
the k-th statement fails as a full disk (``DiskFull``) or an I/O error (``IoError``);
a ``COMMIT`` picked to fail *runs* and then loses its answer (the connection dropped
after the commit: the in-doubt commit a writer must retry without duplicating or
refusing its own write); a crash stops the "process" (connection closed, its leases no
longer vouched for). It runs a subset (:data:`_SCOPE`). The server is
:data:`PG_URL_ENV` (set by ``harness chaos``, which starts a throwaway cluster unless
``HARNESS_BENCH_POSTGRES_URL`` names one); each attempt gets its own PostgreSQL schema,
named after its temporary directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TextIO, TypeAlias

from harness.faults._explore import Probe
from harness.faults._invariants import check_stored, check_writer_locks
from harness.faults._sqlite_faults import SqliteFaults
from harness.persistence import JsonlBackend, SqliteBackend
from harness.persistence._files import OsFiles
from harness.runtime import SessionHandle

if TYPE_CHECKING:
    from harness.persistence import PostgresBackend

BACKENDS: Final = ("jsonl", "sqlite", "jsonl-zstd", "postgres")
#: The kinds whose faults go through the file layer (``FaultyFiles``, ``PowerLossFiles``).
FILE_BACKENDS: Final = frozenset({"jsonl", "jsonl-zstd"})

#: Per kind, the built-in scenarios it runs and in which modes (a kind not listed runs
#: every scenario in every mode; a scenario not listed under its kind does not run).
_SCOPE: Final[dict[str, dict[str, frozenset[str]]]] = {
    "jsonl-zstd": dict.fromkeys(("resume", "lifecycle", "write-behind", "agent-turn"), frozenset({"io", "crash"})),
    # Every statement of the write path, through a real server, bounded to ~1 min of
    # the CI campaign on 2 cores: the pure persistence scenarios only (the agent-level
    # ones add scheduler steps the other kinds already explore, at a server round trip
    # per statement); cancellations at every step of ``write-behind``; I/O failures and
    # crashes at every statement of both.
    "postgres": {
        "write-behind": frozenset({"checkpoints", "io", "crash"}),
        "lifecycle": frozenset({"io", "crash"}),
        "group-write": frozenset({"io", "crash"}),
        "group-commit": frozenset({"io", "crash"}),
        # The chain is the same on every backend (jsonl and sqlite explore its steps):
        # on the server, a crash at every statement of its rounds (~10 s of the campaign).
        "group-chain": frozenset({"crash"}),
    },
}


def uses_files(kind: str) -> bool:
    """Whether ``kind``'s faults are file operations (else statements: SQLite, PostgreSQL)."""
    return kind in FILE_BACKENDS


#: Scenarios that run only on some kinds. ``group-write`` calls ``write_group``
#: directly, on the backends that have one (JSONL's once refused a session's batch
#: behind its failed earlier one only after this scenario found the gap; the zstd
#: layout shares JSONL's code and is left out for budget).
_KINDS: Final[dict[str, frozenset[str]]] = {
    "group-write": frozenset({"jsonl", "sqlite", "postgres"}),
    "group-chain": frozenset({"jsonl", "sqlite", "postgres"}),
    # The runtime's path (call_nowait, the shielded flush) is the same on every
    # backend; JSONL and SQLite explore it, the others' write paths are group-commit's.
    "durable-append": frozenset({"jsonl", "sqlite"}),
}

#: Modes a scenario skips on one kind, for the campaign's budget. ``durable-append``'s
#: I/O failures and crash points on SQLite are group-commit's statements (explored
#: there; ~14 s of the CI campaign's worker time); on SQLite it explores its own runtime
#: path (cancellations), and its I/O and crash checks of what it acknowledged run on
#: JSONL.
_LEFT_OUT: Final[dict[tuple[str, str], frozenset[str]]] = {
    ("durable-append", "sqlite"): frozenset({"io", "crash"}),
}


def scenario_modes(name: str, kind: str, modes: tuple[str, ...]) -> tuple[str, ...]:
    """The modes of ``modes`` the built-in scenario ``name`` runs in on ``kind``
    (empty: the scenario does not run on that kind)."""
    if kind not in _KINDS.get(name, frozenset({kind})):
        return ()
    modes = tuple(m for m in modes if m not in _LEFT_OUT.get((name, kind), ()))
    scope = _SCOPE.get(kind)
    if scope is None:
        return modes
    allowed = scope.get(name, frozenset())
    return tuple(m for m in modes if m in allowed)

Backend: TypeAlias = "JsonlBackend | SqliteBackend | PostgresBackend"

#: The PostgreSQL server of the ``postgres`` kind (a libpq URL); ``harness chaos`` sets it.
PG_URL_ENV: Final = "HARNESS_CHAOS_POSTGRES_URL"
#: The prefix of the schemas of one campaign (``harness chaos`` drops them afterwards).
PG_PREFIX_ENV: Final = "HARNESS_CHAOS_POSTGRES_PREFIX"
#: A server named here is used instead of a throwaway cluster (as by ``harness bench``).
PG_BENCH_URL_ENV: Final = "HARNESS_BENCH_POSTGRES_URL"


def backend_location(probe_or_root: Probe | Path, kind: str) -> Path:
    """Where a scenario's ``kind`` backend keeps its data under the attempt's tmp_path
    (``postgres``: the path its schema name is derived from)."""
    root = probe_or_root.tmp_path if isinstance(probe_or_root, Probe) else probe_or_root
    if kind in ("jsonl", "jsonl-zstd", "postgres"):
        return root / kind
    if kind == "sqlite":
        return root / "sessions.sqlite"
    raise ValueError(f"unknown backend {kind!r} (expected one of {', '.join(BACKENDS)})")


def make_backend(probe: Probe, kind: str) -> Backend:
    """The backend a scenario persists to: wired to ``probe.faults`` (a ``FaultyFiles``
    / ``PowerLossFiles`` for JSONL, a ``SqliteFaults`` for SQLite and PostgreSQL) when
    the attempt injects I/O faults or crashes, plain otherwise."""
    where = backend_location(probe, kind)
    faults = probe.faults
    if uses_files(kind):
        return JsonlBackend(where, files=faults if isinstance(faults, OsFiles) else None, compression=_compression(kind))
    if kind == "postgres":
        return _postgres(where, PgStatementFaults(faults) if isinstance(faults, SqliteFaults) else None)
    return SqliteBackend(where, faults=faults if isinstance(faults, SqliteFaults) else None)


def plain_backend(root: Probe | Path, kind: str) -> Backend:
    """A fresh backend over the same location, without faults (to reload and check)."""
    where = backend_location(root, kind)
    if kind == "postgres":
        return _postgres(where, None)
    return JsonlBackend(where, compression=_compression(kind)) if uses_files(kind) else SqliteBackend(where)


def _compression(kind: str) -> Literal["none", "zstd"]:
    return "zstd" if kind == "jsonl-zstd" else "none"


def make_backend_at(root: str | Path, kind: str) -> Backend:
    """A plain ``kind`` backend under ``root`` (the layout :func:`backend_location` uses)."""
    return plain_backend(Path(root), kind)


def close_backend(backend: Backend) -> None:
    """Release what a backend holds open (SQLite's connection, PostgreSQL's pool; JSONL
    holds nothing)."""
    if not isinstance(backend, JsonlBackend):
        backend.close()


# -- PostgreSQL ----------------------------------------------------------------------------------


def postgres_schema(where: Path) -> str:
    """The schema of the ``postgres`` backend at ``where``: the campaign's prefix and a
    digest of the path (an attempt's tmp_path is unique, so is its schema)."""
    prefix = os.environ.get(PG_PREFIX_ENV, "chaos_")
    return prefix + hashlib.sha256(str(where.resolve()).encode()).hexdigest()[:16]


def _postgres(where: Path, faults: PgStatementFaults | None) -> PostgresBackend:
    from harness.persistence import PostgresBackend

    url = os.environ.get(PG_URL_ENV)
    if not url:
        raise RuntimeError(
            f"the postgres chaos kind needs a server: set {PG_URL_ENV} (harness chaos starts a throwaway "
            f"cluster itself, or uses {PG_BENCH_URL_ENV})"
        )
    return PostgresBackend(url, schema=postgres_schema(where), faults=faults, pool_size=2, pool_timeout=10.0)


_PG_ERRORS: Final = {
    "full": ("DiskFull", "could not extend file: No space left on device"),
    "ioerr": ("IoError", "could not write block: Input/output error"),
}


class PgStatementFaults:
    """The PostgreSQL backend's statement hook, driven by a :class:`SqliteFaults` (which
    counts the statements and decides which one fails or crashes; the explorers read
    it). A failure becomes the server's ``DiskFull`` / ``IoError``, except at a
    ``COMMIT``: that one runs, and then its answer is lost
    (``OperationalError``, as when the connection drops right after the commit), so
    the caller cannot tell whether it landed. :class:`SimulatedCrash` passes through."""

    def __init__(self, counter: SqliteFaults) -> None:
        self.counter = counter
        self._local = threading.local()

    def before(self, sql: str) -> None:
        import psycopg.errors

        try:
            self.counter.before(sql)
        except sqlite3.OperationalError as exc:
            if sql == "COMMIT":
                self._local.lost = str(exc)  # it runs; :meth:`after` loses its answer
                return
            name, message = _PG_ERRORS[self.counter.error]
            raise getattr(psycopg.errors, name)(f"{message} (injected: {exc})") from None

    def after(self, sql: str) -> None:
        import psycopg

        lost = getattr(self._local, "lost", None)
        if lost is not None and sql == "COMMIT":
            self._local.lost = None
            raise psycopg.OperationalError(
                f"server closed the connection unexpectedly after COMMIT (injected: {lost})"
            )


@contextlib.contextmanager
def postgres_server(err: TextIO) -> Iterator[str | None]:
    """The server of the ``postgres`` kind for a campaign, exported in :data:`PG_URL_ENV`
    (worker processes inherit it) with a fresh schema prefix: the one already named
    there or in :data:`PG_BENCH_URL_ENV` (its schemas of this campaign are dropped at
    the end), else a throwaway local cluster (destroyed at the end). Yields ``None``,
    having said why on ``err``, when there is none (no binaries, no psycopg)."""
    from harness.persistence._postgres_cluster import missing, start_cluster

    saved = {k: os.environ.get(k) for k in (PG_URL_ENV, PG_PREFIX_ENV)}
    url = os.environ.get(PG_URL_ENV) or os.environ.get(PG_BENCH_URL_ENV)
    cluster = None
    if not url:
        why = missing()
        if why is not None:
            err.write(f"harness chaos: skipping the postgres kind: {why} (or set {PG_BENCH_URL_ENV})\n")
            yield None
            return
        try:
            cluster = start_cluster()
        except Exception as exc:
            err.write(f"harness chaos: skipping the postgres kind: the throwaway cluster did not start: {exc}\n")
            yield None
            return
        url = cluster.url
    prefix = f"chaos_{secrets.token_hex(4)}_"
    os.environ[PG_URL_ENV] = url
    os.environ[PG_PREFIX_ENV] = prefix
    try:
        yield url
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if cluster is not None:
            cluster.destroy()
        else:
            _drop_schemas(url, prefix, err)


def _drop_schemas(url: str, prefix: str, err: TextIO) -> None:
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            names = [
                r[0]
                for r in conn.execute(
                    "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,)
                ).fetchall()
            ]
            for name in names:
                conn.execute(f'DROP SCHEMA "{name}" CASCADE')
    except psycopg.Error as exc:
        err.write(f"harness chaos: dropping the campaign's schemas ({prefix}*) failed: {exc}\n")


# -- what persistence scenarios share ---------------------------------------------------------


def track_session(probe: Probe, handle: SessionHandle) -> None:
    """Remember a session for :func:`check_at_rest` (its header names its lock)."""
    sessions: dict[str, dict[str, Any]] = probe.data.setdefault("sessions", {})
    sessions[handle.id] = handle.header.to_record()


def check_at_rest(probe: Probe, kind: str) -> None:
    """Reload every tracked session with a fresh ``kind`` backend: it loads under the
    reading rules, crash repair closes it, every acknowledged event is there unchanged,
    and its writer lock is free. Blocking; run it once the runtime has exited (the I/O
    and crash explorers run it after the attempt when the scenario did not get there)."""
    backend = plain_backend(probe, kind)
    try:
        sessions: dict[str, dict[str, Any]] = probe.data.get("sessions", {})
        for sid, header in sessions.items():
            probe.record(
                check_stored(
                    backend,
                    sid,
                    acknowledged=probe.acknowledged.get(sid, -1),
                    expected=probe.acknowledged_records.get(sid),
                )
            )
            probe.record(check_writer_locks((), backend, [header]))
        for sid in sorted(set(probe.acknowledged) - set(sessions)):
            probe.fail(f'acknowledged session "{sid}" was never tracked')
    finally:
        close_backend(backend)
    probe.data["at_rest_checked"] = True
