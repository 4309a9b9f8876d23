"""The agent's leaf types: its errors, the literals of its phases, causes and deliveries,
and a turn's result. Below the agent, its hooks and its loop, so each can name them
without importing the others."""

from __future__ import annotations

from typing import Any, Literal

import attrs
import trio

from harness.errors import HarnessError, RuntimeThreadError

AbortKind = Literal["user", "parent", "disposed"]
Phase = Literal["idle", "turn", "maintenance"]
Delivery = Literal["follow-up", "steer", "inject"]


class AgentArgumentError(HarnessError, ValueError):
    """An agent setting with a value it cannot take (e.g. ``max_tokens`` that is not a
    positive integer, an unknown ``send`` delivery); the message names the value.
    Also a ``ValueError``, as these were before they were typed."""

    code = "INVALID_AGENT_ARGUMENT"


def check_max_tokens(max_tokens: object) -> None:
    """Refuse a ``max_tokens`` that is neither ``None`` nor a positive ``int``."""
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens <= 0):
        raise AgentArgumentError(f"agent max_tokens must be a positive integer, got {max_tokens!r}")


def _off_thread(session_id: str, method: str, *, sync: bool = False) -> RuntimeThreadError:
    name = method.rsplit(".", 1)[-1]
    portal = f"await portal.arun_sync(agent.{name}, ...)" if sync else f"await portal.arun(agent.{name}, ...)"
    return RuntimeThreadError(
        f'agent "{session_id}": {method} was called outside the runtime\'s Trio thread (from asyncio or another '
        f"thread); an agent belongs to that thread: call it through the portal, e.g. {portal}",
        session_id=session_id,
    )


def require_trio_task(session_id: str, method: str) -> trio.lowlevel.Task:
    """The current Trio task, for an async entry point of an agent to call before it
    changes anything; :class:`~harness.errors.RuntimeThreadError` when there is none
    (called from an asyncio task or another thread instead of through the portal)."""
    try:
        return trio.lowlevel.current_task()
    except RuntimeError:
        raise _off_thread(session_id, method) from None


def require_trio_thread(session_id: str, method: str) -> None:
    """:func:`require_trio_task` for a synchronous entry point: refuse unless this
    thread is running Trio (the runtime's thread: a task, or a callback of its run)."""
    if not trio.lowlevel.in_trio_run():
        raise _off_thread(session_id, method, sync=True)


class AgentBusyError(HarnessError):
    code = "AGENT_BUSY"


class AgentDisposedError(HarnessError):
    code = "AGENT_DISPOSED"


class AgentCancelledError(HarnessError):
    """:meth:`Agent.cancel` cancelled a maintenance task; ``cause`` is the cancel
    record (``{"kind": "user" | "parent" | "disposed"}``)."""

    code = "AGENT_CANCELLED"

    def __init__(self, message: str, cause: dict[str, Any], *, session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.cause = cause


@attrs.frozen
class TurnResult:
    """How a turn ended: ``reason`` is the ``turn/end`` reason record."""

    turn: int
    reason: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.reason["kind"])
