"""The session header (reference §3): a frozen attrs value plus its record form."""

from __future__ import annotations

import ntpath
import os
import posixpath
from typing import Any, Final, Literal

import attrs

from harness.errors import HeaderError, NotJsonError
from harness.session._events import is_nonneg_safe_int
from harness.session._json import FrozenDict, RawJson, adopt, raw_of, snapshot_raw

SESSION_FORMAT_VERSION: Final = 0

_KNOWN_KEYS: Final = (
    "version",
    "id",
    "createdAt",
    "cwd",
    "parentSession",
    "seedLength",
    "origin",
    "delegationDepth",
    "agentPreset",
)


@attrs.frozen(slots=True)
class SessionHeader:
    """Durable facts about a session, kept outside its log.

    ``seed_length`` is lineage (the fork prefix length), not the number of events a
    resumed session started with (that is ``Session.first_live_seq``). ``extra`` keeps
    unknown header keys, which the reference tolerates and preserves.
    """

    id: str
    created_at: int
    version: int = SESSION_FORMAT_VERSION
    cwd: str | None = None
    parent_session: str | None = None
    seed_length: int | None = None
    origin: Literal["subagent"] | None = None
    delegation_depth: int | None = None
    agent_preset: str | None = None
    extra: FrozenDict = attrs.field(factory=lambda: FrozenDict({}), eq=True)

    def to_record(self) -> dict[str, Any]:
        """The camelCase record (absent optionals omitted, extra keys last)."""
        rec: dict[str, Any] = {"version": self.version, "id": self.id, "createdAt": self.created_at}
        for key, value in (
            ("cwd", self.cwd),
            ("parentSession", self.parent_session),
            ("seedLength", self.seed_length),
            ("origin", self.origin),
            ("delegationDepth", self.delegation_depth),
            ("agentPreset", self.agent_preset),
        ):
            if value is not None:
                rec[key] = value
        rec.update(raw_of(self.extra))
        return rec


def _is_absolute(path: str) -> bool:
    # "absolute path per host OS rules"
    if os.name == "nt":
        return ntpath.isabs(path)
    return posixpath.isabs(path)


def validate_header_record(raw: RawJson, session_id: str) -> SessionHeader:
    """Validate a header record in the reference's order; return the frozen header.

    ``raw`` is adopted (not copied): pass a fresh tree (restore mode) or a snapshot.
    """
    if type(raw) is not dict:
        raise HeaderError("session header is not a plain JSON record", session_id=session_id)
    version = raw.get("version")
    if version != SESSION_FORMAT_VERSION or type(version) is not int:
        raise HeaderError(
            f"session header version must be {SESSION_FORMAT_VERSION}, got {_fmt(version)}",
            session_id=session_id,
        )
    hid = raw.get("id")
    if hid != session_id:
        raise HeaderError(
            f'session header id "{_fmt_plain(hid)}" does not match session id "{session_id}"',
            session_id=session_id,
        )
    if not is_nonneg_safe_int(raw.get("createdAt")):
        raise HeaderError(
            "session header createdAt must be a non-negative safe integer", session_id=session_id
        )
    cwd = raw.get("cwd")
    if cwd is not None or "cwd" in raw:
        if type(cwd) is not str:
            raise HeaderError("session header cwd must be a string", session_id=session_id)
        if not _is_absolute(cwd):
            raise HeaderError(
                f'session header cwd must be an absolute path, got "{cwd}"', session_id=session_id
            )
    if "parentSession" in raw and type(raw["parentSession"]) is not str:
        raise HeaderError("session header parentSession must be a string", session_id=session_id)
    if "seedLength" in raw and not is_nonneg_safe_int(raw["seedLength"]):
        raise HeaderError(
            "session header seedLength must be a non-negative safe integer", session_id=session_id
        )
    if "origin" in raw and raw["origin"] != "subagent":
        raise HeaderError('session header origin must be "subagent"', session_id=session_id)
    if "delegationDepth" in raw and not is_nonneg_safe_int(raw["delegationDepth"]):
        raise HeaderError(
            "session header delegationDepth must be a non-negative safe integer",
            session_id=session_id,
        )
    if "agentPreset" in raw and type(raw["agentPreset"]) is not str:
        raise HeaderError("session header agentPreset must be a string", session_id=session_id)
    extra = {k: v for k, v in raw.items() if k not in _KNOWN_KEYS}
    return SessionHeader(
        id=hid,
        created_at=raw["createdAt"],
        version=version,
        cwd=cwd,
        parent_session=raw.get("parentSession"),
        seed_length=raw.get("seedLength"),
        origin=raw.get("origin"),
        delegation_depth=raw.get("delegationDepth"),
        agent_preset=raw.get("agentPreset"),
        extra=adopt(extra),  # type: ignore[arg-type]
    )


def snapshot_header(value: object, session_id: str) -> SessionHeader:
    """Snapshot mode: JSON-walk and copy a borrowed header record, then validate it.

    The walk comes first (reference §3.1): a value that is not lossless JSON (a set,
    a tuple, a class instance, a dict subclass) is "not losslessly JSON-serializable";
    JSON that is not an object (a list, a string, ``None``) is "not a plain JSON record".
    """
    if isinstance(value, SessionHeader):
        return validate_header_record(value.to_record(), session_id)
    try:
        raw = snapshot_raw(value, "session header")
    except NotJsonError:
        raise HeaderError(
            "session header is not losslessly JSON-serializable", session_id=session_id
        ) from None
    return validate_header_record(raw, session_id)


def _fmt(v: object) -> str:
    # JS String(v) for the few types a version can take
    if v is None:
        return "undefined"
    if v is True:
        return "true"
    if v is False:
        return "false"
    return str(v)


def _fmt_plain(v: object) -> str:
    return "undefined" if v is None else str(v)
