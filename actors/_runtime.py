"""The runtime: a nursery that owns actors and stops them in order."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import trio

from actors._actor import Actor, ActorRef, _Cell, _Envelope, run_actor
from actors._bounded import run_bounded
from actors._errors import ActorStoppedError
from actors._lifetimes import Lifetime
from actors._mailbox import Mailbox

log = logging.getLogger("actors")

A = TypeVar("A", bound=Actor[Any])

Supervisor = Callable[[str, BaseException], None]


def _log_crash(name: str, exc: BaseException) -> None:
    log.error("actor %r crashed", name, exc_info=exc)


class ActorRuntime:
    """Owns a nursery of actors. Use with ``async with``.

    Leaving the block stops every actor in reverse spawn order: stop accepting,
    drain what is queued, run ``on_stop``, close. If the block raises or is
    cancelled, actors are cancelled instead of drained; no caller is left hanging
    either way (pending calls fail with :class:`ActorStoppedError`).

    Every orderly stop is bounded: an actor that has not stopped ``stop_grace``
    seconds after its mailbox closed is logged and cancelled (its pending callers
    get :class:`ActorStoppedError`), so a wedged handler cannot hang the runtime's
    exit or a detach.

    ``teardown`` is a :class:`Lifetime` closed when the runtime begins to stop:
    long waits bound to it (see :func:`run_abandonable`) end at that moment.
    """

    def __init__(
        self, *, supervisor: Supervisor = _log_crash, name: str = "runtime", stop_grace: float = 30.0
    ) -> None:
        self._supervisor = supervisor
        self._nursery: trio.Nursery | None = None
        self._manager: Any = None
        # Insertion-ordered: reverse spawn order for the orderly stop, O(1) removal
        # when one actor stops (a store with many sessions detaches each in O(1)).
        self._actors: dict[ActorRef[Any], tuple[_Cell, Mailbox[_Envelope]]] = {}
        self._accepting = False
        self.stop_grace = stop_grace
        self.crashes: list[tuple[str, BaseException]] = []
        self.teardown = Lifetime(f"{name} teardown")

    @property
    def nursery(self) -> trio.Nursery:
        """The long-lived nursery (for tasks that must outlive a caller's wait)."""
        if self._nursery is None:
            raise ActorStoppedError("runtime is not running")
        return self._nursery

    async def __aenter__(self) -> ActorRuntime:
        self._manager = trio.open_nursery()
        self._nursery = await self._manager.__aenter__()
        self._accepting = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._accepting = False
        self.teardown.close("runtime stopping")
        nursery = self.nursery
        try:
            if exc is None:
                with trio.CancelScope(shield=True):
                    # Orderly stop: each actor drains and runs on_stop before the
                    # next (reverse spawn order: dependents stop before what they use).
                    for ref in reversed(list(self._actors)):
                        await self.stop(ref)
            else:
                nursery.cancel_scope.cancel()
        finally:
            for cell, mailbox in self._actors.values():
                cell.closing = True
                mailbox.close()
            try:
                result: bool | None = await self._manager.__aexit__(exc_type, exc, tb)
            finally:
                self._nursery = None
        return result

    def spawn(self, actor: A) -> ActorRef[Any]:
        """Start ``actor`` in this runtime and return its ref (synchronous)."""
        if not self._accepting or self._nursery is None:
            raise ActorStoppedError("runtime is not accepting new actors")
        mailbox: Mailbox[_Envelope] = Mailbox(actor.mailbox_size)
        cell = _Cell(actor.reply_grace)
        ref: ActorRef[Any] = ActorRef(actor.name, mailbox, cell)
        actor.ref = ref
        self._actors[ref] = (cell, mailbox)

        def on_crash(name: str, exc: BaseException) -> None:
            self.crashes.append((name, exc))
            self._supervisor(name, exc)

        cell.on_crash = on_crash
        cell.rejections = actor.rejections
        if actor.inline_messages:
            cell.inline = actor.inline_messages
            cell.handle_inline = actor.handle_inline

        self._nursery.start_soon(run_actor, actor, mailbox, cell, on_crash, name=f"actor:{actor.name}")
        return ref

    async def stop(self, ref: ActorRef[Any]) -> None:
        """Stop one actor in order (drain, on_stop) and wait until it has stopped.

        Shielded and bounded by ``stop_grace``: past it the actor is cancelled
        (logged) and the wait goes on only for its unwinding. A cancelled caller
        still waits that long at most (the stop and its bound are the point). O(1);
        a ref not (or no longer) in this runtime returns at once.
        """
        item = self._actors.get(ref)
        if item is None:
            return
        cell, mailbox = item
        cell.closing = True
        mailbox.close()
        with trio.CancelScope(shield=True):
            if not await run_bounded(cell.stopped.wait, self.stop_grace):
                log.warning("actor %r did not stop within %g s; cancelling it", ref.name, self.stop_grace)
                cell.scope.cancel()
                await cell.stopped.wait()
        self._actors.pop(ref, None)
