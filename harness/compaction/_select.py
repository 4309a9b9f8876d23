"""Head-anchored region selection (reference §2.1)."""

from __future__ import annotations

import attrs

from harness.compaction._measure import Measurement
from harness.compaction._pairing import tool_pairing_balanced_before
from harness.errors import MeterSurfaceMismatchError
from harness.session import Session


@attrs.frozen(slots=True)
class CompactableRange:
    """An inclusive span of surface nodes, by seq, from the surface's head."""

    start: int
    end: int


def select_compactable_range(
    session: Session, measurement: Measurement, retain_tokens: int
) -> CompactableRange | None:
    """The oldest span to compact so that about ``retain_tokens`` stay, or ``None``.

    Walks from the newest node toward the head, summing tokens, and keeps every node
    from the first index where the sum reaches ``retain_tokens`` (so the newest node
    is always kept, even with 0). The cut is then moved toward the head until it is
    tool-pairing balanced, so a call is never separated from its result. ``None``
    when there is nothing before the kept part: no nodes, a single node, a retention
    that covers the whole surface, or no balanced cut (e.g. the whole surface is
    one open tool unit).

    Raises :class:`~harness.errors.MeterSurfaceMismatchError` when ``measurement``
    was taken over another surface than the session's current one.
    """
    nodes = measurement.nodes
    if not nodes:
        return None
    surface = session.surface
    if len(nodes) != len(surface) or any(n.seq != s for n, s in zip(nodes, surface, strict=True)):
        raise MeterSurfaceMismatchError(
            "compaction: token-meter surface does not match the current session surface",
            session_id=session.id,
        )
    kept = 0
    keep_from = len(nodes)
    while keep_from > 0:
        keep_from -= 1
        kept += nodes[keep_from].tokens
        if kept >= retain_tokens:
            break
    if keep_from == 0:
        return None
    while not tool_pairing_balanced_before(session, nodes[keep_from].seq):
        keep_from -= 1
        if keep_from == 0:
            return None
    return CompactableRange(nodes[0].seq, nodes[keep_from - 1].seq)
