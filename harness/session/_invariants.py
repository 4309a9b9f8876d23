"""The relational invariants (reference §11) as an optional pre-commit validator."""

from __future__ import annotations

from typing import Any

import attrs

from harness.errors import InvariantError
from harness.session._events import Event, ReplaceOp
from harness.session._json import ARRAY, raw_of

_TURN_SCOPED = frozenset({"step/end", "assistant/chunk", "assistant/message", "tool/call"})
_TURN_ENCLOSED = frozenset({"todo/write", "request/header", "request/context"})


@attrs.frozen(slots=True)
class Trace:
    """The per-session state the invariants carry (immutable: batches stay atomic)."""

    last_seq: int = -1
    open_turn: int | None = None
    open_step: int | None = None
    next_turn: int = 1
    next_step: int = 1
    pending: frozenset[str] = frozenset()


def _fmt(v: object) -> str:
    return "null" if v is None else str(v)


class RelationalInvariants:
    """Checks turn/step/tool-call structure before each append commits.

    Use as ``Session.create(..., validator=RelationalInvariants())``. It is replayed
    over seeds too, so a session built from a bad log fails construction.
    """

    def initial(self) -> Trace:
        return Trace()

    def check(self, state: Trace, event: Event) -> Trace:
        s = state
        seq = event.seq
        if seq <= s.last_seq:
            raise InvariantError(f"seq must strictly increase: saw {seq} after {s.last_seq}")
        t = event.type
        raw = raw_of(event.data)
        d: dict[str, Any] = raw if type(raw) is dict else {}
        s = attrs.evolve(s, last_seq=seq)
        if t == "turn/start":
            turn = d.get("turn")
            if s.open_turn is not None:
                raise InvariantError(f"turn/start {_fmt(turn)} while turn {s.open_turn} is still open")
            if turn != s.next_turn:
                raise InvariantError(f"turn/start expected turn {s.next_turn}, got {_fmt(turn)}")
            return attrs.evolve(s, open_turn=turn, open_step=None, next_step=1, pending=frozenset())
        if t == "turn/end":
            turn = d.get("turn")
            if turn != s.open_turn or s.open_turn is None:
                raise InvariantError(f"turn/end {_fmt(turn)} does not match open turn {_fmt(s.open_turn)}")
            if s.open_step is not None:
                raise InvariantError(f"turn/end {_fmt(turn)} while step {s.open_step} is still open")
            return attrs.evolve(
                s, open_turn=None, open_step=None, next_turn=s.next_turn + 1, pending=frozenset()
            )
        if t == "step/start":
            turn, step = d.get("turn"), d.get("step")
            if turn != s.open_turn or s.open_turn is None:
                raise InvariantError(
                    f"step/start in turn {_fmt(turn)} but open turn is {_fmt(s.open_turn)}"
                )
            if s.open_step is not None:
                raise InvariantError(f"step/start {_fmt(step)} while step {s.open_step} is still open")
            if step != s.next_step:
                raise InvariantError(
                    f"step/start expected step {s.next_step} in turn {_fmt(turn)}, got {_fmt(step)}"
                )
            return attrs.evolve(s, open_step=step)
        if t in _TURN_SCOPED or (t == "tool/result" and not isinstance(event.surface_op, ReplaceOp)):
            turn, step = d.get("turn"), d.get("step")
            if s.open_turn is None or turn != s.open_turn or step != s.open_step or s.open_step is None:
                raise InvariantError(
                    f"{t} names turn {_fmt(turn)}/step {_fmt(step)} but open is "
                    f"turn {_fmt(s.open_turn)}/step {_fmt(s.open_step)}"
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
