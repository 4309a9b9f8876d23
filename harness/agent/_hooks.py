"""The agent loop's hook points: ``agent/pre-step``, ``agent/request-error`` and status.

Plugins (compaction is the first) attach to an :class:`~harness.agent.Agent` here instead of
subclassing it. Every registration returns a function that removes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import attrs

from harness.providers import ProviderError
from harness.session import FrozenDict

if TYPE_CHECKING:
    from harness.agent._tools import ToolSet
    from harness.agent._types import AbortKind, Delivery, Phase, TurnResult
    from harness.persistence import CheckpointPolicy
    from harness.providers import ModelProvider
    from harness.runtime import SessionHandle

Status = Literal["idle", "running"]
T = TypeVar("T")


class AgentView(Protocol):
    """The agent as its hooks see it: every public member of
    :class:`harness.agent.Agent`, the one implementation (mypy checks that it conforms;
    tests/test_layers.py that nothing public of it is missing here). Declared here so
    that the hooks need not import the agent, which imports them."""

    session: SessionHandle
    provider: ModelProvider
    tools: ToolSet
    system: str | None
    max_tokens: int | None
    checkpoint: CheckpointPolicy | None
    hooks: AgentHooks
    close_grace: float
    max_tool_arguments: int
    disposed: bool

    @property
    def id(self) -> str: ...
    @property
    def busy(self) -> bool: ...
    @property
    def phase(self) -> Phase: ...
    @property
    def status(self) -> Status: ...
    @property
    def inbox(self) -> dict[str, tuple[FrozenDict, ...]]: ...
    def cancel(self, kind: AbortKind = "user") -> None: ...
    def cancel_requested(self) -> bool: ...
    def in_turn(self) -> bool: ...
    async def wait_idle(self) -> None: ...
    async def send(self, text: str, *, delivery: Delivery = "follow-up") -> str: ...
    def inject_nowait(self, text: str) -> str: ...
    async def clear_inbox(self) -> int: ...
    async def run_queued(self) -> list[TurnResult]: ...
    async def run_maintenance(self, task: Callable[[], Awaitable[T]]) -> T: ...
    async def run_turn(self, text: str) -> TurnResult: ...


@attrs.frozen
class StepContext:
    """What a pre-step hook sees: the turn, the step about to start, and the inbox
    messages claimed for it (not on the surface yet: they are appended after
    ``step/start``)."""

    agent: AgentView
    turn: int
    step: int
    claimed: tuple[FrozenDict, ...]


@attrs.frozen
class RequestErrorContext:
    """A model request of ``turn``/``step`` failed with ``error``; the step is still
    open. ``attempt`` counts the requests of this step (1 for the first)."""

    agent: AgentView
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

    agent: AgentView
    turn: int
    step: int
    point: CheckpointPoint
    call_id: str | None
    durable_seq: int


PreStepHook = Callable[[StepContext], Awaitable[None]]
CheckpointListener = Callable[[CheckpointContext], None]
RequestErrorHook = Callable[[RequestErrorContext], Awaitable["Retry | None"]]
StatusListener = Callable[[AgentView, Status], None]


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
