"""What a session holds: the fields every session module reads, and their bookkeeping.

:class:`SessionState` is the slotted base of :class:`~harness.session.Session`. The
modules that plan, commit, construct and fork a session work on it, so none of them
needs the :class:`Session` class (which imports them all).
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any, Final

from harness.session._append_types import NO_TYPE, AppendValidator, Clock, wall_clock_ms
from harness.session._derive import DeriveCache, EventLog
from harness.session._events import END_SEED
from harness.session._header import SessionHeader
from harness.session._log import Log
from harness.session._surface import SurfaceState

PRIVATE: Final = object()
"""The token only the session's own constructors pass."""

BRACKET: Final = frozenset({"compaction/start", "compaction/end"})
NOTED: Final = frozenset(
    {"request/header", "request/context", "turn/start", "turn/end", END_SEED, *BRACKET}
)
"""The types whose latest seq (or, for turns, every seq) the session keeps."""

NO_TURN: Final[Any] = object()
"""Returned by :meth:`Session.open_turn_at` when no turn is open."""


class SessionState:
    """The fields of one session. Single owner, not thread-safe (see ``Session``)."""

    __slots__ = (
        # Layers above (compaction's meter and pairing caches) key per-session state
        # by a weak reference, so it dies with the session.
        "__weakref__",
        "_clock",
        "_derive",
        "_events",
        "_events_view",
        "_first_live_seq",
        "_header",
        "_hooked",
        "_last_bracket",
        "_last_context",
        "_last_end_seed",
        "_last_header",
        "_reads",
        "_sid",
        "_surface",
        "_turn_marks",
        "_validator",
        "_vstate",
    )

    def __init__(self, *, _token: object = None) -> None:
        if _token is not PRIVATE:
            raise TypeError("use Session.create() or Session.restore()")
        self._events = Log()
        self._events_view: EventLog | None = None
        self._surface = SurfaceState()
        self._derive = DeriveCache()
        self._first_live_seq = 0
        self._clock: Clock = wall_clock_ms
        self._validator: AppendValidator | None = None
        self._vstate: Any = None
        # The event types whose data a validator reads (data_read_by): the planned
        # events of those types keep trees (decision 0023). ``_reads``: the session's
        # own validator's (set with it); ``_hooked``: the store's installed ones' (set
        # by the session actor before each plan).
        self._reads: Container[str] = NO_TYPE
        self._hooked: Container[str] = NO_TYPE
        self._last_header = -1
        self._last_context = -1
        self._turn_marks: list[int] = []  # seqs of turn/start and turn/end, ascending
        # Seq of the latest compaction/start or compaction/end, and of the newest
        # session/end-seed (-1: none): the compaction lock is O(1) to check.
        self._last_bracket = -1
        self._last_end_seed = -1
        self._sid = ""
        self._header: SessionHeader

    @property
    def id(self) -> str:
        return self._header.id

    def _note_type(self, t: str, seq: int) -> None:
        """Keep the seq of an event of a type in :data:`NOTED`."""
        if t == "request/header":
            self._last_header = seq
        elif t == "request/context":
            self._last_context = seq
        elif t == END_SEED:
            self._last_end_seed = seq
        elif t in BRACKET:
            self._last_bracket = seq
        else:
            self._turn_marks.append(seq)
