"""Projection of surface events to model messages (reference §5), and O(1) views."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any, Generic, TypeVar, overload

from harness.session._events import ASSISTANT_MESSAGE, TOOL_RESULT, USER_MESSAGE, Event
from harness.session._json import ARRAY, FrozenDict, RawJson
from harness.session._log import Log

T = TypeVar("T")


def derive_event_message(event: Event) -> FrozenDict | None:
    """The model message an event contributes, or ``None`` (pure; ignores surfaceOp).

    ``user/message`` -> its data; ``assistant/message`` -> ``data.message`` unless its
    content is empty; ``tool/result`` -> ``data.message``; anything else -> ``None``.
    The result shares the event's frozen tree.
    """
    return _project(event.type, event.raw_data)


def _project(t: str, data: RawJson) -> FrozenDict | None:
    # Over the raw tree: a view is made only for the message returned.
    if type(data) is not dict:
        return None
    if t == USER_MESSAGE:
        return FrozenDict._wrap(data)
    if t in (ASSISTANT_MESSAGE, TOOL_RESULT):
        message = data.get("message")
        if type(message) is not dict:
            return None
        if t == ASSISTANT_MESSAGE:
            content = message.get("content")
            if type(content) in ARRAY and not content:
                return None
        return FrozenDict._wrap(message)
    return None


class SnapshotView(Sequence[T], Generic[T]):
    """An immutable prefix view of an append-only sequence: O(1) to create, never grows.

    The owner only ever appends to the backing sequence (it starts a new list when it
    must rewrite), so the first ``len`` items a view covers never change.
    """

    __slots__ = ("_items", "_n")

    def __init__(self, items: Sequence[T], n: int) -> None:
        self._items = items
        self._n = n

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[T, ...]: ...
    def __getitem__(self, i: int | slice) -> T | tuple[T, ...]:
        n = self._n
        if isinstance(i, slice):
            start, stop, step = i.indices(n)  # clamp to the view, then one copy
            return tuple(self._items[start:stop:step])
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("view index out of range")
        return self._items[i]

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[T]:
        # islice bounds the walk: the backing list may grow while a view is iterated.
        return islice(self._items, self._n)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SnapshotView):
            return self._n == other._n and all(a == b for a, b in zip(self, other, strict=True))
        if isinstance(other, (list, tuple)):
            return self._n == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class MessageList(SnapshotView[FrozenDict]):
    """The model-visible messages at the moment of a ``derive_messages()`` call."""

    __slots__ = ()


class EventLog(SnapshotView[Event]):
    """The session's events at the moment of reading ``session.events``."""

    __slots__ = ()

    def seqs_of_type(self, type_: str) -> list[int]:
        """The seqs of this view's events of type ``type_``, without materialising the
        others (O(n) over the type column, not O(n) events built)."""
        items, n = self._items, self._n
        if isinstance(items, Log):
            seqs = items.seqs_of_type(type_)
            return seqs if not seqs or seqs[-1] < n else [s for s in seqs if s < n]
        return [i for i, e in enumerate(self) if e.type == type_]

    def seqs_outside(self, types: frozenset[str]) -> list[int]:
        """The seqs of this view's events whose type is not in ``types``, without
        materialising the others (e.g. a seed checked for unknown types)."""
        items, n = self._items, self._n
        if isinstance(items, Log):
            seqs = items.seqs_outside(types)
            return seqs if not seqs or seqs[-1] < n else [s for s in seqs if s < n]
        return [i for i, e in enumerate(self) if e.type not in types]


_UNPROJECTED: Any = object()


class DeriveCache:
    """The generation-keyed incremental projection of reference §5.

    Each event is projected at most once (``_proj`` is indexed by seq); a replace
    (a new generation) restarts from node 0 into a *new* list so held results stay
    valid, and the restart costs one cached lookup per node.

    ``read`` turns true at the first projection: from then on the session's surface
    events are appended as trees, since each will be projected (decision 0023).
    """

    __slots__ = ("_consumed", "_generation", "_messages", "_proj", "read")

    def __init__(self) -> None:
        self._messages: list[FrozenDict] = []
        self._consumed = 0
        self._generation = 0
        self._proj: list[Any] = []
        self.read = False

    def project(self, seq: int, events: Log) -> FrozenDict | None:
        """The derived message of event ``seq`` (``None``: it derives to nothing),
        memoised with the projections :meth:`derive` makes."""
        self.read = True
        proj = self._proj
        if seq >= len(proj):
            proj.extend([_UNPROJECTED] * (len(events) - len(proj)))
        m = proj[seq]
        if m is _UNPROJECTED:
            m = proj[seq] = _project(events.type_at(seq), events.data_at(seq))
        return m  # type: ignore[no-any-return]

    def derive(self, nodes: list[int], generation: int, events: Log) -> MessageList:
        self.read = True
        if generation != self._generation:
            self._messages = []
            self._consumed = 0
            self._generation = generation
        consumed = self._consumed
        if consumed < len(nodes):
            proj = self._proj
            if len(proj) < len(events):
                proj.extend([_UNPROJECTED] * (len(events) - len(proj)))
            out = self._messages
            type_at, data_at = events.type_at, events.data_at
            for seq in nodes[consumed:] if consumed else nodes:
                m = proj[seq]
                if m is _UNPROJECTED:
                    m = proj[seq] = _project(type_at(seq), data_at(seq))
                if m is not None:
                    out.append(m)
            self._consumed = len(nodes)
        return MessageList(self._messages, len(self._messages))
