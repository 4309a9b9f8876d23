"""The deterministic benchmark event generator of architecture §8."""

from __future__ import annotations

import uuid
from typing import Any, Final

WORDS: Final = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "this", "are", "or", "from", "at", "which", "but", "not", "have", "an", "they", "function", "session", "event", "append", "surface", "replace", "message", "model", "user", "assistant", "token", "cache", "derive", "fork", "restore", "file", "path", "error", "value", "return", "string", "number", "array", "object", "index", "buffer", "stream", "write", "read", "flush", "durable", "log", "compaction", "summary", "context", "request", "header", "provider", "tool", "result", "call", "turn", "step"]
assert len(WORDS) == 69

_MASK = 0xFFFFFFFF


def bench_text(i: int) -> str:
    """Exactly 200 characters of pseudo-English, identical across implementations."""
    x = ((i + 1) * 2654435761) & _MASK
    out = "#" + str(i)
    while len(out) < 200:
        x ^= (x << 13) & _MASK
        x ^= x >> 17
        x ^= (x << 5) & _MASK
        out += " " + WORDS[x % 69]
    return out[:200]


def bench_payload(i: int) -> tuple[str, dict[str, Any]]:
    """(type, data) of bench event i: user/message when even, assistant/message when odd."""
    mid = str(uuid.UUID(int=(i * 0x9E3779B97F4A7C15) & ((1 << 128) - 1), version=4))
    if i % 2 == 0:
        return "user/message", {
            "id": mid,
            "role": "user",
            "content": [{"type": "text", "text": bench_text(i)}],
            "source": {"kind": "user"},
        }
    return "assistant/message", {
        "turn": 1,
        "step": 1,
        "message": {
            "id": mid,
            "role": "assistant",
            "content": [{"type": "text", "text": bench_text(i)}],
            "source": {"kind": "model", "provider": "bench", "model": "bench-model"},
        },
        "usage": {"inputTokens": 100 + i % 50, "outputTokens": 20 + i % 7},
    }


def bench_record(i: int, time0: int = 1_700_000_000_000) -> dict[str, Any]:
    """The stored record of bench event i (surface op append)."""
    type_, data = bench_payload(i)
    return {"type": type_, "seq": i, "time": time0 + i, "data": data, "surfaceOp": "append"}
