"""``measure(session)``: what the next request will cost, in tokens (reference §0).

Two estimates exist. The *heuristic* prices the request header and every surface
node with :mod:`harness.compaction._meter`. The *anchored* one starts from what the
provider actually reported for the latest model call and adds what changed on the
surface since. The anchored total is used only when it can be trusted (see
:func:`measure`); otherwise the heuristic is the total.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from harness.compaction._cache import MeterState, cache_for
from harness.compaction._meter import estimate_header, estimate_message, raw
from harness.compaction._pairing import delta_of
from harness.session import (
    SURFACE_TYPES,
    Event,
    ReplaceOp,
    Session,
    canonical_header,
    derive_event_message,
    header_equals,
    raw_of,
)


@attrs.frozen(slots=True)
class NodeTokens:
    """One surface node and the price of its derived message."""

    seq: int
    tokens: int


@attrs.frozen(slots=True)
class Measurement:
    """A snapshot of a session's token pressure.

    ``nodes`` follow surface order. ``total_tokens`` is what the next request is
    estimated to cost; ``surface_tokens`` is the heuristic sum over ``nodes``;
    ``header_tokens`` prices the header measured against. ``anchor_seq`` is the
    ``assistant/message`` whose provider usage anchored the total, or ``None`` when
    the total is the heuristic ``header_tokens + surface_tokens``. ``generation`` is
    the replace generation the nodes were read under.
    """

    total_tokens: int
    surface_tokens: int
    header_tokens: int
    nodes: tuple[NodeTokens, ...]
    generation: int
    anchor_seq: int | None


class _Latest:
    """The default of ``measure(header=...)``: the session's latest request header."""

    def __repr__(self) -> str:
        return "LATEST_HEADER"


LATEST_HEADER: Final = _Latest()

_PRICED_BY: Final = frozenset({"compaction/summary", "compaction/prune"})


def _price(session: Session, meter: MeterState, seq: int, event: Event | None = None) -> int:
    price = meter.prices.get(seq)
    if price is None:
        message = derive_event_message(event) if event is not None else session.derive_message(seq)
        # derive gives None for an empty-content assistant message: it costs 0.
        price = meter.prices[seq] = 0 if message is None else estimate_message(message)
    return price


def priced_surface(session: Session, meter: MeterState) -> tuple[tuple[NodeTokens, ...], int]:
    """The surface as ``NodeTokens`` and their sum, cached per replace generation: in
    one generation the surface only grows at its end, so only new nodes are priced."""
    surface = session.surface
    generation = session.generation
    if meter.nodes_generation != generation or len(meter.nodes) > len(surface):
        meter.nodes, meter.nodes_tokens, meter.nodes_generation = (), 0, generation
    k = len(meter.nodes)
    if k < len(surface):
        made = meter.node_tokens

        def node(seq: int) -> NodeTokens:
            n = made.get(seq)
            if n is None:
                n = made[seq] = NodeTokens(seq, _price(session, meter, seq))
            return n

        new = tuple(map(node, surface[k:]))
        meter.nodes = meter.nodes + new if k else new
        meter.nodes_tokens += sum(n.tokens for n in new)
    return meter.nodes, meter.nodes_tokens


def span_tokens(session: Session, seqs: Sequence[int]) -> tuple[NodeTokens, ...]:
    """``NodeTokens`` for ``seqs`` only (prices are cached per event)."""
    meter = cache_for(session).meter
    return tuple(NodeTokens(seq, _price(session, meter, seq)) for seq in seqs)


def _usage(event: Event) -> int | None:
    """``inputTokens + outputTokens`` of an assistant message, or ``None``."""
    data = raw_of(event.data)
    usage = data.get("usage") if type(data) is dict else None
    if type(usage) is not dict:
        return None
    total = 0
    for key in ("inputTokens", "outputTokens"):
        value = usage.get(key)
        if type(value) is not int or value < 0:
            return None
        total += value
    return total


