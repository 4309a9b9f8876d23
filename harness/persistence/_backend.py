"""The backend protocol shared by JSONL and SQLite, and the header record rules."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import orjson

from harness.errors import PersistenceError, SessionCorruptionError, SessionFormatUnsupportedError
from harness.session import SESSION_FORMAT_VERSION
from harness.session._events import is_nonneg_safe_int
from harness.session._json import ABSENT, js_string

_HEADER_ORDER = ("version", "id", "createdAt", "cwd", "parentSession", "seedLength", "origin", "delegationDepth", "agentPreset")


@attrs.frozen
class StoredLog:
    """What a backend read: the header record (``type`` removed), the event records
    (chunk rows expanded, freshly decoded: ownership passes to the caller), where a
    torn tail starts (``None`` if none), and the revision of exactly these bytes."""

    header: dict[str, Any]
    records: list[Any]
    truncate_to: int | None
    revision: str


@attrs.frozen
class StoredLines:
    """A log read but not decoded (``JsonlBackend.load_lines``): the header record
    (``type`` removed, checked), every complete event line in order, where the torn
    fragment after the last newline starts (``None`` if none), and the revision of
    exactly these bytes. Whether the lines are valid records is for the reader of the
    lines to find out (:meth:`~harness.session.Session.restore_stored_lines`); when
    they are not, :meth:`Backend.load` applies the reading rules."""

    header: dict[str, Any]
    lines: list[bytes]
    truncate_to: int | None
    revision: str


class WriterLease:
    """Proof of being the one live writer of a session. ``release`` is idempotent.

    A lease that can expire (SQLite) is renewed by every write through it and, while
    its holder is idle, by its backend; :meth:`renew` renews it explicitly."""

    def release(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def renew(self) -> None:
        """Extend the lease (blocking). Raises ``LeaseLostError`` if it was taken over."""


class Backend(Protocol):
    """A blocking storage backend. The coordinator calls it from worker threads.

    Every backend passes ``tests/test_backends.py``: headers-only listing, load with
    the torn-tail rule, atomic first write, whole-batch appends, repair, delete, a
    revision that changes on every write, and one writer per session.

    The ``records`` a session's writer hands to ``materialize``, ``append`` and
    ``write_group`` are for ``orjson`` only: an appended event's ``data`` may be an
    ``orjson.Fragment`` of its JSON (decision 0023), which ``json``, ``pickle`` and
    ``copy.deepcopy`` refuse and which cannot be indexed; a backend that reads or
    compares a record's data decodes ``orjson.loads(orjson.dumps(record))`` first.

    Writes take the caller's ``lease`` (``None``: the caller holds none): a backend
    whose leases can be taken over (SQLite) checks it in the same transaction as the
    write and refuses a lost one with ``LeaseLostError``; JSONL relies on its ``flock``.
    ``lock_held`` probes, from a fresh descriptor or connection, whether some writer
    holds the session (for invariant checks; works within one process).

    Optional: ``load_lines(session_id) -> StoredLines | None``, the log's event lines
    undecoded, which ``prepare`` tries first (decision 0010; JSONL has it). ``None``
    sends it to :meth:`load`.

    Optional: ``write_group(writes: Sequence[GroupWrite]) -> list[BaseException | None]``,
    several sessions' batches made durable together (group commit, issue 26): one
    transaction, or one round of fsyncs, for all of them. A backend without it gets
    :func:`write_each`.
    """

    name: str

    def list_headers(self) -> list[dict[str, Any]]: ...

    def load(self, session_id: str) -> StoredLog: ...

    def revision(self, session_id: str) -> str | None: ...

    def materialize(
        self, header: dict[str, Any], records: list[dict[str, Any]], *, lease: WriterLease | None = None
    ) -> None: ...

    def append(self, session_id: str, records: list[dict[str, Any]], *, lease: WriterLease | None = None) -> None: ...

    def commit_repair(
        self,
        session_id: str,
        truncate_to: int | None,
        records: list[dict[str, Any]],
        *,
        lease: WriterLease | None = None,
    ) -> None: ...

    def delete(self, session_id: str) -> None: ...

    def acquire_writer(self, header: dict[str, Any]) -> WriterLease: ...

    def lock_held(self, header: dict[str, Any]) -> bool: ...


@attrs.frozen
class GroupWrite:
    """One session's batch in a group commit (:func:`write_each`, ``write_group``).

    ``materialized`` False: the session's first write (``materialize(header,
    records)``); True: an ``append(session_id, records)``. ``lease`` is the writer's
    lease, checked exactly as by those calls."""

    session_id: str
    header: dict[str, Any]
    records: list[dict[str, Any]]
    materialized: bool
    lease: WriterLease | None


def write_each(backend: Backend, writes: Sequence[GroupWrite]) -> list[BaseException | None]:
    """Blocking: the ``write_group`` contract by one call per batch, in order.

    The contract every ``write_group`` keeps: the result is aligned with ``writes``;
    ``None`` means that batch is durable, an exception that *none* of it landed (the
    exception ``append``/``materialize`` would have raised for it alone) -- or, for a
    first write the backend reports in doubt (JSONL: linked, directory fsync failed;
    PostgreSQL: a ``COMMIT`` whose answer was lost), that it may have landed and the
    same write retried completes it exactly once. One batch's
    failure (a lost lease, a refused first write) never fails another's; a failure of
    the shared step (the transaction's commit, an fsync) fails every batch it covers.
    Batches of one session appear in the order given and land in that order, and a
    batch never lands behind a gap that an earlier failed batch of its session left: a
    backend with a storage-level seq check judges it against the stored log; here
    (JSONL has no such check) it is not written and gets :func:`unwritten_after_failure`."""
    results: list[BaseException | None] = []
    failed: dict[str, BaseException] = {}
    for w in writes:
        earlier = failed.get(w.session_id)
        if earlier is not None:
            # Writing it would leave a gap where the failed batch belonged.
            results.append(unwritten_after_failure(backend, w.session_id, earlier))
            continue
        try:
            if w.materialized:
                backend.append(w.session_id, w.records, lease=w.lease)
            else:
                backend.materialize(w.header, w.records, lease=w.lease)
        except Exception as exc:
            failed[w.session_id] = exc
            results.append(exc)
        else:
            results.append(None)
    return results


def unwritten_after_failure(backend: Backend, session_id: str, earlier: BaseException) -> PersistenceError:
    """The refusal of a batch not written because an earlier batch of the same session
    in the same group failed (it would have landed behind a gap)."""
    err = PersistenceError(
        f'{backend.name}: session "{session_id}": batch not written, an earlier batch of it in the same '
        f"group failed ({earlier})",
        session_id=session_id,
    )
    err.__cause__ = earlier
    return err


def header_record(header: dict[str, Any]) -> dict[str, Any]:
    """The on-disk header: ``type: session`` first, the reference's key order,
    ``delegationDepth`` always present (absent -> 0), unknown keys kept last."""
    rec: dict[str, Any] = {"type": "session"}
    for key in _HEADER_ORDER:
        if key == "delegationDepth":
            rec[key] = header.get(key, 0)
        elif key in header:
            rec[key] = header[key]
    for key, value in header.items():
        if key not in rec and key != "type":
            rec[key] = value
    return rec


def header_line(header: dict[str, Any]) -> bytes:
    return orjson.dumps(header_record(header)) + b"\n"


def _neg_zero(v: object) -> bool:
    return type(v) is float and v == 0.0 and math.copysign(1.0, v) < 0


def check_header_record(raw: Any, session_id: str | None) -> dict[str, Any]:
    """Apply the header parse rules (reference §1.2); return it without ``type``.

    Version refusal comes first, before any shape check.
    """
    if type(raw) is dict and (type(raw.get("version")) in (int, float)) and raw["version"] != SESSION_FORMAT_VERSION:
        # The reference interpolates the record's own id as ``String(id)``: ``true``,
        # ``null``, ``1,2``, ``[object Object]``, ``undefined`` when it has none.
        raise format_error(js_string(raw.get("id", ABSENT)), raw["version"])
    sid = session_id or (raw.get("id") if type(raw) is dict else None)
    if (
        type(raw) is not dict
        or raw.get("type") != "session"
        or type(raw.get("version")) is not int
        or type(raw.get("id")) is not str
        or not is_nonneg_safe_int(raw.get("createdAt"))
        or not is_nonneg_safe_int(raw.get("delegationDepth"))
        or ("origin" in raw and raw["origin"] != "subagent")
        or ("agentPreset" in raw and type(raw["agentPreset"]) is not str)
    ):
        raise SessionCorruptionError("corrupt session log: first line is not a session header", session_id=sid)
    # After the shape check, as the reference orders them: a header that is not one
    # is reported as such even when it also carries a retired field.
    if "sandboxMode" in raw or "approvalPolicy" in raw:
        raise SessionCorruptionError("session header uses retired policy baseline fields", session_id=sid)
    out = dict(raw)
    del out["type"]
    return out


def format_error(session_id: str, version: float) -> SessionFormatUnsupportedError:
    v = js_string(version)  # as the reference's String(): 1e+21, not 1000000000000000000000
    if version > SESSION_FORMAT_VERSION:
        return SessionFormatUnsupportedError(
            f'session "{session_id}" uses log format v{v}, but this harness reads only v0: '
            "the log was written by a newer harness — upgrade the harness to open it",
            session_id=session_id,
        )
    return SessionFormatUnsupportedError(
        f'session "{session_id}" uses log format v{v}, older than the supported v0, '
        "and this build ships no upgrade path for it",
        session_id=session_id,
    )
