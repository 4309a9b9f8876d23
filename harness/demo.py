"""`harness demo`: a short, readable walk through a session."""

from __future__ import annotations

from typing import Any

from harness.session import (
    EventDraft,
    FrozenDict,
    RelationalInvariants,
    ReplaceOp,
    Session,
    interrupted_turn_closers,
    thaw,
)


def _text(message: FrozenDict) -> str:
    m: Any = thaw(message)
    parts = []
    for block in m["content"]:
        if block["type"] == "text":
            parts.append(str(block["text"]))
        elif block["type"] == "tool-call":
            parts.append(f"<call {block['name']}({block['arguments']})>")
        elif block["type"] == "tool-result":
            parts.append("<result " + " ".join(str(b["text"]) for b in block["content"]) + ">")
    return " ".join(parts)


def _show_surface(session: Session, title: str) -> None:
    print(f"\n  {title}: surface nodes {list(session.surface)} (generation {session.generation})")
    for message in session.derive_messages():
        role = message["role"]
        print(f"    {role:>9}: {_text(message)[:90]}")


def _user(mid: str, text: str) -> dict[str, object]:
    return {"id": mid, "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}


def _assistant(turn: int, mid: str, blocks: list[dict[str, object]]) -> dict[str, object]:
    return {
        "turn": turn,
        "step": 1,
        "message": {
            "id": mid,
            "role": "assistant",
            "content": blocks,
            "source": {"kind": "model", "provider": "scripted", "model": "demo"},
        },
        "usage": {"inputTokens": 12, "outputTokens": 7},
    }


def run_demo(root: str | None = None) -> int:
    del root  # persistence arrives with the durable-sessions work
    clock = iter(range(1_700_000_000_000, 1_800_000_000_000, 250))
    s = Session.create("demo", clock=lambda: next(clock), validator=RelationalInvariants())
    print(f"session {s.id!r} created; header {s.header.to_record()}")

    s.append_batch(
        [
            EventDraft("turn/start", {"turn": 1}),
            EventDraft("user/message", _user("u1", "What is in /etc/hostname?"), "append"),
            EventDraft("step/start", {"turn": 1, "step": 1}),
            EventDraft(
                "assistant/message",
                _assistant(1, "a1", [{"type": "tool-call", "id": "c1", "name": "read", "arguments": '{"path":"/etc/hostname"}'}]),
                "append",
            ),
            EventDraft("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "read", "arguments": '{"path":"/etc/hostname"}'}),
        ]
    )
    result = {
        "turn": 1,
        "step": 1,
        "message": {
            "id": "r1",
            "role": "user",
            "content": [{"type": "tool-result", "toolCallId": "c1", "content": [{"type": "text", "text": "build-host-7"}]}],
            "source": {"kind": "tool", "callId": "c1"},
        },
    }
    s.append("tool/result", result, surface_op="append")
    s.append_batch(
        [
            EventDraft("step/end", {"turn": 1, "step": 1}),
            EventDraft("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
            EventDraft("turn/start", {"turn": 2}),
            EventDraft("user/message", _user("u2", "Thanks. Summarise what we did."), "append"),
        ]
    )
    print(f"\nappended {s.seq} events:")
    for ev in s.events:
        op = "" if ev.surface_op is None else f"  [surface {ev.surface_op if isinstance(ev.surface_op, str) else 'replace'}]"
        print(f"  {ev.seq:3d} {ev.type:<18}{op}")
    _show_surface(s, "before the replace")

    first, last = s.surface[0], s.surface[2]
    shadowed = list(s.surface[0:3])
    summary = s.append(
        "user/message",
        _user("sum1", "[summary] The user asked for /etc/hostname; the read tool returned build-host-7."),
        surface_op=ReplaceOp(first, last),
        source_event_seqs=shadowed,
    )
    print(f"\nreplace at seq {summary.seq}: surface nodes {shadowed} -> [{summary.seq}] (the log keeps all {s.seq} events)")
    _show_surface(s, "after the replace")

    try:
        s.append("turn/start", {"turn": 9})
    except Exception as exc:
        print(f"\na bad append is refused and changes nothing: {type(exc).__name__}: {exc}")
    print(f"  log still has {s.seq} events")

    closers = interrupted_turn_closers(list(s.events))
    print("\nif the process died now, crash repair would append:")
    for ev in closers:
        print(f"  {ev.seq:3d} {ev.type:<18} {ev.data}")
    return 0
