"""The agent's leaf types: its errors, the literals of its phases, causes and deliveries,
and a turn's result. Below the agent, its hooks and its loop, so each can name them
without importing the others."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from harness.errors import HarnessError

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
