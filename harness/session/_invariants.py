"""The relational invariants (reference §11) as an optional pre-commit validator.

It also carries the compaction companion's rules (compaction reference §1.5) and its
seed-replay rules (§1.4): one bracket ``compaction/start`` → ``compaction/summary`` →
checkpoint ``user/message`` → ``compaction/end`` at a time, on one side of every turn
boundary.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Final

import attrs

from harness.errors import InvariantError
from harness.session._events import END_SEED, SAFE_INT_MAX, Event, ReplaceOp, slot_setter
from harness.session._json import ABSENT, ARRAY, js_string

_TURN_SCOPED = frozenset({"step/end", "assistant/chunk", "assistant/message", "tool/call"})
_TURN_ENCLOSED = frozenset({"todo/write", "request/header", "request/context"})

_START: Final = "compaction/start"
_SUMMARY: Final = "compaction/summary"
_END: Final = "compaction/end"
_CHECKPOINT: Final = "compaction checkpoint"
_BRACKET: Final = frozenset({_START, _SUMMARY, _END})
_TURN_BOUNDARY: Final = frozenset({"turn/start", "turn/end"})
_UNREAD: Final[dict[str, Any]] = {}


@attrs.frozen(slots=True)
class Trace:
    """The per-session state the invariants carry (immutable: batches stay atomic).

    The ``compaction_*`` fields describe the open compaction bracket; ``compaction_id``
    is ``None`` when none is open. ``compaction_source`` is the start's
    ``sourceCommandId`` (``None``: the start had none), ``compaction_owner`` its
    ``turn`` (``None``: a standalone bracket), ``compaction_start`` its seq and
    ``summarized`` whether its ``compaction/summary`` was seen. ``stale_starts`` holds
    the seqs of the seed's orphan starts that a later ``session/end-seed`` proves
    stale (§1.4, set by :meth:`RelationalInvariants.begin_seed`).
    """

    last_seq: int = -1
    open_turn: int | None = None
    open_step: int | None = None
    next_turn: int = 1
    next_step: int = 1
    pending: frozenset[str] = frozenset()
    compaction_id: str | None = None
    compaction_source: str | None = None
    compaction_owner: int | None = None
    compaction_start: int = -1
    summarized: bool = False
    stale_starts: frozenset[int] = frozenset()


def _number(v: object) -> bool:
    return (type(v) is int or type(v) is float) and v is not True and v is not False


def _same(a: object, b: object) -> bool:
    """JavaScript's ``a === b`` over JSON values (objects and arrays: identity)."""
    if _number(a) and _number(b):
        return a == b
    if type(a) is not type(b) or type(a) in (dict, list, tuple):
        return a is b
    return a is b or a == b


def _safe_count(v: object) -> bool:
    """JavaScript's ``Number.isSafeInteger(v) && v >= 0``: a JSON number, so an
    integral float (``3.0``) counts, as in the compaction config loader; a bool does not."""
    if type(v) is float and v.is_integer():
        v = int(v)
    return type(v) is int and 0 <= v <= SAFE_INT_MAX


def _check_id(value: object, label: str) -> None:
    if type(value) is not str or not value:
        raise InvariantError(f"{label} must be a non-empty string")


def _stale_orphans(types: Iterable[object]) -> frozenset[int]:
    """The seqs of ``compaction/start`` events still unmatched when a later
    ``session/end-seed`` comes; the end of the seed counts as one (construction
    appends it unless the seed ends with one)."""
    stale: set[int] = set()
    open_start: int | None = None
    for i, t in enumerate(types):
        if t == _START:
            open_start = i
        elif t == _END:
            open_start = None
        elif t == END_SEED and open_start is not None:
            stale.add(open_start)
            open_start = None
    if open_start is not None:
        stale.add(open_start)
    return frozenset(stale)


_new_object = object.__new__
_TRACE_FIELDS: Final = tuple(f.name for f in attrs.fields(Trace))
_TRACE_COPY: Final = tuple((slot_setter(Trace, n), Trace.__dict__[n].__get__) for n in _TRACE_FIELDS if n != "last_seq")
_set_last_seq: Final = slot_setter(Trace, "last_seq")


def _at_seq(s: Trace, seq: int) -> Trace:
    """``attrs.evolve(s, last_seq=seq)``, the one change every checked event makes,
    without evolve's walk of the class's fields and its keyword ``__init__`` (the
    largest part of a message event's check, decision 0026)."""
    if type(s) is not Trace:
        return attrs.evolve(s, last_seq=seq)  # a subclass's state: its class and fields kept
    t = _new_object(Trace)
    _set_last_seq(t, seq)
    for set_, get in _TRACE_COPY:
        set_(t, get(s))
    return t


