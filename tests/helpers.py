"""Builders for well-formed events used across the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.persistence import JsonlBackend


def user(mid: str = "u1", text: str = "hi") -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}


def assistant(turn: int = 1, step: int = 1, mid: str = "a1", blocks: list[Any] | None = None) -> dict[str, Any]:
    return {
        "turn": turn,
        "step": step,
        "message": {
            "id": mid,
            "role": "assistant",
            "content": [{"type": "text", "text": "ok"}] if blocks is None else blocks,
            "source": {"kind": "model", "provider": "p", "model": "m"},
        },
    }


def tool_call_block(call_id: str, name: str = "read") -> dict[str, Any]:
    return {"type": "tool-call", "id": call_id, "name": name, "arguments": "{}"}


def tool_result(call_id: str, turn: int = 1, step: int = 1, text: str = "out", mid: str | None = None) -> dict[str, Any]:
    return {
        "turn": turn,
        "step": step,
        "message": {
            "id": mid or f"r-{call_id}",
            "role": "user",
            "content": [{"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}]}],
            "source": {"kind": "tool", "callId": call_id},
        },
    }


def rec(type_: str, seq: int, data: Any, **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"type": type_, "seq": seq, "time": 1000 + seq, "data": data}
    r.update(extra)
    return r


def header(sid: str, **extra: Any) -> dict[str, Any]:
    h: dict[str, Any] = {"version": 0, "id": sid, "createdAt": 1}
    h.update(extra)
    return h


class CountingJsonl(JsonlBackend):
    """A JSONL backend that records which reads ran (``load_lines``: the resume's fast
    read, decision 0010; ``load``: the general reader)."""

    def __init__(self, root: Path, **kw: Any) -> None:
        super().__init__(root, **kw)
        self.calls: list[str] = []

    def load_lines(self, session_id: str) -> Any:
        self.calls.append("load_lines")
        return super().load_lines(session_id)

    def load(self, session_id: str) -> Any:
        self.calls.append("load")
        return super().load(session_id)
