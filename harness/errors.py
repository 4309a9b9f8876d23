"""The one exception hierarchy of trio-harness.

Every error the library raises on purpose derives from :class:`HarnessError` and
carries a stable :attr:`~HarnessError.code`. Messages match the TypeScript
original's text wherever it has one, so logs of both implementations compare.
Low-level errors (``OSError``, ``sqlite3.Error``) are translated where they cross
the public API, with the original chained as ``__cause__``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar


class HarnessError(Exception):
    """Root of every error raised by trio-harness.

    ``code`` is stable across releases and suitable for programmatic matching;
    ``session_id`` names the session at fault when one is known.
    """

    code: ClassVar[str] = "HARNESS_ERROR"

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.session_id = session_id

    def __str__(self) -> str:
        return self.message


# --- the pure session core -------------------------------------------------------------


class SessionError(HarnessError):
    """A session-core rule refused an input (bad event, bad header, bad surface op)."""

    code = "SESSION_INVALID"


class SessionIdError(SessionError):
    """A session id was refused at the door: not a non-empty string, not valid Unicode
    (a lone surrogate), or too long to name a storage path (see ``docs/limits.md``)."""

    code = "INVALID_SESSION_ID"


class NotJsonError(SessionError):
    """A value is not lossless JSON (see :mod:`harness.session.json`)."""

    code = "NOT_JSON"


class EventError(SessionError):
    """An event envelope, seed or appended event is malformed."""

    code = "INVALID_EVENT"


class SurfaceError(SessionError):
    """A surface operation (append/replace, provenance) broke a surface rule."""

    code = "INVALID_SURFACE"


class HeaderError(SessionError):
    """A session header failed validation."""

    code = "INVALID_HEADER"


class InvariantError(SessionError):
    """A relational invariant (turn/step/tool-call structure) vetoed an append."""

    code = "INVARIANT_VIOLATED"

    PREFIX: ClassVar[str] = 'invariant violated by "@deepseek-ai/dsh-session": '

    def __init__(self, detail: str, *, session_id: str | None = None) -> None:
        super().__init__(self.PREFIX + detail, session_id=session_id)
        self.detail = detail


class StorageRowError(SessionError):
    """A packed chunk storage row is malformed."""

    code = "MALFORMED_STORAGE_ROW"


# --- the store and fork ----------------------------------------------------------------


class StoreError(HarnessError):
    """A store operation was refused."""

    code = "STORE_ERROR"


class SessionNotFoundError(StoreError):
    """No session of that id: not live in the store, or (the subclass
    :class:`PersistedSessionNotFoundError`) not stored either. The one family for
    ``SESSION_NOT_FOUND``: ``except SessionNotFoundError`` catches every kind."""

    code = "SESSION_NOT_FOUND"


class SessionNotLiveError(StoreError):
    code = "SESSION_NOT_LIVE"


class SessionAlreadyExistsError(StoreError):
    code = "SESSION_ALREADY_EXISTS"


class SessionAlreadyAnnouncedError(StoreError):
    code = "SESSION_ALREADY_ANNOUNCED"


class SessionAttachedError(StoreError):
    code = "SESSION_ALREADY_ATTACHED"


class ReentrantAppendError(StoreError):
    code = "REENTRANT_APPEND"


class ForkError(StoreError):
    """Fork refused. ``code`` is one of the reference's fork codes."""

    code = "FORK_ERROR"


class InvalidBoundaryError(ForkError):
    code = "INVALID_BOUNDARY"


class OpenTurnError(ForkError):
    code = "OPEN_TURN"


class ForkSourceNotFoundError(ForkError, SessionNotFoundError):
    code = "SESSION_NOT_FOUND"


class ForkSourceNotLiveError(ForkError, SessionNotLiveError):
    code = "SESSION_NOT_LIVE"


class ForkChildExistsError(ForkError, SessionAlreadyExistsError):
    code = "SESSION_ALREADY_EXISTS"


class SurfaceChangedError(StoreError):
    """A compaction commit found the surface changed since the summary was computed."""

    code = "SURFACE_CHANGED"


class AsyncListenerError(StoreError):
    """An async callable was given where the store calls listeners synchronously
    (``created``, ``event``, ``disposed`` listeners and pre-commit hooks)."""

    code = "ASYNC_LISTENER"


