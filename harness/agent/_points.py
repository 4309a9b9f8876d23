"""Named fault points: checkpoints where a test can inject an action (e.g. a cancel).

The agent loop owns them (it calls them at its named steps); ``harness.faults``, which
sits above the agent, re-exports :class:`FaultPoints` as part of its toolkit."""

from __future__ import annotations

from collections.abc import Callable

import trio


class FaultPoints:
    """Code under test calls ``await points.point("name")`` at each named step: a
    real Trio checkpoint, preceded by the action registered for that name (if any).

    ``visited`` records every point reached, in order, so a dry run discovers the
    reachable checkpoints and a test can then inject a fault at each of them.
    """

    def __init__(self) -> None:
        self.visited: list[str] = []
        self._actions: dict[str, Callable[[], None]] = {}

    def on(self, name: str, action: Callable[[], None]) -> None:
        """Run ``action`` (once) when ``name`` is next reached."""
        self._actions[name] = action

    async def point(self, name: str) -> None:
        """Run the registered action, then checkpoint (cancellable: that is the point)."""
        self.visited.append(name)
        action = self._actions.pop(name, None)
        if action is not None:
            action()
        await trio.lowlevel.checkpoint()
