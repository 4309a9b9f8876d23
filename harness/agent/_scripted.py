"""The scripted provider: the embedded default, deterministic and offline.

A script is a list of replies; each model request consumes the next one. A reply is
a list of parts: text, reasoning, tool calls, a delay on the Trio clock, or a failure.
Text is streamed in small deltas, like a real provider.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeAlias

import attrs
import orjson
import trio

from harness.providers import (
    Finish,
    ModelRequest,
    ProviderError,
    ReasoningDelta,
    ScriptExhaustedError,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
    Usage,
)


@attrs.frozen
class Say:
    text: str


@attrs.frozen
class Think:
    text: str


@attrs.frozen
class Call:
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)
    id: str | None = None


@attrs.frozen
class Delay:
    """Pause the stream (Trio clock: an autojump clock makes it instant in tests)."""

    seconds: float


@attrs.frozen
class Fail:
    error: ProviderError


@attrs.frozen
class Truncated:
    """End the reply with ``finish: length`` (the max-tokens outcome)."""


Part: TypeAlias = Say | Think | Call | Delay | Fail | Truncated
Reply: TypeAlias = Sequence[Part]


class ScriptedProvider:
    """A real :class:`ModelProvider` whose replies come from a script.

    ``requests`` records every request it served, for assertions.
    """

    def __init__(
        self,
        script: Sequence[Reply],
        *,
        name: str = "scripted",
        model: str = "script-1",
        context_window: int | None = 128_000,
        delta_size: int = 8,
    ) -> None:
        self._script = [list(r) for r in script]
        self.name = name
        self.model = model
        self.context_window = context_window
        self.delta_size = delta_size
        self.requests: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        return len(self._script)

    def extend(self, replies: Sequence[Reply]) -> None:
        self._script.extend(list(r) for r in replies)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Serve the next scripted reply. Cancellation propagates at every delta (each is
        a checkpoint); the reply is consumed even if the stream is cut."""
        self.requests.append(request)
        if not self._script:
            raise ScriptExhaustedError(f"scripted provider has no reply left for request {len(self.requests)}")
        reply = self._script.pop(0)
        index = 0
        calls = 0
        out_tokens = 0
        finish = "stop"
        for part in reply:
            await trio.lowlevel.checkpoint()
            if isinstance(part, Delay):
                await trio.sleep(part.seconds)
            elif isinstance(part, Fail):
                raise part.error
            elif isinstance(part, Truncated):
                finish = "length"
            elif isinstance(part, (Say, Think)):
                make = TextDelta if isinstance(part, Say) else ReasoningDelta
                for i in range(0, max(len(part.text), 1), self.delta_size):
                    yield make(index, part.text[i : i + self.delta_size])
                    await trio.lowlevel.checkpoint()
                out_tokens += max(1, len(part.text) // 4)
                index += 1
            elif isinstance(part, Call):
                calls += 1
                call_id = part.id or f"call-{len(self.requests)}-{calls}"
                args = orjson.dumps(part.arguments).decode()
                half = len(args) // 2
                yield ToolCallDelta(index, call_id, args[:half], part.name)
                await trio.lowlevel.checkpoint()
                yield ToolCallDelta(index, call_id, args[half:])
                out_tokens += 5
                index += 1
        yield Usage(input_tokens=10 * len(request.messages) + 20, output_tokens=out_tokens)
        yield Finish("tool-calls" if calls and finish == "stop" else finish)
