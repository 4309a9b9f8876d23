"""Where a session keeps its events: by column, not as one object per event.

An :class:`Event` object per log entry costs an object the cyclic collector visits on
every pass that reaches it, forever (a slotted instance is never untracked), and it
costs that for every event of every live session. On a freshly restored 100k-event
log the first such pass was the largest cost after decoding, and in a long append
run the collector's full passes over the growing log took ~40% of the time
(decision 0006). So a log is kept by column: types (interned), times (a machine-int
array the collector never visits), the data trees, and a one-byte kind for the
surface op. Events with rarer metadata (a replace op, ``sourceEventSeqs``,
``ignorable``) are also kept whole beside the columns. An :class:`Event` is
materialised when read; it is equal to, not identical with, the event that was
appended, and shares its data tree (or its data's bytes).

Columns are append-only, so any prefix of them is immutable: a fork shares its
parent's columns up to the boundary instead of copying them.

A data entry is either the raw tree; or, for an event restored from a JSON line, that
line's ``bytes`` (decision 0010); or, for an appended event, the compact JSON of its
data (decision 0023, marked ``ENCODED`` in its kind). A tree is decoded from the bytes
whenever the event is read. ``bytes`` is never a JSON value, so a tree and bytes cannot
be confused. An event read from an ``ENCODED`` entry keeps the bytes and decodes them
when its ``data`` is read.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from itertools import compress, islice
from typing import Final, overload

import orjson

from harness.session._events import APPEND, KNOWN_EVENT_TYPES, Event, SurfaceOp, plain_event
from harness.session._json import RawJson

NO_OP: Final = 0
APPEND_OP: Final = 1
WHOLE: Final = 2
"""Kinds: no surface op, a plain ``"append"``, or an event kept whole in ``whole``."""
ENCODED: Final = 4
"""Added to ``NO_OP`` or ``APPEND_OP``: the data entry is the data's own JSON, as an
append keeps it (decision 0023), not a restored record line."""

_loads: Final = orjson.loads

INTERNED: Final[dict[str, str]] = {t: t for t in KNOWN_EVENT_TYPES}
"""Known types map to one shared string each (a decoded log has a fresh one per event)."""


class Columns:
    """Events ``0..len-1`` by column. Append-only: entries are never changed once
    written, which is what makes sharing a prefix safe."""

    __slots__ = ("datas", "kinds", "times", "types", "whole")

    def __init__(self) -> None:
        self.types: list[str] = []
        self.times = array("q")
        # A raw tree, a restored record line, or appended data's JSON (see the module doc).
        self.datas: list[RawJson | bytes] = []
        self.kinds = bytearray()
        self.whole: dict[int, Event] = {}

    def __len__(self) -> int:
        return len(self.types)

    def push(self, event: Event) -> None:
        """Add ``event`` in the cheapest form (its index is ``len(self)``)."""
        t = event.type
        op = event.surface_op
        data = event._data
        if event.source_event_seqs is None and not event.ignorable and (op is None or op == APPEND):
            kind = NO_OP if op is None else APPEND_OP
            if type(data) is bytes:
                kind |= ENCODED
        else:
            kind = WHOLE
            self.whole[len(self.types)] = event
        self.types.append(INTERNED.get(t, t))
        self.times.append(event.time)
        self.datas.append(data)
        self.kinds.append(kind)

    def event(self, i: int, seq: int) -> Event:
        kind = self.kinds[i]
        if kind == WHOLE:
            return self.whole[i]
        data = self.datas[i]
        if type(data) is bytes and not kind & ENCODED:
            data = _loads(data)["data"]
        return plain_event(self.types[i], seq, self.times[i], data, APPEND if kind & APPEND_OP else None)

    def data_at(self, i: int) -> RawJson:
        data = self.datas[i]
        if type(data) is not bytes:
            return data
        # Only the plain kinds hold restored lines; an event kept whole holds its own data.
        return _loads(data)["data"] if self.kinds[i] < WHOLE else _loads(data)

    def copy_prefix(self, n: int) -> Columns:
        out = Columns()
        out.types = self.types[:n]
        out.times = self.times[:n]
        out.datas = self.datas[:n]
        out.kinds = self.kinds[:n]
        out.whole = {i: e for i, e in self.whole.items() if i < n}
        return out


class Log(Sequence[Event]):
    """The seq-indexed events of one session: a shared, read-only prefix of another
    log's columns (``[0, k)``, possibly empty), then columns of its own.

    Owned by one :class:`~harness.session.Session`. Reading by index, slice or
    iteration materialises events; :meth:`type_at` and :meth:`data_at` read without
    materialising.
    """

    __slots__ = ("_base", "_k", "_own")

    def __init__(self, base: Columns | None = None, k: int = 0, own: Columns | None = None) -> None:
        self._base = base if base is not None else Columns()
        self._k = k
        self._own = own if own is not None else Columns()

    @property
    def own(self) -> Columns:
        """The columns new events are appended to (for bulk construction)."""
        return self._own

    def __len__(self) -> int:
        return self._k + len(self._own.types)

    def append(self, event: Event) -> None:
        self._own.push(event)

    def extend(self, events: Sequence[Event]) -> None:
        push = self._own.push
        for ev in events:
            push(ev)

    @overload
    def __getitem__(self, i: int) -> Event: ...
    @overload
    def __getitem__(self, i: slice) -> list[Event]: ...
    def __getitem__(self, i: int | slice) -> Event | list[Event]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        k = self._k
        n = k + len(self._own.types)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("log index out of range")
        return self._base.event(i, i) if i < k else self._own.event(i - k, i)

    def __iter__(self) -> Iterator[Event]:
        k = self._k
        base, own = self._base, self._own
        for i in range(k):
            yield base.event(i, i)
        i = 0
        while i < len(own.types):  # the log may grow while it is iterated
            yield own.event(i, k + i)
            i += 1

    def type_at(self, i: int) -> str:
        k = self._k
        return self._base.types[i] if i < k else self._own.types[i - k]

    def data_at(self, i: int) -> RawJson:
        """The raw (private) data tree of event ``i``: read it, never mutate it. An
        encoded entry is decoded afresh on every call (callers that read one event
        often keep what they derive from it)."""
        k = self._k
        return self._base.data_at(i) if i < k else self._own.data_at(i - k)

    def seqs_of_type(self, type_: str) -> list[int]:
        """The seqs of the events of type ``type_``, in order, without materialising
        any event (a scan of the type column; e.g. a resume folding one record type)."""
        k = self._k
        own = self._own.types
        # compress/map keep the scan in C: ~4x faster than a comprehension on 100k.
        out = list(compress(range(k), map(type_.__eq__, islice(self._base.types, k))))
        out.extend(compress(range(k, k + len(own)), map(type_.__eq__, own)))
        return out

    def seqs_outside(self, types: frozenset[str]) -> list[int]:
        """The seqs of the events whose type is not in ``types``, in order, without
        materialising any event (a scan of the type column)."""
        k = self._k
        if types.issuperset(islice(self._base.types, k)) and types.issuperset(self._own.types):
            return []  # the common case, at C speed (~2 ms for 100k events)
        out = [i for i, t in enumerate(islice(self._base.types, k)) if t not in types]
        out.extend(k + i for i, t in enumerate(self._own.types) if t not in types)
        return out

    def surface_ops(self) -> Iterator[tuple[int, SurfaceOp]]:
        """``(seq, op)`` of every event that carries a surface op, in order."""
        offset = 0
        for cols, n in ((self._base, self._k), (self._own, len(self._own))):
            kinds, whole = cols.kinds, cols.whole
            for i in range(n):
                kind = kinds[i] & ~ENCODED
                if kind == APPEND_OP:
                    yield offset + i, APPEND
                elif kind == WHOLE:
                    op = whole[i].surface_op
                    if op is not None:
                        yield offset + i, op
            offset += n

    def prefix(self, n: int) -> Log:
        """A new log holding events ``0..n-1``, sharing what it can: O(1) when the
        prefix lies in one column set, else a copy of this log's own part of it."""
        k = self._k
        if n <= k:
            return Log(self._base, n)
        if k == 0:
            return Log(self._own, n)
        return Log(self._base, k, self._own.copy_prefix(n - k))
