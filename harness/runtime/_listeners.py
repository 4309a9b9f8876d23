"""Lifecycle listeners of a store, with per-listener failure containment (reference §7)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from harness.runtime._handles import SessionHandle
    from harness.session import Event

log = logging.getLogger("harness.store")

CreatedListener = Callable[["SessionHandle"], None]
EventListener = Callable[["SessionHandle", "Event"], None]
DisposedListener = Callable[["SessionHandle"], None]
PreCommitHook = Callable[["SessionHandle", "tuple[Event, ...]"], None]
FlushListener = Callable[["SessionHandle"], Awaitable[None]]


def describe(exc: BaseException) -> str:
    """``Type: message`` (the reference logs JS ``String(error)``, e.g. ``Error: boom``)."""
    return f"{type(exc).__name__}: {exc}"


class Listeners:
    """The listener sets of one store. Listeners are synchronous callables.

    Contract, mapped from the reference to the actor model:

    * ``created`` runs inside the store actor's announce, in registration order; a
      raise vetoes the announcement (later listeners are skipped).
    * ``pre_commit`` hooks run in the session actor between plan and commit; a raise
      vetoes the append (nothing is logged).
    * ``event`` runs in the session actor right after a commit; a raise is logged
      and never fails or rolls back the append; later listeners still run.
    * ``disposed`` runs when an announced session is detached; same containment.
    * ``flush`` listeners are async; ``store.flush`` runs them concurrently and
      raises the first failure in listener order.

    A listener cannot re-enter an actor synchronously: work it starts (for example an
    append to the same session) is queued behind the current message. That replaces
    the reference's "append cannot reenter while another append is being published"
    rejection with ordering.
    """

    def __init__(self) -> None:
        self.created: list[CreatedListener] = []
        self.event: list[EventListener] = []
        self.disposed: list[DisposedListener] = []
        self.pre_commit: list[PreCommitHook] = []
        self.flush: list[FlushListener] = []

    def emit_event(self, handle: SessionHandle, events: tuple[Event, ...]) -> None:
        for listener in list(self.event):
            for ev in events:
                try:
                    listener(handle, ev)
                except Exception as exc:
                    log.warning(
                        'session "%s": session/event listener threw: %s', handle.id, describe(exc)
                    )

    def emit_disposed(self, handle: SessionHandle) -> None:
        for listener in list(self.disposed):
            try:
                listener(handle)
            except Exception as exc:
                log.warning(
                    'session "%s": session/disposed listener threw: %s', handle.id, describe(exc)
                )

    async def run_flush(self, handle: SessionHandle) -> bool:
        listeners = list(self.flush)
        if not listeners:
            return False
        failures: list[BaseException | None] = [None] * len(listeners)

        async def run(i: int, fn: FlushListener) -> None:
            try:
                await fn(handle)
            except Exception as exc:
                failures[i] = exc

        if len(listeners) == 1:
            await run(0, listeners[0])  # the common case needs no nursery
        else:
            try:
                async with trio.open_nursery() as nursery:
                    for i, fn in enumerate(listeners):
                        nursery.start_soon(run, i, fn)
            except BaseExceptionGroup as group:
                # run() keeps every Exception, so only cancellation gets here: the
                # caller sees the bare Cancelled its `except trio.Cancelled` expects,
                # not a group of them.
                cancelled = _only_cancelled(group)
                if cancelled is None:
                    raise
                raise cancelled from None
        for failure in failures:
            if failure is not None:
                raise failure
        return True


def _only_cancelled(group: BaseExceptionGroup[BaseException]) -> trio.Cancelled | None:
    """The first ``Cancelled`` of a group holding nothing else, else ``None``."""
    first: trio.Cancelled | None = None
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            inner = _only_cancelled(exc)
            if inner is None:
                return None
            first = first or inner
        elif isinstance(exc, trio.Cancelled):
            first = first or exc
        else:
            return None
    return first


def subscribe(items: list[Any], item: Any) -> Callable[[], None]:
    """Add ``item`` to ``items``; return an idempotent unsubscribe function."""
    items.append(item)

    def remove() -> None:
        if item in items:
            items.remove(item)

    return remove
