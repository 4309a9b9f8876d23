"""The caller's side of appending: drafts, the validator protocol and the clock.

Below every module that plans, commits or constructs: they all speak these types.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable
from typing import Any, Final, Protocol

import attrs

from harness.session._events import Event, slot_setter

Clock = Callable[[], int]
"""Returns wall-clock time in integer milliseconds."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@attrs.frozen(slots=True)
class EventDraft:
    """An event to append: the session assigns ``seq`` and ``time``.

    ``surface_op`` is ``"append"``, a :class:`ReplaceOp`, a raw
    ``{"op": "replace", "start", "end"}`` dict, or ``None`` (absent).
    ``ignorable=True`` logs the envelope's ``ignorable: true``: a reader that does not
    know the type skips the event instead of refusing the log (how an extension, e.g.
    :mod:`harness.bridge`'s SDK items, stores a type of its own).
    """

    type: str
    data: object
    surface_op: object = None
    source_event_seqs: object = None
    ignorable: bool = False


_new_draft = object.__new__
_set_dtype, _set_ddata, _set_dop, _set_dsrc, _set_dignorable = (
    slot_setter(EventDraft, n) for n in ("type", "data", "surface_op", "source_event_seqs", "ignorable")
)


def log_only_draft(type_: str, data: object, ignorable: bool = False) -> EventDraft:
    """``EventDraft(type_, data, ignorable=ignorable)`` for a caller that builds many
    (an extension logging a batch of its own events, e.g. the SDK sessions' items),
    without attrs' frozen ``__init__`` (one ``object.__setattr__`` per field; the
    slots' setters cost about a third less, decision 0022). The same object; nothing
    is validated here, as with the constructor (the append validates the draft)."""
    d = _new_draft(EventDraft)
    _set_dtype(d, type_)
    _set_ddata(d, data)
    _set_dop(d, None)
    _set_dsrc(d, None)
    _set_dignorable(d, ignorable)
    return d


class AppendValidator(Protocol):
    """A pre-commit veto over appended events (e.g. the relational invariants, §11).

    ``check`` is pure: it returns the validator's next state and raises
    :class:`~harness.errors.SessionError` to veto. The session threads the state
    through a batch and keeps it only if the whole batch commits.

    Optional: ``begin_seed(state, types) -> state``, called before a seed replay
    with the seed's event types in seq order (a seeded session always ends with a
    ``session/end-seed``).

    Optional: ``reads_data``, a set of event types: the types whose *data* ``check``
    reads (``event.raw_data``, ``event.data``) when the event's surface op is
    ``append`` or absent. Events of every other type then keep their data as its
    encoded JSON from the append on (decision 0023), which costs a fraction of the
    validating copy; ``check`` still sees their type, seq and surface op. Without it,
    the validator is taken to read the data of every type. A type left out that
    ``check`` does read is still correct (the data is decoded on each read), only
    slower.

    Optional: ``check_batch(state, events) -> state``, exactly ``check`` over
    ``events`` in turn (the same resulting state, the same first veto), for a
    validator that can check a run of events for less than one ``check`` each: the
    store's installed validators and the replays call it where it exists.
    """

    def initial(self) -> Any: ...

    def check(self, state: Any, event: Event) -> Any: ...


class _EveryType:
    """The container of every event type (a validator that declares no ``reads_data``)."""

    __slots__ = ()

    def __contains__(self, item: object) -> bool:
        return True

    def __repr__(self) -> str:
        return "EVERY_TYPE"


EVERY_TYPE: Final[Container[str]] = _EveryType()
NO_TYPE: Final[Container[str]] = frozenset()


def data_read_by(validator: object) -> Container[str]:
    """The event types whose data ``validator`` reads (see :class:`AppendValidator`):
    its ``reads_data`` as a frozenset, :data:`EVERY_TYPE` when it declares none (or
    declares something that is not a collection of strings), :data:`NO_TYPE` for no
    validator."""
    if validator is None:
        return NO_TYPE
    reads = getattr(validator, "reads_data", None)
    if reads is None or isinstance(reads, str):
        return EVERY_TYPE
    try:
        types = frozenset(reads)
    except TypeError:
        return EVERY_TYPE
    if not all(type(t) is str for t in types):
        return EVERY_TYPE
    return types


def data_read_by_all(reads: Iterable[Container[str]]) -> Container[str]:
    """The union of several :func:`data_read_by` answers."""
    union: set[str] = set()
    for r in reads:
        if r is EVERY_TYPE or not isinstance(r, frozenset):
            return EVERY_TYPE
        union |= r
    return frozenset(union)


def check_all(validator: AppendValidator, state: Any, events: Iterable[Event]) -> Any:
    """``validator``'s state after ``events`` from ``state``: its ``check_batch`` where
    it has one, else ``check`` on each event in turn."""
    batch = getattr(validator, "check_batch", None)
    if batch is not None:
        return batch(state, events)
    check = validator.check
    for ev in events:
        state = check(state, ev)
    return state