class SessionOwnerClosedError(StoreError):
    """``create`` or ``fork`` named an owner (an :class:`actors.Owner`) that is closed
    or not open: it can own nothing new. ``owner`` is its name, ``reason`` its close
    reason (``None`` if it was never opened); nothing was created."""

    code = "OWNER_CLOSED"

    def __init__(self, message: str, *, session_id: str | None = None, owner: str, reason: object) -> None:
        super().__init__(message, session_id=session_id)
        self.owner = owner
        self.reason = reason


class SessionArgumentError(StoreError):
    """A store operation got the wrong kind of value (e.g. ``enter`` given a
    :class:`~harness.session.Session` instead of its preparation)."""

    code = "INVALID_SESSION_ARGUMENT"


# --- persistence -----------------------------------------------------------------------


class PersistenceError(HarnessError):
    """A persistence backend failed or refused an operation."""

    code = "PERSISTENCE_ERROR"


class PersistedSessionNotFoundError(PersistenceError, SessionNotFoundError):
    """Nothing is stored under that id (a load, a resume, a fork of a stored
    session). Both a :class:`PersistenceError` (where it is raised) and a
    :class:`SessionNotFoundError` (what it means), like :class:`ForkSourceNotFoundError`."""

    code = "SESSION_NOT_FOUND"


