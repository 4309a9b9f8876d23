"""Per-session caches for the meter and the pairing fold, kept outside ``Session``
in a ``WeakKeyDictionary``: an entry lives exactly as long as its session."""

from __future__ import annotations

import weakref
from typing import Any, Final

from harness.session import Session


class PairingState:
    """The tool-pairing fold of one surface (reference §2.2).

    ``after[p]`` is the count of open tool calls after node ``p``; ``positions`` maps
    each folded seq to its position. Valid for ``generation`` and ``len(after)`` nodes.
    """

    __slots__ = ("after", "deltas", "generation", "positions")

    def __init__(self) -> None:
        self.generation = -1  # no fold yet: the first query always builds
        self.after: list[int] = []
        self.positions: dict[int, int] = {}
        self.deltas: dict[int, int] = {}  # seq -> its change to the count (immutable)


class MeterState:
    """What the meter learnt from the log so far, folded forward once per event.

    ``prices`` maps a seq to the price of its derived message (events are immutable,
    so a price never changes). The anchor fields describe the latest
    ``assistant/message``: its seq, the seq of the ``request/header`` in force when
    it was requested, its usage (``None`` when unusable) and the signed surface
    delta since it.
    """

    __slots__ = (
        "anchor_header_seq",
        "anchor_seq",
        "anchor_usage",
        "delta",
        "last_header_seq",
        "node_tokens",
        "nodes",
        "nodes_generation",
        "nodes_tokens",
        "prices",
        "scanned",
        "unpriced",
    )

    def __init__(self) -> None:
        self.prices: dict[int, int] = {}
        self.scanned = 0
        self.last_header_seq = -1
        self.anchor_seq = -1
        self.anchor_header_seq = -1
        self.anchor_usage: int | None = None
        self.delta = 0
        self.unpriced = False
        # The priced surface (``NodeTokens`` per node) for ``nodes_generation``: appends
        # extend it, a replace rebuilds it from the cached prices.
        self.nodes: tuple[Any, ...] = ()
        self.node_tokens: dict[int, Any] = {}  # seq -> its NodeTokens (immutable)
        self.nodes_generation = -1
        self.nodes_tokens = 0


class SessionCache:
    __slots__ = ("meter", "pairing")

    def __init__(self) -> None:
        self.pairing = PairingState()
        self.meter = MeterState()


_ENTRIES: Final[weakref.WeakKeyDictionary[Session, SessionCache]] = weakref.WeakKeyDictionary()


def cache_for(session: Session) -> SessionCache:
    """The cache of ``session``, created on first use."""
    cache = _ENTRIES.get(session)
    if cache is None:
        cache = _ENTRIES[session] = SessionCache()
    return cache


def cached_session_count() -> int:
    """How many sessions have a live cache entry (for tests and diagnostics)."""
    return len(_ENTRIES)
