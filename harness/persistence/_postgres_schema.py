"""The PostgreSQL schema of :class:`~harness.persistence.PostgresBackend` and its checks.

Everything lives in one PostgreSQL *schema* (namespace, default ``harness``) that the
backend owns: four tables, created together in one transaction on first use.

* ``meta`` — one row: ``application`` (``trio-harness``), ``schema_version``
  (:data:`SCHEMA_VERSION`) and ``store_id`` (a UUID: the store's identity, part of
  every revision string).
* ``sessions`` — one row per session: the header record as JSON text (unknown keys
  kept, as in a JSONL header line), an ``incarnation`` UUID (new on every
  materialize) and a ``revision`` counter bumped by every write.
* ``events`` — the rows of :mod:`harness.persistence._sqlite_rows` (scalar events and
  packed chunk runs), keyed ``(session_id, seq)``; ``data`` is JSON text, or, when
  that was 4096 bytes or more and Zstandard made it smaller, the frame in
  ``data_z`` (exactly one of the two is set).
* ``leases`` — one row per session ever opened for writing: the fence (grows with
  every acquisition, never reset, not even by a delete), the holder (random token,
  host, pid, the pid's start time, its pid scope: see
  :mod:`harness.persistence._liveness`), ``since`` and ``expires`` in the *server's*
  clock (hosts' clocks never have to agree).

:func:`open_schema` runs before the backend writes anything: a schema whose ``meta``
names another application, a newer version, or that holds tables but no ``meta``
row (somebody else's namespace) is refused with :class:`PostgresSchemaError`,
untouched. A version-1 schema (before ``leases.pid_scope``, issue 24) is upgraded in
place: the column is added, NULL in every existing row (those holders are remote:
respected until they expire), and ``schema_version`` becomes 2. Concurrent first
opens (and upgrades) serialise on a transaction-scoped advisory lock, so exactly one
creates (or upgrades) the tables.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

from harness.errors import StorageIOError

APPLICATION: Final = "trio-harness"
SCHEMA_VERSION: Final = 2
#: Older versions :func:`open_schema` upgrades in place (see the module docstring).
UPGRADABLE_VERSIONS: Final = (1,)
DEFAULT_SCHEMA: Final = "harness"

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

TABLES: Final = ("meta", "sessions", "events", "leases")


class PostgresSchemaError(StorageIOError):
    """The PostgreSQL schema is not one this build may use: another application's,
    another schema version, or a namespace holding foreign tables. Raised before the
    backend wrote anything. ``schema``: the namespace; ``application`` and
    ``schema_version``: what its ``meta`` row holds (``None`` if absent)."""

    code = "POSTGRES_SCHEMA_INCOMPATIBLE"

    def __init__(
        self,
        message: str,
        *,
        schema: str,
        application: str | None = None,
        schema_version: int | None = None,
    ) -> None:
        super().__init__(message)
        self.schema = schema
        self.application = application
        self.schema_version = schema_version


def check_name(schema: str) -> str:
    """``schema`` if it is a plain lower-case identifier (it is interpolated into SQL)."""
    if not isinstance(schema, str) or not _NAME.fullmatch(schema):
        raise ValueError(f"PostgreSQL schema name must match [a-z_][a-z0-9_]{{0,62}}, got {schema!r}")
    return schema


def ddl(s: str) -> tuple[str, ...]:
    """The statements that create schema ``s`` (already checked by :func:`check_name`)."""
    return (
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"""CREATE TABLE {s}.meta (
  singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  application    text NOT NULL,
  schema_version integer NOT NULL,
  store_id       uuid NOT NULL,
  created        timestamptz NOT NULL DEFAULT clock_timestamp()
)""",
        f"""CREATE TABLE {s}.sessions (
  id          text PRIMARY KEY,
  header      text NOT NULL,
  incarnation uuid NOT NULL,
  revision    bigint NOT NULL
)""",
        f"""CREATE TABLE {s}.events (
  session_id        text NOT NULL REFERENCES {s}.sessions (id) ON DELETE CASCADE,
  seq               bigint NOT NULL,
  type              text NOT NULL,
  time              bigint NOT NULL,
  data              text,
  data_z            bytea,
  source_event_seqs bytea,
  surface_op        text,
  ignorable         smallint,
  PRIMARY KEY (session_id, seq),
  CHECK ((data IS NULL) <> (data_z IS NULL))
)""",
        f"""CREATE TABLE {s}.leases (
  session_id text PRIMARY KEY,
  fence      bigint NOT NULL,
  token      text,
  host       text,
  pid        integer,
  start_time bigint,
  since      timestamptz,
  expires    timestamptz,
  pid_scope  text
)""",
    )


Exec = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
"""Run one statement, return its rows (``[]`` for none)."""


def open_schema(exec_: Exec, s: str, *, create: bool = True) -> str:
    """Inside one transaction: check schema ``s`` and create it when absent (unless
    not ``create``: then its absence is refused too); return the store id. Refuses
    (:class:`PostgresSchemaError`) before writing anything."""
    found = _inspect(exec_, s)
    if found is not None and found[1] == SCHEMA_VERSION:
        return found[0]
    if found is None and not create:
        raise PostgresSchemaError(f'PostgreSQL schema "{s}" holds no trio-harness store', schema=s)
    # Serialise concurrent creators (and upgraders); the loser sees the winner's work.
    exec_("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{APPLICATION}:schema:{s}",))
    found = _inspect(exec_, s)
    if found is not None:
        if found[1] != SCHEMA_VERSION:
            _upgrade(exec_, s, found[1])
        return found[0]
    for stmt in ddl(s):
        exec_(stmt, ())
    store_id = str(uuid.uuid4())
    exec_(
        f"INSERT INTO {s}.meta (application, schema_version, store_id) VALUES (%s, %s, %s)",
        (APPLICATION, SCHEMA_VERSION, store_id),
    )
    return store_id


def _upgrade(exec_: Exec, s: str, version: int) -> None:
    """Bring schema ``s`` from ``version`` (one of :data:`UPGRADABLE_VERSIONS`) to
    :data:`SCHEMA_VERSION`, under the advisory lock, in the opening transaction."""
    if version == 1:
        # Rows of version-1 holders get no scope: remote, respected until they expire.
        exec_(f"ALTER TABLE {s}.leases ADD COLUMN IF NOT EXISTS pid_scope text", ())
    exec_(f"UPDATE {s}.meta SET schema_version = %s", (SCHEMA_VERSION,))


def _inspect(exec_: Exec, s: str) -> tuple[str, int] | None:
    """The store id and schema version of a valid schema ``s`` (the version is this
    build's or one it upgrades); ``None`` if there is none yet (no namespace, or an
    empty one); raises for anything else."""
    tables = {
        str(r[0])
        for r in exec_(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            (s,),
        )
    }
    if not tables:
        return None
    if "meta" not in tables:
        raise PostgresSchemaError(
            f'PostgreSQL schema "{s}" holds tables ({", ".join(sorted(tables))}) but no trio-harness '
            "meta table: it belongs to something else; choose another schema",
            schema=s,
        )
    rows = exec_(f"SELECT application, schema_version, store_id FROM {s}.meta", ())
    if len(rows) != 1:
        raise PostgresSchemaError(
            f'PostgreSQL schema "{s}": its meta table holds {len(rows)} rows, expected one', schema=s
        )
    application, version, store_id = rows[0]
    if application != APPLICATION:
        raise PostgresSchemaError(
            f'PostgreSQL schema "{s}" belongs to application {application!r}, not {APPLICATION!r}',
            schema=s,
            application=str(application),
            schema_version=int(version),
        )
    if version != SCHEMA_VERSION and version not in UPGRADABLE_VERSIONS:
        newer = int(version) > SCHEMA_VERSION
        raise PostgresSchemaError(
            f'PostgreSQL schema "{s}" has schema version {version}, '
            + (
                f"newer than this build's {SCHEMA_VERSION}: upgrade the harness to open it"
                if newer
                else f"older than this build's {SCHEMA_VERSION}, and this build ships no upgrade path"
            ),
            schema=s,
            application=str(application),
            schema_version=int(version),
        )
    missing = [t for t in TABLES if t not in tables]
    if missing:
        raise PostgresSchemaError(
            f'PostgreSQL schema "{s}" lacks the table(s) {", ".join(missing)}', schema=s,
            application=str(application), schema_version=int(version),
        )
    return str(store_id), int(version)


def is_postgres_url(value: object) -> bool:
    """Whether ``value`` is a ``postgresql://`` (or ``postgres://``) URL (checked
    without importing psycopg)."""
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


def redact_url(url: str) -> str:
    """``url`` without the password of its user part (for messages and output)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hostpart = rest.partition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostpart}"
