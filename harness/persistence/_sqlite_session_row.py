"""The ``sessions`` row of the SQLite backend: a header's row for a new incarnation,
and the header (checked) of a stored row (reference ``decodeSessionRow`` + ``rowToMeta``)."""

from __future__ import annotations

import uuid
from typing import Any

from harness.errors import (
    RecordEncodingError,
    SessionCorruptionError,
)
from harness.persistence._backend import format_error
from harness.persistence._sqlite_schema import is_uuid
from harness.session import SESSION_FORMAT_VERSION
from harness.session._header import _is_absolute

_SESSION_COLUMNS = (
    "id, version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, agent_preset, "
    "incarnation, revision"
)


def _session_params(sid: str, header: dict[str, Any]) -> tuple[Any, ...]:
    """The ``sessions`` row of a header (new incarnation). Keys the schema has no column
    for are not stored (as in the reference); an absent ``delegationDepth`` is stored
    as 0 (as the JSONL header line does). Raises :class:`RecordEncodingError`."""

    def get(key: str, kind: type, default: Any = None) -> Any:
        value = header.get(key, default)
        if value is not None and type(value) is not kind:
            raise RecordEncodingError(
                f'session "{sid}": the header cannot be stored: {key} must be {"an integer" if kind is int else "a string"}',
                session_id=sid,
            )
        return value

    version, created_at = get("version", int), get("createdAt", int)
    if version is None or created_at is None:
        raise RecordEncodingError(
            f'session "{sid}": the header cannot be stored: version and createdAt are required', session_id=sid
        )
    return (
        sid,
        version,
        created_at,
        get("cwd", str),
        get("parentSession", str),
        get("seedLength", int),
        get("origin", str),
        get("delegationDepth", int, 0),
        get("agentPreset", str),
        str(uuid.uuid4()),
    )


def _header(row: tuple[Any, ...]) -> dict[str, Any]:
    """The header of a ``sessions`` row (reference ``decodeSessionRow`` + ``rowToMeta``):
    NULL columns are absent keys. A row that breaks the column rules is corruption; a
    format version other than 0 is refused after that (as the coordinator's check)."""
    sid, version, created_at, cwd, parent, seed_length, origin, depth, preset, incarnation, revision = row

    def bad(why: str) -> SessionCorruptionError:
        return SessionCorruptionError(
            f'corrupt session log: stored session metadata of "{sid}" is invalid: {why}', session_id=str(sid)
        )

    def nonneg(v: Any) -> bool:
        return type(v) is int and 0 <= v <= 2**53 - 1

    if type(sid) is not str or not sid:
        raise bad("stored id must not be empty")
    if type(version) is not int or abs(version) > 2**53 - 1:
        raise bad("stored version must be a safe integer")
    if cwd is not None and (type(cwd) is not str or not _is_absolute(cwd)):
        raise bad("stored session cwd must be absolute")
    if parent is not None and type(parent) is not str:
        raise bad("stored parent_session must be a string or null")
    if origin is not None and origin != "subagent":
        raise bad("stored session origin must be subagent or null")
    if not is_uuid(incarnation):
        raise bad("stored session incarnation must be a UUID")
    if not nonneg(created_at):
        raise bad("stored created_at must be non-negative")
    if seed_length is not None and not nonneg(seed_length):
        raise bad("stored seed_length must be non-negative or null")
    if depth is not None and not nonneg(depth):
        raise bad("stored delegation_depth must be non-negative or null")
    if preset is not None and type(preset) is not str:
        raise bad("stored agent_preset must be a string or null")
    if not nonneg(revision):
        raise bad("stored revision must be non-negative")
    if version != SESSION_FORMAT_VERSION:
        raise format_error(sid, version)
    header: dict[str, Any] = {"version": version, "id": sid, "createdAt": created_at}
    for key, value in (
        ("cwd", cwd),
        ("parentSession", parent),
        ("seedLength", seed_length),
        ("origin", origin),
        ("delegationDepth", depth),
        ("agentPreset", preset),
    ):
        if value is not None:
            header[key] = value
    return header
