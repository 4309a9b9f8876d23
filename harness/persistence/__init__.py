"""Durable sessions: the backend protocol, JSONL (default), SQLite and PostgreSQL backends, the
write-behind coordinator, and session preparations (restore from storage).

    async with open_store() as store, open_persistence(store, JsonlBackend(root)) as p:
        session = await store.create(cwd="/work")
        ...
        await session.flush()          # durable when this returns
"""

from typing import TYPE_CHECKING, Any

from harness.persistence._backend import Backend, StoredLines, StoredLog, WriterLease, header_record
from harness.persistence._checkpoint import CheckpointPolicy
from harness.persistence._coordinator import (
    Persistence,
    PreparationRecord,
    SessionPreparation,
    build_session,
    open_persistence,
)
from harness.persistence._files import OsFiles
from harness.persistence._jsonl import JsonlBackend, encode_segment, project_key
from harness.persistence._postgres_schema import PostgresSchemaError
from harness.persistence._service import SessionInspection
from harness.persistence._sqlite import SqliteBackend, migrate_legacy_sqlite

__all__ = [
    "Backend",
    "CheckpointPolicy",
    "JsonlBackend",
    "OsFiles",
    "Persistence",
    "PostgresBackend",
    "PostgresSchemaError",
    "PreparationRecord",
    "SessionInspection",
    "SessionPreparation",
    "SqliteBackend",
    "StoredLines",
    "StoredLog",
    "WriterLease",
    "build_session",
    "encode_segment",
    "header_record",
    "migrate_legacy_sqlite",
    "open_persistence",
    "project_key",
]


if TYPE_CHECKING:
    from harness.persistence._postgres import PostgresBackend


def __getattr__(name: str) -> Any:
    # PostgresBackend needs the optional psycopg ("trio-harness[postgres]"): imported
    # on first use, so the package works without it.
    if name == "PostgresBackend":
        from harness.persistence._postgres import PostgresBackend

        return PostgresBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
