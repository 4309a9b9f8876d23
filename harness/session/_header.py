"""The session header (reference §3): a frozen attrs value plus its record form."""

from __future__ import annotations

import ntpath
import os
import posixpath
from typing import Any, Final, Literal

import attrs

from harness.errors import HeaderError, NotJsonError, SessionIdError
from harness.session._events import is_nonneg_safe_int
from harness.session._json import (
    ABSENT,
    FrozenDict,
    RawJson,
    adopt,
    js_string,
    raw_of,
    shown_safe_int,
    snapshot_raw,
)

SESSION_FORMAT_VERSION: Final = 0

MAX_SESSION_ID_BYTES: Final = 244
"""The longest id, measured as the JSONL path segment that names it: 255 (``NAME_MAX``
of every common file system) less the 11 of ``.jsonl.zstd``, because the JSONL backend
probes for the reference's flat-layout file ``<segment>.jsonl.zstd`` before it writes.
Every backend enforces it, so a session can move between backends: ``[A-Za-z0-9._-]``
count 1 byte, every other UTF-16 code unit 5 (``~XXXX``)."""

_ID_LITERAL: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def session_id_bytes(session_id: str) -> int:
    """The length of ``session_id``'s JSONL path segment (the reference's
    ``encodeSegment``), without building it."""
    if session_id == ".":
        return 5
    if session_id == "..":
        return 10
    return sum(1 if ch in _ID_LITERAL else 10 if ord(ch) > 0xFFFF else 5 for ch in session_id)


def show_id(value: str) -> str:
    """An id for an error message: quoted and escaped (control characters visible),
    cut after 60 characters so that a megabyte id does not become a megabyte message."""
    if len(value) <= 80:
        return repr(value)
    return f"{value[:60]!r}... ({len(value)} characters)"


def check_lookup_id(value: object, what: str = "session id") -> str:
    """The door check for an id that only names a session (get, load, prepare,
    inspect, delete, ...): a non-empty string that encodes as UTF-8. Nothing longer
    is refused here, so an id stored by an older build still reads."""
    if type(value) is not str or not value:
        raise SessionIdError(f"{what} must be a non-empty string, got {value!r}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # Both backends would fail deep down (utf-16 path encoding, SQLite bind).
            raise SessionIdError(
                f"{what} {show_id(value)} is not valid Unicode: it holds a lone surrogate",
                session_id=value,
            ) from None
    return value


def check_session_id(value: object, what: str = "session id") -> str:
    """The door check for a *new* id (create, prepare, fork child, persistence create).

    Refuses, with :class:`SessionIdError` naming the value, what :func:`check_lookup_id`
    refuses, control characters (U+0000..U+001F, U+007F: the CLI could never name the
    session, and a newline in an id would forge log lines), and an id longer than
    :data:`MAX_SESSION_ID_BYTES` as a path segment: the first write-behind flush would
    otherwise fail with "file name too long", long after ``create`` said yes.
    """
    sid = check_lookup_id(value, what)
    bad = next((ch for ch in sid if ch < " " or ch == "\x7f"), None)
    if bad is not None:
        raise SessionIdError(
            f"{what} {show_id(sid)} holds the control character {bad!r}", session_id=sid
        )
    size = session_id_bytes(sid)
    if size > MAX_SESSION_ID_BYTES:
        raise SessionIdError(
            f"{what} {show_id(sid)} is too long: its storage name takes {size} bytes, more than "
            f"{MAX_SESSION_ID_BYTES} ([A-Za-z0-9._-] take 1 byte each, other characters 5)",
            session_id=sid,
        )
    return sid


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
    version = raw.get("version", ABSENT)
    if version != SESSION_FORMAT_VERSION or type(version) is not int:
        raise HeaderError(
            f"session header version must be {SESSION_FORMAT_VERSION}, got {shown_safe_int(version)}",
            session_id=session_id,
        )
    hid = raw.get("id", ABSENT)
    if type(hid) is not str or hid != session_id:
        raise HeaderError(
            f'session header id "{js_string(hid)}" does not match session id "{session_id}"',
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