class SessionFormatUnsupportedError(PersistenceError):
    """The log was written in a format this build does not read (newer or older).

    ``location``: the path of the session's raw log when the backend keeps one per
    session (the JSONL transcript, which the message names too: `` (raw log: <path>)``),
    else ``None`` (the reference's ``.location``)."""

    code = "SESSION_FORMAT_UNSUPPORTED"

    def __init__(self, message: str, *, session_id: str | None = None, location: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.location = location


class SessionCorruptionError(PersistenceError):
    """A stored log is corrupt (at or before its last committed ``turn/end``)."""

    code = "SESSION_CORRUPT"


class SessionLogExistsError(PersistenceError):
    """A new session would overwrite a log that already exists on disk."""

    code = "SESSION_LOG_EXISTS"


class SessionLockedError(PersistenceError):
    """Another live writer holds the session. ``holder`` describes it."""

    code = "SESSION_LOCKED"

    def __init__(self, message: str, *, session_id: str | None = None, holder: object = None) -> None:
        super().__init__(message, session_id=session_id)
        self.holder = holder


class SessionLiveError(PersistenceError):
    """The session is live in this process: prepare/load of it is refused."""

    code = "SESSION_LIVE"


class FlushError(PersistenceError):
    """A durable write failed; the events are retained and retried by the next flush."""

    code = "FLUSH_FAILED"


class FlushTimeoutError(FlushError):
    """A flush did not finish within its bound (e.g. compaction's closing flush)."""

    code = "FLUSH_TIMEOUT"


class StorageIOError(PersistenceError):
    """An operating-system or database error, translated (the original is the cause)."""

    code = "STORAGE_IO"


class LeaseLostError(SessionLockedError):
    """This writer's lease was taken over (expired, or its holder looked dead): the
    write was refused and nothing of it landed. ``holder`` describes the new holder."""

    code = "LEASE_LOST"


class SessionIdInUseError(SessionLogExistsError, SessionAlreadyExistsError):
    """A new session's id already names a stored session elsewhere under the same
    store root (another project directory). ``path`` is the existing log."""

    code = "SESSION_ALREADY_EXISTS"

    def __init__(self, message: str, *, session_id: str | None = None, path: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.path = path


class PersistenceArgumentError(PersistenceError):
    """A persistence call got an argument it cannot take (metadata or an event batch
    that is not losslessly JSON, a bad ``from_seq``, a bad envelope)."""

    code = "INVALID_ARGUMENT"


class SessionTrackedError(PersistenceError):
    """``create`` of an id this persistence already tracks, prepares or has live."""

    code = "SESSION_ALREADY_EXISTS"


class RawArtifactsUnsupportedError(PersistenceError):
    """The backend keeps no per-session artifact ``read_raw`` could return."""

    code = "RAW_ARTIFACTS_UNSUPPORTED"


class StorageLayoutError(PersistenceError):
    """The root holds a session artifact this backend does not read: the other
    encoding (a root holds one), or the obsolete flat-file layout (reference §1.1)."""

    code = "STORAGE_LAYOUT_UNSUPPORTED"


class ZstdUnavailableError(PersistenceError):
    """``compression="zstd"`` needs the optional ``zstandard`` package, which is missing."""

    code = "ZSTD_UNAVAILABLE"


class SqliteSchemaError(StorageIOError):
    """A file is not a session database this build may use: another application's,
    another schema version (this port's own pre-17 schema included), drifted, or not
    a SQLite database at all. Raised before anything in the file was written.

    ``path``: the file; ``application_id``/``user_version``: what it holds (``None``
    where it could not be read)."""

    code = "SQLITE_SCHEMA_INCOMPATIBLE"

    def __init__(
        self,
        message: str,
        *,
        path: Path,
        application_id: int | None = None,
        user_version: int | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.application_id = application_id
        self.user_version = user_version


class StorageCorruptionError(StorageIOError):
    """A session database (or its lease file) whose pages are damaged: SQLite's own
    consistency check (``PRAGMA quick_check``, or ``integrity_check``: the backend's
    ``check``) found problems when the backend opened it, and the file was refused
    before anything was written to it; or a statement reported corruption
    (``SQLITE_CORRUPT``, "database disk image is malformed") later, and its transaction
    was rolled back (nothing of it acknowledged). A damaged file is never written: restore
    a backup, or salvage what is readable into a new file with the sqlite3 shell's
    ``.dump`` (docs/persistence.md, "A damaged database file": the shell's ``.recover``
    fails on the schema's STRICT tables in sqlite3 3.40.1).

    ``path``: the damaged file; ``findings``: the check's first lines (or SQLite's
    error message for a corruption found by a statement)."""

    code = "STORAGE_CORRUPT"

    def __init__(
        self, message: str, *, path: Path, findings: tuple[str, ...] = (), session_id: str | None = None
    ) -> None:
        super().__init__(message, session_id=session_id)
        self.path = path
        self.findings = findings


class UnsafeStoragePathError(StorageIOError):
    """A storage path the runtime refuses to use (reference §3, the SQLite path checks):
    the database's directory is not a real directory owned by the current user and
    closed to group/world writes, or the database (or its lease file, or a journal
    sidecar ``-wal``/``-shm``/``-journal``) is a symbolic link, not a regular file, or
    owned by someone else or open to group/world access. Raised before SQLite opens
    the file. ``path``: the offending path."""

    code = "STORAGE_PATH_UNSAFE"

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path


class RecordEncodingError(PersistenceError):
    """A buffered event cannot be encoded for storage (e.g. an integer beyond 64 bits)."""

    code = "RECORD_NOT_ENCODABLE"


class WriterWedgedError(FlushError):
    """A durable write overran its time bound: whether it landed is unknown, so the
    writer fails closed (every later flush raises this)."""

    code = "WRITER_WEDGED"


class PreparationDisposedError(PersistenceError):
    """A disposed :class:`SessionPreparation` was published (it no longer holds the lock)."""

    code = "PREPARATION_DISPOSED"


class PersistenceCloseError(PersistenceError):
    """Closing a persistence (``Persistence.aclose``, the exit of ``open_persistence``
    or ``open_runtime``) could not make every session's last events durable. The
    message names every failed session; the events it names are lost.

    ``failures``: session id -> its (first) error, in the order met; ``errors``: every
    error, in order (one id may fail twice, e.g. a retirement and its retry). The
    first error is also the ``__cause__``. A plain exception, not an
    ``ExceptionGroup``: ``except PersistenceError`` and ``code`` keep working."""

    code = "PERSISTENCE_CLOSE_FAILED"

    def __init__(self, message: str, *, failures: dict[str, Exception], errors: tuple[Exception, ...]) -> None:
        super().__init__(message)
        self.failures = failures
        self.errors = errors


# --- the thread bridge (harness.bridge) ------------------------------------------------


class RuntimeThreadError(HarnessError):
    """A :class:`~harness.bridge.RuntimeThread` call was refused: made from the
    runtime's own Trio thread (it would wait for itself), or before the thread started.
    Also raised by an agent's entry points (``AgentHandle.run_turn``/``dispose``,
    ``Agent.send``, ``cancel``, ...) called off the runtime's Trio thread, e.g. awaited
    directly on the asyncio side instead of through ``portal.arun(...)``: refused
    before anything changed (``session_id`` names the agent)."""

    code = "RUNTIME_THREAD"


class RuntimeThreadClosedError(RuntimeThreadError):
    """The runtime thread is closing or closed: a new call is refused, and a call still
    running when the shutdown began was cancelled on the Trio side and ends with this."""

    code = "RUNTIME_THREAD_CLOSED"


# --- compaction ------------------------------------------------------------------------


class CompactionError(HarnessError):
    """A compaction rule refused an input (selection, tool pairing, meter)."""

    code = "COMPACTION_ERROR"


class ToolPairingError(CompactionError):
    """Tool-pairing balance could not be decided: an unknown seq, or a corrupt surface."""

    code = "TOOL_PAIRING"


class MeterSurfaceMismatchError(CompactionError):
    """A token-meter measurement does not describe the session's current surface."""

    code = "METER_SURFACE_MISMATCH"


class CompactionConfigError(CompactionError):
    """A ``BasicCompactionConfig`` record failed validation at load time."""

    code = "COMPACTION_CONFIG_INVALID"


class TargetPressureConfigError(CompactionError):
    """A capacity or config problem specific to one provider/model target.

    ``target_key`` is ``"provider/model"`` (the reference warns once per key).
    """

    code = "TARGET_PRESSURE_CONFIG"

    def __init__(self, target_key: str, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.target_key = target_key


class ToolResultPruneConfigError(CompactionConfigError):
    """A ``ToolResultPruneConfig`` record failed validation (reference §4).

    Messages begin ``ToolResultPruneConfig: ``.
    """

    code = "TOOL_RESULT_PRUNE_CONFIG_INVALID"


class SummaryError(CompactionError):
    """Phase two (the LLM summary) failed before anything was committed (§5.2, §5.3).

    In a manual run every subclass classifies as ``summary`` (§5.4); an automatic
    run re-raises it as is. A provider failure is *not* one of these: it propagates
    as the provider's own :class:`~harness.agent.ProviderError`.
    """

    code = "COMPACTION_SUMMARY"


class SummaryTargetError(SummaryError):
    """No provider/model could be resolved for the summarization call (§5.2)."""

    code = "COMPACTION_NO_SUMMARY_TARGET"


class SummaryTruncatedError(SummaryError):
    """The summary hit its token cap: an incomplete checkpoint is never committed.

    ``code`` is the reference's ``MAX_TOKENS``.
    """

    code = "MAX_TOKENS"


class EmptySummaryError(SummaryError):
    """The summarizer produced no non-blank text."""

    code = "COMPACTION_EMPTY_SUMMARY"


class SummaryContentError(SummaryError):
    """A :class:`~harness.compaction.SummaryOutput` that is not well formed (e.g.
    marked ``llm_stream_call`` without ``raw_output``): a summarizer's bug."""

    code = "COMPACTION_SUMMARY_INVALID"


class UnsupportedSummaryContentError(SummaryError):
    """The summary holds content a checkpoint cannot carry: an image (anywhere, also
    nested in a tool result) or a ``tool-result`` block (reference §5.2)."""

    code = "UNSUPPORTED_CONTENT"


class SummaryCancelledError(SummaryError):
    """The summarizer was cancelled (its caller left); the bracket closed with this as
    its error. A caller that cancelled gets ``trio.Cancelled``, not this."""

    code = "COMPACTION_SUMMARY_CANCELLED"


class SummaryNotSmallerError(SummaryError):
    """The framed checkpoint would not be smaller than what it shadows (§5.3)."""

    code = "COMPACTION_NOT_SMALLER"


class ManualCompactionError(CompactionError):
    """A manual compaction failed; ``kind`` is the reference's class (§5.4).

    The reference has one error with ``.code`` in ``busy``, ``changed``, ``summary``,
    ``commit``, ``persistence`` and ``cancelled``. Here ``kind`` carries that word
    and each kind is a subclass whose stable ``code`` is ``COMPACTION_<KIND>``
    (codes are class-level in this hierarchy, so they can be matched by type too).
    Build one with :meth:`of`. The reference's ``cause`` is ``__cause__``.
    """

    code = "COMPACTION_MANUAL"
    kind: ClassVar[str] = ""

    KINDS: ClassVar[tuple[str, ...]] = ("busy", "changed", "summary", "commit", "persistence", "cancelled")

    @staticmethod
    def of(
        kind: str, message: str, *, cause: BaseException | None = None, session_id: str | None = None
    ) -> ManualCompactionError:
        """The error of ``kind`` (one of :attr:`KINDS`), with ``cause`` chained."""
        try:
            cls = _MANUAL_KINDS[kind]
        except KeyError:
            raise ValueError(f"unknown manual compaction kind {kind!r}") from None
        error = cls(message, session_id=session_id)
        error.__cause__ = cause
        return error


class CompactionBusyError(ManualCompactionError):
    """The compaction lock is live, the session has an open turn, or the agent is not idle.

    Nothing was written. The shared lock check raises this on automatic paths too.
    """

    code = "COMPACTION_BUSY"
    kind = "busy"


class CompactionChangedError(ManualCompactionError):
    """The surface changed before commit (the cause is a :class:`SurfaceChangedError`)."""

    code = "COMPACTION_CHANGED"
    kind = "changed"


class CompactionSummaryFailedError(ManualCompactionError):
    """Any other failure before commit (summarizer, finish, no text, not smaller)."""

    code = "COMPACTION_SUMMARY_FAILED"
    kind = "summary"


class CompactionCommitError(ManualCompactionError):
    """A body append, the success end or the error end failed: the log may be partial."""

    code = "COMPACTION_COMMIT"
    kind = "commit"


class CompactionPersistenceError(ManualCompactionError):
    """The bracket closed in memory, but the durability flush failed."""

    code = "COMPACTION_PERSISTENCE"
    kind = "persistence"


class CompactionCancelledError(ManualCompactionError):
    """The agent's own maintenance signal aborted the run (closed and flushed first)."""

    code = "COMPACTION_CANCELLED"
    kind = "cancelled"


_MANUAL_KINDS: dict[str, type[ManualCompactionError]] = {
    c.kind: c
    for c in (
        CompactionBusyError,
        CompactionChangedError,
        CompactionSummaryFailedError,
        CompactionCommitError,
        CompactionPersistenceError,
        CompactionCancelledError,
    )
}


__all__ = [
    "AsyncListenerError",
    "CompactionBusyError",
    "CompactionCancelledError",
    "CompactionChangedError",
    "CompactionCommitError",
    "CompactionConfigError",
    "CompactionError",
    "CompactionPersistenceError",
    "CompactionSummaryFailedError",
    "EmptySummaryError",
    "SummaryCancelledError",
    "EventError",
    "FlushError",
    "FlushTimeoutError",
    "ForkChildExistsError",
    "ForkError",
    "ForkSourceNotFoundError",
    "ForkSourceNotLiveError",
    "HarnessError",
    "HeaderError",
    "InvalidBoundaryError",
    "InvariantError",
    "LeaseLostError",
    "ManualCompactionError",
    "MeterSurfaceMismatchError",
    "NotJsonError",
    "OpenTurnError",
    "PersistedSessionNotFoundError",
    "PersistenceArgumentError",
    "PersistenceCloseError",
    "PersistenceError",
    "PreparationDisposedError",
    "RawArtifactsUnsupportedError",
    "RecordEncodingError",
    "ReentrantAppendError",
    "RuntimeThreadClosedError",
    "RuntimeThreadError",
    "SessionAlreadyAnnouncedError",
    "SessionAlreadyExistsError",
    "SessionArgumentError",
    "SessionAttachedError",
    "SessionCorruptionError",
    "SessionError",
    "SessionFormatUnsupportedError",
    "SessionIdError",
    "SessionIdInUseError",
    "SessionLiveError",
    "SessionLockedError",
    "SessionLogExistsError",
    "SessionNotFoundError",
    "SessionNotLiveError",
    "SessionOwnerClosedError",
    "SessionTrackedError",
    "SqliteSchemaError",
    "StorageCorruptionError",
    "StorageIOError",
    "StorageLayoutError",
    "StorageRowError",
    "StoreError",
    "SummaryError",
    "SummaryContentError",
    "SummaryNotSmallerError",
    "SummaryTargetError",
    "SummaryTruncatedError",
    "SurfaceChangedError",
    "SurfaceError",
    "TargetPressureConfigError",
    "ToolPairingError",
    "ToolResultPruneConfigError",
    "UnsafeStoragePathError",
    "UnsupportedSummaryContentError",
    "WriterWedgedError",
    "ZstdUnavailableError",
]
