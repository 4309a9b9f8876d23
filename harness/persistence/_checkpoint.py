"""The checkpoint policy (reference §4): where the agent loop makes the log durable."""

from __future__ import annotations

from typing import final

from harness.runtime import SessionHandle, Store


@final
class CheckpointPolicy:
    """Durability points for an agent loop: before each model request, before each
    top-level tool body, and at each step boundary. Each is ``store.flush(session)``;
    a failure propagates (the loop fails the turn, or the tool call, instead of
    acting on state that is not durable). There is no flush at turn end: the
    write-behind window and explicit flushes cover it.

    The loop calls it only if one is configured: without it, durability is the
    write-behind window plus explicit flushes.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.flushes = 0

    async def before_model_request(self, session: SessionHandle) -> None:
        """Flush before a model request is dispatched. Cancellation propagates."""
        await self._flush(session)

    async def before_tool(self, session: SessionHandle) -> None:
        """Flush before a top-level tool body runs. Cancellation propagates."""
        await self._flush(session)

    async def at_step_boundary(self, session: SessionHandle) -> None:
        """Flush before each step derives its request. Cancellation propagates."""
        await self._flush(session)

    async def _flush(self, session: SessionHandle) -> None:
        self.flushes += 1
        await self.store.flush(session)
