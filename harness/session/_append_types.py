"""The caller's side of appending: drafts, the validator protocol and the clock.

Below every module that plans, commits or constructs: they all speak these types.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from harness.session._events import Event

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


class AppendValidator(Protocol):
    """A pre-commit veto over appended events (e.g. the relational invariants, §11).

    ``check`` is pure: it returns the validator's next state and raises
    :class:`~harness.errors.SessionError` to veto. The session threads the state
    through a batch and keeps it only if the whole batch commits.

    Optional: ``begin_seed(state, types) -> state``, called before a seed replay
    with the seed's event types in seq order (a seeded session always ends with a
    ``session/end-seed``).
    """

    def initial(self) -> Any: ...

    def check(self, state: Any, event: Event) -> Any: ...
