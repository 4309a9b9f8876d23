"""The agent loop's hook points: ``agent/pre-step``, ``agent/request-error`` and status.

Plugins (compaction is the first) attach to an :class:`Agent` here instead of
subclassing it. Every registration returns a function that removes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

import attrs

from harness.providers import ProviderError
from harness.session import FrozenDict

if TYPE_CHECKING:
    from harness.agent._agent import Agent

Status = Literal["idle", "running"]


@attrs.frozen
class StepContext:
    """What a pre-step hook sees: the turn, the step about to start, and the inbox
    messages claimed for it (not on the surface yet: they are appended after
    ``step/start``)."""

    agent: Agent
    turn: int
    step: int
    claimed: tuple[FrozenDict, ...]


@attrs.frozen
class RequestErrorContext:
    """A model request of ``turn``/``step`` failed with ``error``; the step is still
    open. ``attempt`` counts the requests of this step (1 for the first)."""

    agent: Agent
    turn: int
    step: int
    error: ProviderError
    attempt: int


@attrs.frozen
class Retry:
    """A request-error decision: rebuild the request from the current surface and
    send it again in the same step (no new step, no new turn)."""


CheckpointPoint = Literal["step", "model-request", "tool"]


@attrs.frozen
class CheckpointContext:
    """A checkpoint flush that completed (reference §4): at the ``step`` boundary, before
    a ``model-request``, or before a ``tool`` body (``call_id`` names the call; ``None``
    otherwise). ``durable_seq``: the session's length the flush covered (every event
    before it is durable)."""

    agent: Agent
    turn: int
    step: int
    point: CheckpointPoint
    call_id: str | None
    durable_seq: int


PreStepHook = Callable[[StepContext], Awaitable[None]]
CheckpointListener = Callable[[CheckpointContext], None]
RequestErrorHook = Callable[[RequestErrorContext], Awaitable["Retry | None"]]
StatusListener = Callable[["Agent", Status], None]


def _remover(items: list[object], item: object) -> Callable[[], None]:
    """The idempotent remover of one registration: it removes that registration once
    (a hook registered twice stays once), by identity (never an equal other one)."""
    removed = False

    def remove() -> None:
        nonlocal removed
        if removed:
            return
        removed = True
        for i, registered in enumerate(items):
            if registered is item:
                del items[i]
                return

    return remove


class AgentHooks:
    """The hooks of one agent, called in registration order.

    * ``pre_step``: awaited after ``turn/start`` and the inbox claim, before
      ``step/start``. A hook that raises fails the turn (``turn/end`` ``error``)
      before any request; hooks that must never do so (compaction) catch their own
      errors.
    * ``request_error``: awaited while the failed step is still open. The first hook
      that returns a decision ends the waterfall; a hook that raises counts as no
      retry (the error is logged). Not called for a cancelled request.
    * ``checkpoint``: synchronous, called after each checkpoint flush of the agent's
      checkpoint policy completed (:class:`CheckpointContext`: the step boundary,
      before a model request, before a tool body — then before that body starts);
      a failed flush calls nothing. A listener that raises is contained as a status
      listener's (``agent/checkpoint``).
    * ``status``: synchronous, called when the agent becomes ``running`` or ``idle``; a
      listener that raises is contained (logged, and reported to the store's warnings
      channel as ``listener-failed`` from ``agent/status``). For every agent of a loop
      at once: ``AgentLoop.on_status``.
    """

    def __init__(self) -> None:
        self.pre_step: list[PreStepHook] = []
        self.request_error: list[RequestErrorHook] = []
        self.status: list[StatusListener] = []
        self.checkpoint: list[CheckpointListener] = []

    def on_pre_step(self, hook: PreStepHook) -> Callable[[], None]:
        self.pre_step.append(hook)
        return _remover(self.pre_step, hook)  # type: ignore[arg-type]

    def on_request_error(self, hook: RequestErrorHook) -> Callable[[], None]:
        self.request_error.append(hook)
        return _remover(self.request_error, hook)  # type: ignore[arg-type]

    def on_checkpoint(self, listener: CheckpointListener) -> Callable[[], None]:
        self.checkpoint.append(listener)
        return _remover(self.checkpoint, listener)  # type: ignore[arg-type]

    def on_status(self, listener: StatusListener) -> Callable[[], None]:
        self.status.append(listener)
        return _remover(self.status, listener)  # type: ignore[arg-type]
