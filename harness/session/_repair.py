"""Crash repair as a pure function (reference §9): the closers for an interrupted turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from harness.session._events import APPEND, Event
from harness.session._json import ARRAY, raw_of

OUTCOME_UNKNOWN_TEXT: Final = (
    "The tool call was interrupted after it was recorded, but no result was durably recorded. "
    "Its outcome is unknown. Decide whether to retry from the tool semantics: retry only if the "
    "operation is read-only or idempotent; if it may have side effects, first verify external "
    "state or ask the user. Do not retry blindly."
)
NOT_STARTED_TEXT: Final = (
    "The tool call was interrupted before the Harness recorded it as started. "
    "Retry it if it is still needed."
)


def interrupted_turn_closers(events: Sequence[Event]) -> list[Event]:
    """The synthetic events that close an interrupted turn; ``[]`` if none is open.

    See :func:`closers_for` (this is the same over :class:`Event` objects).
    """
    return closers_for([(e.type, e.seq, e.time, raw_of(e.data)) for e in events])


def closers_for_records(records: Sequence[Any]) -> list[Event]:
    """:func:`interrupted_turn_closers` over raw stored records (before a Session exists).

    Only the events since the last turn marker matter (``turn/start`` resets every
    pending call and step), so the scan starts there: O(last turn), not O(log).
    """
    start = -1
    i = len(records)
    for r in reversed(records):
        i -= 1
        t = r["type"]
        if t == "turn/start" or t == "turn/end":
            if t == "turn/end":
                return []
            start = i
            break
    if start < 0:
        return []
    tail = records[start:]
    return closers_for([(r["type"], r["seq"], r["time"], r["data"]) for r in tail])


def closers_for(events: Sequence[tuple[str, int, int, Any]]) -> list[Event]:
    """The synthetic events that close an interrupted turn; ``[]`` if none is open.

    In order: one error ``tool/result`` per still-pending tool call of the open turn
    (``TOOL_OUTCOME_UNKNOWN`` if its ``tool/call`` was logged, else
    ``TOOL_NOT_STARTED``), ``step/end`` if a step is open, then
    ``turn/end {reason: {kind: "interrupted"}}``. Seqs continue from the last event;
    every closer takes the last event's time.
    """
    open_turn: Any = None
    open_step: Any = None
    pending: dict[str, dict[str, Any]] = {}
    for t, seq_of, _time, data in events:
        d = data if type(data) is dict else {}
        if t == "turn/start":
            open_turn = d.get("turn")
            open_step = None
            pending = {}
        elif t == "turn/end":
            open_turn = None
            open_step = None
            pending = {}
        elif t == "step/start":
            open_step = d.get("step")
        elif t == "step/end":
            open_step = None
            pending = {}
        elif t == "assistant/message":
            message = d.get("message")
            content: Any = message.get("content") if type(message) is dict else None
            for block in content if type(content) in ARRAY else ():
                if type(block) is dict and block.get("type") == "tool-call":
                    call_id = block.get("id")
                    if type(call_id) is str:
                        pending[call_id] = {"step": d.get("step"), "call_seq": None}
        elif t == "tool/call":
            call_id = d.get("callId")
            if call_id in pending:
                pending[call_id]["call_seq"] = seq_of
        elif t == "tool/result":
            message = d.get("message")
            source = message.get("source") if type(message) is dict else None
            if type(source) is dict:
                pending.pop(source.get("callId"), None)  # type: ignore[arg-type]
    if open_turn is None or not events:
        return []
    _, last_seq, when, _ = events[-1]
    seq = last_seq + 1
    out: list[Event] = []
    for call_id, info in pending.items():
        known = info["call_seq"] is not None
        text = OUTCOME_UNKNOWN_TEXT if known else NOT_STARTED_TEXT
        error = (
            {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
            if known
            else {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"}
        )
        message = {
            "id": f"interrupted-tool-result-{call_id}-{seq}",
            "role": "user",
            "content": [
                {
                    "type": "tool-result",
                    "toolCallId": call_id,
                    "isError": True,
                    "content": [{"type": "text", "text": text}],
                }
            ],
            "source": {"kind": "tool", "callId": call_id},
        }
        data = {"turn": open_turn, "step": info["step"], "message": message, "error": error}
        out.append(
            Event(
                "tool/result",
                seq,
                when,
                data,
                APPEND,
                (info["call_seq"],) if known else None,
            )
        )
        seq += 1
    if open_step is not None:
        out.append(Event("step/end", seq, when, {"turn": open_turn, "step": open_step}))
        seq += 1
    out.append(
        Event(
            "turn/end",
            seq,
            when,
            {"turn": open_turn, "reason": {"kind": "interrupted"}},
        )
    )
    return out


__all__ = ["NOT_STARTED_TEXT", "OUTCOME_UNKNOWN_TEXT", "closers_for_records", "interrupted_turn_closers"]
