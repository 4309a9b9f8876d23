"""The domain-free actor kernel on Trio (never imports ``harness``).

* :class:`Actor` / :class:`ActorRef` — one task owning its state, a bounded mailbox,
  ``call`` (request/reply, exceptions re-raised in the caller) and ``cast``.
* :class:`ActorRuntime` — the nursery that owns actors and stops them in order.
* :class:`Lifetime`, :class:`Owner`, :func:`run_abandonable` — owner / caller / teardown
  cancellation with deterministic disposal of abandoned results.
* :func:`open_guard` — services that stop in order even when an enclosing scope is
  cancelled (the body is cancelled, the services are not).
"""

from actors._actor import Actor, ActorRef
from actors._bounded import run_bounded
from actors._errors import (
    ActorCrashedError,
    ActorError,
    ActorStoppedError,
    LifetimeClosedError,
    Rejected,
    ReplyOverdueError,
)
from actors._guard import Guard, open_guard
from actors._lifetimes import Lifetime, Owner, bind_all, run_abandonable
from actors._runtime import ActorRuntime, Supervisor

__all__ = [
    "Actor",
    "ActorCrashedError",
    "ActorError",
    "ActorRef",
    "ActorRuntime",
    "ActorStoppedError",
    "Guard",
    "Lifetime",
    "LifetimeClosedError",
    "Owner",
    "Rejected",
    "ReplyOverdueError",
    "Supervisor",
    "bind_all",
    "open_guard",
    "run_abandonable",
    "run_bounded",
]