#: The event types whose data :meth:`RelationalInvariants.check` reads when the event's
#: surface op is ``append`` or absent (``AppendValidator.reads_data``); a ``user/message``
#: is read only as a replacement (a compaction checkpoint).
_READS_DATA: Final = frozenset({"step/start", "tool/result"}) | _TURN_BOUNDARY | _TURN_SCOPED | _BRACKET


#: The types :meth:`RelationalInvariants.check` does more for than the seq order (and
#: a ``user/message`` replacement): every other type only advances ``last_seq``.
_RULED: Final = _READS_DATA | _TURN_ENCLOSED | {END_SEED}


class RelationalInvariants:
    """Checks turn/step/tool-call structure and compaction brackets before each append commits.

    Use as ``Session.create(..., validator=RelationalInvariants())``. It is replayed
    over seeds too, so a session built from a bad log fails construction.
    """

    #: The event types whose data ``check`` reads (``AppendValidator.reads_data``): an
    #: event of any other type keeps its data as its JSON from the append on.
    reads_data: Final = _READS_DATA

    #: Whether this class's ``_core`` is the base class's. A subclass may add rules by
    #: overriding it (``check`` calls it for every event): then every event is handed
    #: to ``check`` by :meth:`check_batch`, and ``check`` hands it every event's data.
    _base_core: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._base_core = cls._core is RelationalInvariants._core

    def initial(self) -> Trace:
        return Trace()

    def begin_seed(self, state: Trace, types: Iterable[object]) -> Trace:
        """Called by the session before it replays a seed through :meth:`check`, with
        the seed's event types in seq order (``None`` for a malformed record).

        It finds the inherited orphan starts (§1.4): while one of them is the open
        bracket, the turn-boundary checks are skipped, so the crash-repair closers
        (``step/end``, ``turn/end``) before the end-seed that clears it are accepted.
        Live appends are always checked strictly.
        """
        return attrs.evolve(state, stale_starts=_stale_orphans(types))

    def check_batch(self, state: Trace, events: Iterable[Event]) -> Trace:
        """:meth:`check` over ``events`` in turn: the same state after them, the same
        first veto (``AppendValidator.check_batch``). An event of a type no rule but
        the seq order concerns (most of a session's: messages, custom types) costs a
        type test and a seq comparison here, not a new :class:`Trace` each."""
        check = self.check
        if getattr(check, "__func__", None) is not RelationalInvariants.check or not self._base_core:
            # A subclass's (or an instance's) own check, or a subclass's own _core (which
            # check calls for every event): the pass below would skip it for the types
            # no rule of this class concerns.
            for event in events:
                state = check(state, event)
            return state
        s = state
        last = s.last_seq
        for event in events:
            # The seq first, as check does: its veto comes before anything the type
            # test could raise (an Event built directly may carry any type).
            seq = event.seq
            if seq <= last:
                raise InvariantError(f"seq must strictly increase: saw {seq} after {last}")
            t = event.type
            if t in _RULED or (t == "user/message" and isinstance(event.surface_op, ReplaceOp)):
                # Identity, not ==: a NaN seq (never <= anything) lets a later seq equal
                # an earlier one (True after 1), and check keeps the later object.
                if last is not s.last_seq:
                    s = _at_seq(s, last)
                s = check(s, event)
                last = s.last_seq
                continue
            last = seq
        return s if last is s.last_seq else _at_seq(s, last)

    def check(self, state: Trace, event: Event) -> Trace:
        s = state
        seq = event.seq
        if seq <= s.last_seq:
            raise InvariantError(f"seq must strictly increase: saw {seq} after {s.last_seq}")
        t = event.type
        d: dict[str, Any]
        # A user/message replacement may be a compaction checkpoint: its data is read.
        # So is every event's for a subclass's own _core, which may read any type's.
        checkpoint = t == "user/message" and isinstance(event.surface_op, ReplaceOp)
        if checkpoint or t in _READS_DATA or not self._base_core:
            raw = event.raw_data
            d = raw if type(raw) is dict else {}
        else:
            d = _UNREAD  # no rule reads the data of this type: not decoded
        s = _at_seq(s, seq)
        s = self._core(s, event, t, d)
        if t in _BRACKET:
            return self._bracket(s, event, t, d)
        if t in _TURN_BOUNDARY:
            if s.compaction_id is not None and s.compaction_start not in s.stale_starts:
                owner = (
                    "standalone compaction"
                    if s.compaction_owner is None
                    else f"compaction for turn {js_string(s.compaction_owner)}"
                )
                raise InvariantError(f"{t} cannot cross an open {owner}")
            return s
        if t == END_SEED:
            return _closed(s) if s.compaction_id is not None else s
        if checkpoint:
            source = d.get("source")
            if type(source) is dict and source.get("kind") == "plugin" and source.get("plugin") == "compact":
                _check_checkpoint(s, source)
        return s

    def _core(self, s: Trace, event: Event, t: str, d: dict[str, Any]) -> Trace:
        """The session-core rules (session-core reference §11)."""
        if t == "turn/start":
            turn = d.get("turn", ABSENT)
            if s.open_turn is not None:
                raise InvariantError(f"turn/start {js_string(turn)} while turn {js_string(s.open_turn)} is still open")
            if not _same(turn, s.next_turn):
                raise InvariantError(f"turn/start expected turn {s.next_turn}, got {js_string(turn)}")
            return attrs.evolve(s, open_turn=turn, open_step=None, next_step=1, pending=frozenset())
        if t == "turn/end":
            turn = d.get("turn", ABSENT)
            if s.open_turn is None or not _same(turn, s.open_turn):
                raise InvariantError(f"turn/end {js_string(turn)} does not match open turn {js_string(s.open_turn)}")
            if s.open_step is not None:
                raise InvariantError(f"turn/end {js_string(turn)} while step {js_string(s.open_step)} is still open")
            return attrs.evolve(
                s, open_turn=None, open_step=None, next_turn=s.next_turn + 1, pending=frozenset()
            )
        if t == "step/start":
            turn, step = d.get("turn", ABSENT), d.get("step", ABSENT)
            if s.open_turn is None or not _same(turn, s.open_turn):
                raise InvariantError(
                    f"step/start in turn {js_string(turn)} but open turn is {js_string(s.open_turn)}"
                )
            if s.open_step is not None:
                raise InvariantError(f"step/start {js_string(step)} while step {js_string(s.open_step)} is still open")
            if not _same(step, s.next_step):
                raise InvariantError(
                    f"step/start expected step {s.next_step} in turn {js_string(turn)}, got {js_string(step)}"
                )
            return attrs.evolve(s, open_step=step)
        if t in _TURN_SCOPED or (t == "tool/result" and not isinstance(event.surface_op, ReplaceOp)):
            turn, step = d.get("turn", ABSENT), d.get("step", ABSENT)
            if (
                s.open_turn is None
                or s.open_step is None
                or not _same(turn, s.open_turn)
                or not _same(step, s.open_step)
            ):
                raise InvariantError(
                    f"{t} names turn {js_string(turn)}/step {js_string(step)} but open is "
                    f"turn {js_string(s.open_turn)}/step {js_string(s.open_step)}"
                )
            if t == "step/end":
                return attrs.evolve(s, open_step=None, next_step=s.next_step + 1, pending=frozenset())
            if t == "tool/call":
                return attrs.evolve(s, pending=s.pending | {str(d.get("callId"))})
            if t == "tool/result":
                message = d.get("message")
                source = message.get("source") if type(message) is dict else None
                call_id = source.get("callId") if type(source) is dict else None
                error = d.get("error")
                content = message.get("content") if type(message) is dict else None
                block = content[0] if type(content) in ARRAY and content else None
                synthetic = (
                    type(block) is dict
                    and block.get("isError") is True
                    and type(error) is dict
                    and error.get("code") == "TOOL_NOT_STARTED"
                )
                if call_id not in s.pending and not synthetic:
                    raise InvariantError(f"tool/result for {call_id} with no prior tool/call in this step")
                return attrs.evolve(s, pending=s.pending - {call_id})
            return s
        if t == "tool/result":  # a replacement
            if s.open_turn is None:
                raise InvariantError("tool/result surface replacement appended outside any open turn")
            return s
        if t in _TURN_ENCLOSED and s.open_turn is None:
            raise InvariantError(
                f"{t} appended outside any open turn (core execution events must be turn-enclosed)"
            )
        return s

    def _bracket(self, s: Trace, event: Event, t: str, d: dict[str, Any]) -> Trace:
        """``compaction/start``, ``compaction/summary`` and ``compaction/end`` (§1.5)."""
        cid = d.get("compactionId", ABSENT)
        scid = d.get("sourceCommandId", ABSENT)
        _check_id(cid, f"{t} compactionId")
        if scid is not ABSENT:
            _check_id(scid, f"{t} sourceCommandId")
        if t == _START:
            if s.compaction_id is not None:
                owner = (
                    "standalone compaction"
                    if s.compaction_owner is None
                    else f"turn {js_string(s.compaction_owner)}"
                )
                raise InvariantError(f"compaction/start while {owner} is still compacting")
            turn = d.get("turn", ABSENT)
            _check_owner(turn, s.open_turn, t)
            return attrs.evolve(
                s,
                compaction_id=cid,
                compaction_source=None if scid is ABSENT else scid,
                compaction_owner=turn,
                compaction_start=event.seq,
                summarized=False,
            )
        if s.compaction_id is None:
            raise InvariantError(f"{t} has no matching compaction/start")
        if cid != s.compaction_id:
            raise InvariantError(f"{t} id {cid} does not match compaction/start id {s.compaction_id}")
        _check_source(t, scid, s.compaction_source)
        if t == _SUMMARY:
            _check_owner(s.compaction_owner, s.open_turn, t)
            if s.summarized:
                raise InvariantError("compaction/summary repeated within one compaction")
            seqs = d.get("shadowedSeqs")
            if type(seqs) not in ARRAY or not seqs:
                raise InvariantError("compaction/summary shadowedSeqs must be non-empty")
            shadowed = d.get("shadowedRange")
            if (
                type(shadowed) is not dict
                or not _same(seqs[0], shadowed.get("start", ABSENT))
                or not _same(seqs[-1], shadowed.get("end", ABSENT))
            ):
                raise InvariantError("compaction/summary shadowedRange must match the first and last shadowedSeqs")
            if not _safe_count(d.get("shadowedTokenCount")):
                raise InvariantError("compaction/summary shadowedTokenCount must be a non-negative safe integer")
            return attrs.evolve(s, summarized=True)
        turn = d.get("turn", ABSENT)
        if not _same(turn, s.compaction_owner):
            raise InvariantError(
                f"compaction/end owner {js_string(turn)} does not match compaction/start owner {js_string(s.compaction_owner)}"
            )
        _check_owner(s.compaction_owner, s.open_turn, t)
        if "error" not in d and not s.summarized:
            raise InvariantError("successful compaction/end requires one compaction/summary")
        return _closed(s)