def _shadow_price(session: Session, event: Event, op: ReplaceOp) -> int | None:
    """The price of the range ``event`` replaced, from the event just before it.

    Reference §1.1, "shadow-price adjacency": a ``compaction/summary`` or
    ``compaction/prune`` immediately before a replace prices the range it replaces.
    ``None`` when there is no such event, or it describes another range.
    """
    if event.seq == 0:
        return None
    before = session.event(event.seq - 1)
    if before.type not in _PRICED_BY:
        return None
    data = raw_of(before.data)
    if type(data) is not dict:
        return None
    shadowed = data.get("shadowedRange")
    count = data.get("shadowedTokenCount")
    if (
        type(shadowed) is not dict
        or shadowed.get("start") != op.start
        or shadowed.get("end") != op.end
        or type(count) is not int
        or count < 0
    ):
        return None
    return count


def _scan(session: Session, meter: MeterState) -> None:
    """Fold the events appended since the last scan into ``meter`` (each read once)."""
    type_at = session.type_at
    deltas = cache_for(session).pairing.deltas
    for seq in range(meter.scanned, session.seq):
        t = type_at(seq)  # most events are log-only: no Event is built for them
        if t == "request/header":
            meter.last_header_seq = seq
            continue
        if t not in SURFACE_TYPES:
            continue
        event = session.event(seq)
        # The pairing fold's per-node delta, while the event is at hand.
        deltas[seq] = delta_of(t, raw_of(event.data))
        op = event.surface_op
        if t == "assistant/message":
            meter.anchor_seq = seq
            meter.anchor_header_seq = meter.last_header_seq
            # A replacing assistant message rewrote the very request its usage
            # counted, so that usage describes no surface that ever existed.
            meter.anchor_usage = None if isinstance(op, ReplaceOp) else _usage(event)
            meter.delta = 0
            meter.unpriced = False
            continue
        if meter.anchor_seq < 0:
            continue
        meter.delta += _price(session, meter, seq, event)
        if isinstance(op, ReplaceOp):
            shadow = _shadow_price(session, event, op)
            if shadow is None:
                meter.unpriced = True
            else:
                meter.delta -= shadow
    meter.scanned = session.seq


def measure(session: Session, *, header: object = LATEST_HEADER) -> Measurement:
    """Measure ``session`` against a request header (reference §0).

    ``header`` is the request header the next call will send; by default the
    session's latest logged one (``session.request_header()``). ``None`` means no
    header (it prices 0 and never matches a call's header).

    The total is ``header + surface`` (heuristic) unless all of these hold, in which
    case it is ``max(0, usage + delta)``:

    * the latest ``assistant/message`` in the log carries ``usage`` with
      non-negative integer ``inputTokens`` and ``outputTokens`` (``usage`` is their
      sum: the request plus the reply, i.e. the surface up to and including that
      message) and is an append, not a replace;
    * *that call's header*, the latest ``request/header`` logged before that
      message (the agent logs the header of a request just before making it),
      equals the current header under ``header_equals``;
    * every surface replace since that message is priced by the event just before
      it (shadow-price adjacency, reference §1.1), so the signed delta is known:
      ``delta`` = the price of each surface event since, minus each replaced range's
      recorded ``shadowedTokenCount``;
    * ``usage`` is at least the heuristic price of the same span, i.e.
      ``usage >= header + surface - delta``. (So the anchored total is never below
      the heuristic one, and the ``max(0, …)`` of the reference cannot bind.)
    """
    cache = cache_for(session)
    meter = cache.meter
    if header is LATEST_HEADER:
        current = session.request_header()
    else:
        current = None if header is None else canonical_header(raw(header))
    header_tokens = 0 if current is None else estimate_header(current)
    nodes, surface_tokens = priced_surface(session, meter)
    heuristic = header_tokens + surface_tokens
    _scan(session, meter)
    total, anchor = heuristic, None
    usage = meter.anchor_usage
    if (
        usage is not None
        and current is not None
        and meter.anchor_header_seq >= 0
        and not meter.unpriced
        and usage >= heuristic - meter.delta
    ):
        data = raw_of(session.event(meter.anchor_header_seq).data)
        call_header = canonical_header(data.get("header") if type(data) is dict else None)
        if header_equals(call_header, current):
            total, anchor = max(0, usage + meter.delta), meter.anchor_seq
    return Measurement(total, surface_tokens, header_tokens, nodes, session.generation, anchor)
