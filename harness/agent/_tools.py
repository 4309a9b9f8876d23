"""Tools: async callables with a name, a description and JSON-schema parameters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import attrs

from harness.errors import HarnessError
from harness.providers import ToolSpec

ToolFn = Callable[[dict[str, Any]], Awaitable[Any]]


class ToolError(HarnessError):
    """A tool failed in an expected way; its message becomes the error result."""

    code = "TOOL_ERROR"


@attrs.frozen
class Tool:
    """``fn(arguments) -> result``; a ``str`` result is the text, anything else is
    JSON-encoded. Raising :class:`ToolError` (or any exception) yields an error
    result; ``Cancelled`` propagates (the turn was cancelled)."""

    name: str
    description: str
    fn: ToolFn
    parameters: dict[str, Any] = attrs.field(factory=lambda: {"type": "object", "properties": {}})

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)


def tool(name: str, description: str, parameters: dict[str, Any] | None = None) -> Callable[[ToolFn], Tool]:
    """Decorator: ``@tool("read", "Read a file")`` over ``async def read(args)``."""

    def wrap(fn: ToolFn) -> Tool:
        return Tool(name, description, fn, parameters or {"type": "object", "properties": {}})

    return wrap


class ToolSet:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self._tools:
                raise ValueError(f"duplicate tool name {t.name!r}")
            self._tools[t.name] = t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec for t in self._tools.values())