def _closed(s: Trace) -> Trace:
    """``s`` with no open compaction bracket."""
    return attrs.evolve(
        s,
        compaction_id=None,
        compaction_source=None,
        compaction_owner=None,
        compaction_start=-1,
        summarized=False,
    )


def _check_owner(owner: object, open_turn: object, t: str) -> None:
    """A standalone (``null``) bracket between turns, a numbered one inside its turn."""
    if owner is None:
        if open_turn is not None:
            raise InvariantError(f"{t} is standalone but turn {js_string(open_turn)} is open")
        return
    if open_turn is None:
        raise InvariantError(f"{t} for turn {js_string(owner)} appended outside any open turn")
    if not _same(owner, open_turn):
        raise InvariantError(f"{t} names turn {js_string(owner)} but open turn is {js_string(open_turn)}")


def _check_source(label: str, value: object, expected: str | None) -> None:
    """The optional ``sourceCommandId`` equals the start's; absent on one side only
    is a mismatch (rendered ``undefined``, as the reference prints it)."""
    if value is ABSENT:
        if expected is None:
            return
    elif value == expected:
        return
    shown = ABSENT if expected is None else expected
    raise InvariantError(
        f"{label} sourceCommandId {js_string(value)} does not match compaction/start sourceCommandId {js_string(shown)}"
    )


def _check_checkpoint(s: Trace, source: dict[str, Any]) -> None:
    """The checkpoint ``user/message`` (a replace with a compact source) names the
    open bracket. A summary before it is not required."""
    cid = source.get("compactionId", ABSENT)
    scid = source.get("sourceCommandId", ABSENT)
    _check_id(cid, f"{_CHECKPOINT} compactionId")
    if scid is not ABSENT:
        _check_id(scid, f"{_CHECKPOINT} sourceCommandId")
    if s.compaction_id is None:
        raise InvariantError(f"{_CHECKPOINT} has no matching compaction/start")
    if cid != s.compaction_id:
        raise InvariantError(f"{_CHECKPOINT} id {cid} does not match compaction/start id {s.compaction_id}")
    _check_source(_CHECKPOINT, scid, s.compaction_source)
