"""Lifetimes (owner, teardown) and run_abandonable (architecture §4)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import outcome
import trio

from actors._errors import LifetimeClosedError

log = logging.getLogger("actors")

T = TypeVar("T")


class Lifetime:
    """Something that can end: an owner, or a runtime's teardown.

    Closing it (``close(reason)``, synchronous, idempotent: the first reason wins)
    cancels every wait bound to it; those waits raise :class:`LifetimeClosedError`
    carrying the reason.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.reason: object = None
        self.closed = False
        self._scopes: set[trio.CancelScope] = set()

    def close(self, reason: object) -> None:
        if self.closed:
            return
        self.closed = True
        self.reason = reason
        for scope in list(self._scopes):
            scope.cancel()

    @contextmanager
    def bind(self, scope: trio.CancelScope) -> Any:
        """While the block runs, closing this lifetime cancels ``scope`` (at once if
        it is already closed)."""
        if self.closed:
            scope.cancel()
        self._scopes.add(scope)
        try:
            yield
        finally:
            self._scopes.discard(scope)


class Owner(Lifetime):
    """A lifetime that owns tasks. ``async with Owner(name) as owner:``.

    ``owner.start_soon`` runs a task owned by it. ``aclose(reason)`` closes the
    lifetime (cancelling bound waits), cancels the owned tasks and waits for them;
    leaving the ``async with`` block does the same.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._nursery: trio.Nursery | None = None
        self._cm: Any = None

    async def __aenter__(self) -> Owner:
        self._cm = trio.open_nursery()
        self._nursery = await self._cm.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        self.close("owner exited")
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        result: bool | None = await self._cm.__aexit__(*exc)
        return result

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._nursery is None or self.closed:
            raise LifetimeClosedError(self.name, self.reason)
        self._nursery.start_soon(fn, *args)

    async def aclose(self, reason: object = "owner closed") -> None:
        """Close, cancel owned tasks, and wait for them (idempotent)."""
        self.close(reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


class _Slot(Generic[T]):
    __slots__ = ("abandoned", "delivered", "done", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: outcome.Outcome[T] | None = None
        self.abandoned = False
        self.delivered = False


async def run_abandonable(
    nursery: trio.Nursery,
    operation: Callable[[], Awaitable[T]],
    *,
    dispose: Callable[[T], Awaitable[None]],
    lifetimes: Sequence[Lifetime],
    on_late_error: Callable[[BaseException], None] | None = None,
    name: str = "operation",
) -> T:
    """Run ``operation`` as a child of the long-lived ``nursery``; wait for it here.

    The wait is cancelled by the caller (ordinary Trio cancellation: ``Cancelled``
    propagates) or by any of ``lifetimes`` closing (raises
    :class:`LifetimeClosedError` with the first reason). If a lifetime is already
    closed, the operation is not started.

    Ownership: once the wait is abandoned, the operation's result belongs to the
    child task, which disposes it (shielded: disposal must finish) — exactly once,
    and before ``nursery`` exits. A result delivered in the same moment the wait was
    abandoned is disposed by the caller instead. A failure after abandonment is
    passed to ``on_late_error`` (logged by default), never lost.
    """
    for lt in lifetimes:
        if lt.closed:
            raise LifetimeClosedError(lt.name, lt.reason)
    slot: _Slot[T] = _Slot()

    async def child() -> None:
        result: outcome.Outcome[T] = await outcome.acapture(operation)
        if slot.abandoned:
            if isinstance(result, outcome.Value):
                with trio.CancelScope(shield=True):
                    await dispose(result.value)
            elif isinstance(result, outcome.Error) and not isinstance(result.error, trio.Cancelled):
                (on_late_error or _log_late)(result.error)
            else:
                result.unwrap()
            return
        slot.result = result
        slot.delivered = True
        slot.done.set()

    nursery.start_soon(child, name=f"abandonable:{name}")
    with trio.CancelScope() as scope, bind_all(lifetimes, scope):
        try:
            await slot.done.wait()
        except BaseException:
            await _abandon(slot, dispose)
            raise
    if scope.cancelled_caught and not slot.delivered:
        await _abandon(slot, dispose)
        closed = next((lt for lt in lifetimes if lt.closed), None)
        raise LifetimeClosedError(
            closed.name if closed else name, closed.reason if closed else "abandoned"
        )
    if not slot.delivered:  # pragma: no cover - defensive
        raise RuntimeError("run_abandonable: wait ended without a result")
    assert slot.result is not None
    if scope.cancelled_caught and isinstance(slot.result, outcome.Value):
        # Delivered, but a lifetime closed in the same moment: honour the closure.
        await _dispose_shielded(dispose, slot.result.value)
        closed = next(lt for lt in lifetimes if lt.closed)
        raise LifetimeClosedError(closed.name, closed.reason)
    if isinstance(slot.result, outcome.Error) and isinstance(slot.result.error, trio.Cancelled):
        raise RuntimeError(f"{name} was cancelled by its nursery") from slot.result.error
    return slot.result.unwrap()


async def _abandon(slot: _Slot[T], dispose: Callable[[T], Awaitable[None]]) -> None:
    slot.abandoned = True
    if slot.delivered and isinstance(slot.result, outcome.Value):
        # The child already handed the result over: the caller owns it, so disposes it.
        slot.delivered = False
        value = slot.result.value
        slot.result = None
        await _dispose_shielded(dispose, value)


async def _dispose_shielded(dispose: Callable[[T], Awaitable[None]], value: T) -> None:
    with trio.CancelScope(shield=True):
        await dispose(value)


@contextmanager
def bind_all(lifetimes: Sequence[Lifetime], scope: trio.CancelScope) -> Any:
    """While the block runs, closing any of ``lifetimes`` cancels ``scope``."""
    if not lifetimes:
        yield
        return
    first, *rest = lifetimes
    with first.bind(scope), bind_all(rest, scope):
        yield


def _log_late(exc: BaseException) -> None:
    log.warning("abandoned operation failed late", exc_info=exc)
