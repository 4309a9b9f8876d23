"""Tool-pairing balance of the surface (reference §2.2).

The surface is folded in order with a count of open tool calls: an
``assistant/message`` adds its ``tool-call`` blocks, a ``tool/result`` removes one,
anything else is neutral. N nodes give N+1 cuts; cut 0 is balanced, and cut p+1 is
balanced when the count after node p is 0. A compaction range may only start and end
on balanced cuts, so it never separates a call from its result.

The fold is cached per session (see :mod:`harness.compaction._cache`) under
(replace generation, node count). Appends only ever add nodes at the end, so under
an unchanged generation the nodes already folded are still the surface's first
nodes: new ones are folded incrementally, and log-only growth (no new node) reads no
events at all. A new generation or fewer nodes means the surface was rewritten, and
the fold restarts. A corrupt node raises before anything is committed, so the cache
is never left describing a half-folded tail.
"""

from __future__ import annotations

from harness.compaction._cache import PairingState, cache_for
from harness.errors import ToolPairingError
from harness.session import SURFACE_TYPES, Session

_PREFIX = "tool-pairing balance: "


def delta_of(type_: str, data: object) -> int:
    """A surface event's change to the open-call count: ``assistant/message`` +its
    ``tool-call`` blocks, ``tool/result`` -1, anything else 0. ``data`` is raw."""
    if type_ == "tool/result":
        return -1
    if type_ != "assistant/message":
        return 0
    message = data.get("message") if type(data) is dict else None
    content = message.get("content") if type(message) is dict else None
    if type(content) is not list and type(content) is not tuple:
        return 0
    return sum(1 for b in content if type(b) is dict and b.get("type") == "tool-call")


def _delta(session: Session, seq: int, deltas: dict[int, int]) -> int:
    """The node's delta, memoised per seq (events are immutable; the meter's scan
    fills the memo too, so a fold after a measure reads no event)."""
    t = session.type_at(seq) if 0 <= seq < session.seq else None
    if t not in SURFACE_TYPES:
        raise ToolPairingError(
            f"{_PREFIX}surface seq {seq} has no matching session event (corrupt surface)",
            session_id=session.id,
        )
    d = deltas[seq] = delta_of(t, session.raw_data_at(seq))
    return d


def pairing_state(session: Session) -> PairingState:
    """The fold of ``session``'s current surface, brought up to date."""
    state = cache_for(session).pairing
    nodes = session.surface
    generation = session.generation
    n = len(nodes)
    folded = len(state.after)
    if generation == state.generation and folded <= n:
        if folded == n:
            return state  # log-only growth, or nothing new: no event is read
        start, count = folded, (state.after[-1] if folded else 0)
    else:
        start, count = 0, 0
    # Fold into fresh lists and commit only at the end: a corrupt node must leave
    # the cache as it was.
    after: list[int] = []
    positions: dict[int, int] = {}
    deltas = state.deltas
    for p in range(start, n):
        seq = nodes[p]
        d = deltas.get(seq)
        count += _delta(session, seq, deltas) if d is None else d
        if count < 0:
            raise ToolPairingError(
                f"{_PREFIX}tool/result at surface seq {seq} has no matching tool-call (corrupt surface)",
                session_id=session.id,
            )
        after.append(count)
        positions[seq] = p
    if start == 0:
        state.after, state.positions = after, positions
    else:
        state.after.extend(after)
        state.positions.update(positions)
    state.generation = generation
    return state


def _position(session: Session, state: PairingState, seq: int) -> int:
    p = state.positions.get(seq)
    if p is None:
        raise ToolPairingError(f"{_PREFIX}surface seq {seq} not found", session_id=session.id)
    return p


def tool_pairing_balanced_before(session: Session, seq: int) -> bool:
    """Whether the cut just before surface node ``seq`` leaves no call unanswered.

    Raises :class:`~harness.errors.ToolPairingError` when ``seq`` is not on the
    current surface (stale seqs after a replace included) or the surface is corrupt.
    """
    state = pairing_state(session)
    p = _position(session, state, seq)
    return p == 0 or state.after[p - 1] == 0


def tool_pairing_balanced_after(session: Session, seq: int) -> bool:
    """Whether the cut just after surface node ``seq`` leaves no call unanswered."""
    state = pairing_state(session)
    return state.after[_position(session, state, seq)] == 0
