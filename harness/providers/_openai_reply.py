"""Chat-completion stream chunks (parsed JSON) mapped to the protocol's chunks: content
blocks numbered in order, tool-call fragments joined per call, usage and finish last."""

from __future__ import annotations

from typing import Any, TypeAlias

from harness.providers._errors import (
    ContentFilteredError,
    ProviderServerError,
    TruncatedStreamError,
)
from harness.providers._protocol import (
    MAX_TOOL_ARGUMENTS,
    Finish,
    ProviderError,
    ProviderStreamError,
    ReasoningDelta,
    StreamChunk,
    TextDelta,
    ToolArgumentsTooLargeError,
    ToolCallDelta,
    Usage,
)

_Item: TypeAlias = StreamChunk | ProviderError


class _Call:
    __slots__ = ("announced", "block", "buffered", "held", "id", "name")

    def __init__(self, block: int) -> None:
        self.block = block
        self.id: str | None = None
        self.name: str | None = None
        # Fragments held back until the name arrives: pieces joined once (``+=`` on
        # the attribute copied the whole text per fragment, issue 24 §2), ``held``
        # their length in characters.
        self.buffered: list[str] = []
        self.held = 0
        self.announced = False


class _ReplyMapper:
    """Chat-completion chunks (parsed JSON) to protocol chunks.

    Content blocks are numbered in order of appearance: a run of reasoning deltas is
    one block, a run of text deltas another, each tool call its own. Tool-call
    fragments are keyed by their ``index``; the first :class:`ToolCallDelta` of a call
    carries its id and name (fragments that arrive before the name are held back).
    Usage and the finish are emitted at the end, in that order.
    """

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._blocks = 0
        self._current: tuple[str, int] | None = None
        self._calls: dict[int, _Call] = {}
        self._usage: Usage | None = None
        self.finish: str | None = None

    def _block(self, kind: str) -> int:
        if self._current is None or self._current[0] != kind:
            self._current = (kind, self._blocks)
            self._blocks += 1
        return self._current[1]

    def feed(self, chunk: dict[str, Any]) -> list[_Item]:
        out: list[_Item] = []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = Usage(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")))
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return out
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n=1: the first choice only
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta, out)
            reason = choice.get("finish_reason")
            if reason:
                error = self._finish(str(reason))
                if error is not None:
                    out.append(error)
        return out

    def _delta(self, delta: dict[str, Any], out: list[_Item]) -> None:
        thought = delta.get("reasoning_content")
        if isinstance(thought, str) and thought:
            out.append(ReasoningDelta(self._block("reasoning"), thought))
        text = delta.get("content")
        if isinstance(text, str) and text:
            out.append(TextDelta(self._block("text"), text))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for fragment in calls:
                if isinstance(fragment, dict):
                    self._call(fragment, out)

    def _call(self, fragment: dict[str, Any], out: list[_Item]) -> None:
        key = fragment.get("index")
        if type(key) is not int:
            # No index (some servers): a new id, or a name when the last call has one,
            # opens a call; anything else continues the last.
            fid = fragment.get("id")
            fn = fragment.get("function")
            named = isinstance(fn, dict) and bool(fn.get("name"))
            last = self._calls[max(self._calls)] if self._calls else None
            # Only a string id names a call (a list id from a broken server would be
            # unhashable here: issue 16).
            fresh_id = isinstance(fid, str) and fid and fid not in {c.id for c in self._calls.values()}
            new = last is None or fresh_id or (named and last.name)
            key = len(self._calls) if new else max(self._calls)
        call = self._calls.get(key)
        if call is None:
            self._current = None
            call = self._calls[key] = _Call(self._blocks)
            self._blocks += 1
        fid = fragment.get("id")
        if isinstance(fid, str) and fid and call.id is None:
            call.id = fid
        fn = fragment.get("function")
        fn = fn if isinstance(fn, dict) else {}
        name = fn.get("name")
        if isinstance(name, str) and name and call.name is None:
            call.name = name
        args = fn.get("arguments")
        args = args if isinstance(args, str) else ""
        if call.announced:
            if args:
                out.append(ToolCallDelta(call.block, self._call_id(key, call), args))
        elif call.name is not None:
            call.announced = True
            call.buffered.append(args)
            out.append(ToolCallDelta(call.block, self._call_id(key, call), "".join(call.buffered), call.name))
            call.buffered = []
        elif args:
            call.held += len(args)
            if call.held > MAX_TOOL_ARGUMENTS:
                out.append(
                    ToolArgumentsTooLargeError(
                        f"{self._provider}: tool call {key} streamed more than {MAX_TOOL_ARGUMENTS} characters of arguments without a name",
                        call_id=call.id,
                        limit=MAX_TOOL_ARGUMENTS,
                    )
                )
                return
            call.buffered.append(args)

    def _call_id(self, key: int, call: _Call) -> str:
        if call.id is None:
            call.id = f"call_{key}"
        return call.id

    def _finish(self, reason: str) -> ProviderError | None:
        if reason == "stop":
            self.finish = "tool-calls" if self._calls else "stop"
        elif reason in ("tool_calls", "function_call"):
            self.finish = "tool-calls"
        elif reason == "length":
            self.finish = "length"
        elif reason == "content_filter":
            return ContentFilteredError(f"{self._provider}: the reply was stopped by the content filter")
        elif reason == "insufficient_system_resource":
            return ProviderServerError(f"{self._provider}: the reply was interrupted (insufficient system resource)")
        else:
            return ProviderStreamError(f"{self._provider}: unknown finish reason {reason!r}")
        return None

    def end(self) -> list[_Item]:
        """What closes the reply once the service said it is complete."""
        if self.finish is None:
            return [TruncatedStreamError(f"{self._provider}: the stream ended without a finish reason")]
        unnamed = [k for k, c in self._calls.items() if not c.announced]
        if unnamed:
            return [ProviderStreamError(f"{self._provider}: tool call(s) {unnamed} arrived without a name")]
        out: list[_Item] = []
        if self._usage is not None:
            out.append(self._usage)
        out.append(Finish(self.finish))
        return out


def _int(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0
