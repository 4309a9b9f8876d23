"""Streaming workloads (issue 24 §2): W15, a tool call's large arguments in small pieces.

Each size runs three ways; every one should cost the same per megabyte at every size
(linear), where the ``+=`` accumulation it replaced grew with the square of the size:

* ``W15-<size>``: an agent turn through the actor runtime, the arguments streamed as
  64-character :class:`~harness.providers.ToolCallDelta` pieces (each one also logged as
  an ``assistant/chunk``), then parsed and handed to a tool;
* ``W15-provider-<size>``: the OpenAI-compatible provider's parse of the same reply as an
  event stream (one SSE event per 64-character fragment, read 4 KiB at a time; the
  call's name arrives last, so every fragment is held back until then);
* ``W15-sse-<size>``: one event-stream line of that size read 64 bytes at a time (sizes
  capped under the parser's 8 MiB line bound).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any, Final

import orjson
import trio

from harness.bench._runner import Result, median_ms

SIZES_MB: Final = (1, 3, 10)
PIECE: Final = 64
READ: Final = 4096
_MB: Final = 1_000_000


def _arguments(size: int) -> str:
    head, tail = '{"text": "', '"}'
    return head + "x" * (size - len(head) - len(tail)) + tail


def _agent_turn(arguments: str) -> float:
    from harness.agent import Agent, ToolSet, tool
    from harness.providers import Finish, ModelRequest, StreamChunk, ToolCallDelta
    from harness.runtime import open_store

    got: list[int] = []

    @tool("take", "Take the text")
    async def take(args: dict[str, Any]) -> Any:
        got.append(len(args["text"]))
        return "ok"

    class Pieces:
        name = "bench"
        model = "bench-1"
        context_window = None

        def __init__(self) -> None:
            self.replies = 0

        async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
            self.replies += 1
            if self.replies == 1:
                yield ToolCallDelta(0, "c1", arguments[:PIECE], "take")
                for i in range(PIECE, len(arguments), PIECE):
                    yield ToolCallDelta(0, "c1", arguments[i : i + PIECE])
                yield Finish("tool-calls")
            else:
                yield Finish("stop")

    async def main() -> float:
        async with open_store() as store:
            s = await store.create("bench")
            agent = Agent(s, Pieces(), ToolSet([take]))
            t0 = time.perf_counter()
            result = await agent.run_turn("go")
            dt = time.perf_counter() - t0
            assert result.kind == "completed" and got == [len(arguments) - 12], (result, got)
            return dt

    return trio.run(main)


def _event_stream(arguments: str) -> bytes:
    """A chat-completion reply as an event stream: one tool-call fragment per event,
    the name in the last one."""
    out = bytearray()
    pieces = [arguments[i : i + PIECE] for i in range(0, len(arguments), PIECE)]
    for i, piece in enumerate(pieces):
        fn: dict[str, Any] = {"arguments": piece}
        if i == len(pieces) - 1:
            fn["name"] = "take"
        delta = {"tool_calls": [{"index": 0, "id": "c1", "function": fn}]}
        out += b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"
    out += b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}\n\ndata: [DONE]\n\n'
    return bytes(out)


def _provider_parse(body: bytes, size: int) -> float:
    from harness.providers import ToolCallDelta
    from harness.providers._openai_reply import _ReplyMapper
    from harness.providers._sse import SSEParser

    parser, mapper = SSEParser(), _ReplyMapper("bench")
    total = 0
    t0 = time.perf_counter()
    for i in range(0, len(body), READ):
        for event in parser.feed(body[i : i + READ]):
            if event.data == "[DONE]":
                break
            for item in mapper.feed(orjson.loads(event.data)):
                if isinstance(item, ToolCallDelta):
                    total += len(item.arguments_delta)
    dt = time.perf_counter() - t0
    assert total == size, (total, size)
    return dt


def _sse_line(size: int) -> float:
    from harness.providers._sse import SSEParser

    line = b"data: " + b"x" * (size - 8) + b"\n\n"
    parser = SSEParser()
    events = []
    t0 = time.perf_counter()
    for i in range(0, len(line), PIECE):
        events += parser.feed(line[i : i + PIECE])
    dt = time.perf_counter() - t0
    assert len(events) == 1 and len(events[0].data) == size - 8
    return dt


def w15(n: int, runs: int, sizes_mb: tuple[int, ...] = SIZES_MB) -> list[Result]:
    """Tool-call arguments of 1, 3 and 10 MB streamed in small pieces (``n`` unused)."""
    runs = max(1, min(runs, 3))
    out: list[Result] = []
    for mb in sizes_mb:
        size = mb * _MB
        arguments = _arguments(size)
        body = _event_stream(arguments)
        sse_size = min(size, 8 * 1024 * 1024 - 1024)
        for key, fn, note in (
            (f"W15-{mb}MB", partial(_agent_turn, arguments), "an agent turn: tool-call arguments in 64-char deltas"),
            (f"W15-provider-{mb}MB", partial(_provider_parse, body, size), "SSE + reply mapping: 64-char fragments, name last"),
            (f"W15-sse-{mb}MB", partial(_sse_line, sse_size), "one event-stream line in 64-byte reads"),
        ):
            ms = median_ms(fn, runs)
            measured = sse_size if key.startswith("W15-sse") else size
            out.append(Result(key, ms, None, {"bytes": measured, "ms_per_mb": round(ms * _MB / measured, 2)}, note))
    return out
