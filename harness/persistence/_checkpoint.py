"""The checkpoint policy (reference §4): where the agent loop makes the log durable."""

from __future__ import annotations

from typing import final

from harness.runtime import SessionHandle, Store


@final
class CheckpointPolicy:
    """Durability points for an agent loop (reference §4): before each model request,
    before each top-level tool body, and at each step boundary. Each is
    ``store.flush(session)``; a failure propagates to the loop, which does not act on
    state that is not durable:

    * :meth:`at_step_boundary` (after the ``agent/pre-step`` hooks, before
      ``step/start``) and :meth:`before_model_request`: the turn ends with
      ``turn/end {kind: "error", error: {message, code}}`` before any request;
    * :meth:`before_tool`: that call's ``tool/result`` is the error (``Error:
      <message>``, ``error: {name, code}``, the body never runs) and the turn goes
      on. A turn cancelled before the body started (during the flush, or with the
      cancellation still pending when it returned) answers the call with
      ``TOOL_ABORTED_BEFORE_DISPATCH``: the body never starts.

    There is no flush at turn end: the write-behind window and explicit flushes
    cover it. The loop calls it only if one is configured: without it, durability is
    the write-behind window plus explicit flushes.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.flushes = 0

    async def before_model_request(self, session: SessionHandle) -> None:
        """Flush before a model request is dispatched. Cancellation propagates."""
        await self._flush(session)

    async def before_tool(self, session: SessionHandle) -> None:
        """Flush before a top-level tool body runs. Cancellation propagates (the loop
        then answers the call as aborted before dispatch)."""
        await self._flush(session)

    async def at_step_boundary(self, session: SessionHandle) -> None:
        """Flush before each step derives its request. Cancellation propagates."""
        await self._flush(session)

    async def _flush(self, session: SessionHandle) -> None:
        self.flushes += 1
        await self.store.flush(session)
