"""The actor kernel's exception hierarchy (domain-free: no harness imports)."""

from __future__ import annotations


class ActorError(Exception):
    """Root of every error the actor kernel raises."""

    code = "ACTOR_ERROR"


class ActorStoppedError(ActorError):
    """The actor no longer accepts messages (its runtime is stopping or stopped)."""

    code = "ACTOR_STOPPED"


class ActorCrashedError(ActorError):
    """The actor crashed: a handler raised an unexpected exception (chained as the cause)."""

    code = "ACTOR_CRASHED"

    def __init__(self, actor: str, cause: BaseException) -> None:
        super().__init__(f"actor {actor!r} crashed: {cause!r}")
        self.actor = actor
        self.__cause__ = cause


class Rejected(Exception):
    """Raise ``Rejected(exc)`` from a handler to reply with ``exc`` (any type).

    The caller gets ``exc`` itself, with its type intact, and the actor goes on. Use
    it for failures that are answers (e.g. a listener's veto), not bugs.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class LifetimeClosedError(ActorError):
    """A wait was abandoned because a lifetime (owner or teardown) closed.

    ``reason`` is the value the lifetime was closed with (never lost in a bare
    ``Cancelled``); ``lifetime`` names it.
    """

    code = "LIFETIME_CLOSED"

    def __init__(self, lifetime: str, reason: object) -> None:
        super().__init__(f"{lifetime} closed: {reason}")
        self.lifetime = lifetime
        self.reason = reason


class ReplyOverdueError(ActorError):
    """A cancelled caller waited ``grace`` seconds for a message the actor had already
    taken, and stopped waiting: whether it was applied is unknown.

    Callers reconcile from the actor's state (e.g. read the log) instead of guessing.
    """

    code = "REPLY_OVERDUE"

    def __init__(self, actor: str, message: object, grace: float) -> None:
        super().__init__(
            f"actor {actor!r} did not answer {type(message).__name__} within {grace:g} s "
            "after its caller was cancelled; outcome unknown"
        )
        self.actor = actor
        self.message = message
        self.grace = grace
