"""Lifetimes (owner, teardown) and run_abandonable (architecture §4)."""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import outcome
import trio

from actors._errors import LifetimeClosedError

log = logging.getLogger("actors")

T = TypeVar("T")

# The order in which lifetimes closed, process-wide: "first canceller wins" compares it.
_close_order = itertools.count()


class Lifetime:
    """Something that can end: an owner, or a runtime's teardown.

    Closing it (``close(reason)``, synchronous, idempotent: the first reason wins)
    cancels every wait bound to it; those waits raise :class:`LifetimeClosedError`
    carrying the reason. ``closed_order`` says when it closed relative to every other
    lifetime of the process (``None`` while open): a wait bound to several reports
    the one that closed first (:meth:`first_closed`).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.reason: object = None
        self.closed = False
        self.closed_order: int | None = None
        self._scopes: set[trio.CancelScope] = set()

    @staticmethod
    def first_closed(lifetimes: Sequence[Lifetime]) -> Lifetime | None:
        """The lifetime of ``lifetimes`` that closed first (``None`` if none did)."""
        closed = [lt for lt in lifetimes if lt.closed]
        return min(closed, key=lambda lt: lt.closed_order or 0, default=None)

    def close(self, reason: object) -> None:
        if self.closed:
            return
        self.closed = True
        self.closed_order = next(_close_order)
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


def _lone(group: BaseExceptionGroup[BaseException], body: BaseException) -> bool:
    """Whether ``group`` holds ``body`` and, besides it, only ``Cancelled``."""
    seen = False
    pending = [group]
    while pending:
        for exc in pending.pop().exceptions:
            if exc is body:
                seen = True
            elif isinstance(exc, BaseExceptionGroup):
                pending.append(exc)
            elif not isinstance(exc, trio.Cancelled):
                return False
    return seen


class Owner(Lifetime):
    """A lifetime that owns tasks and cleanups. ``async with Owner(name) as owner:``.

    ``owner.start_soon`` runs a task owned by it, in a nursery of its own: closing
    the owner cancels those tasks, never the body of the ``async with`` that opened
    it. ``owner.defer(cleanup)`` registers an async cleanup (e.g. detaching a
    resource it owns) that runs when the owner closes. ``aclose(reason)`` closes the
    lifetime (cancelling bound waits), cancels the owned tasks and waits until they
    and every cleanup have ended; leaving the ``async with`` block does the same.

    ``parent``: an owner opened with a parent is closed (and waited for) by its
    parent's close, as one of the parent's cleanups; :meth:`descends_from` follows
    the chain (scope routing uses it).

    An exception raised by the body leaves the ``async with`` as it was raised, not
    wrapped in an exception group (only a failure of an owned task makes a group), so
    ``except SessionOwnerClosedError:`` around the block catches what its body raised.
    """

    def __init__(self, name: str, *, parent: Owner | None = None) -> None:
        super().__init__(name)
        self.parent = parent
        self._tasks: trio.Nursery | None = None
        self._host_task: trio.lowlevel.Task | None = None
        self._ended = trio.Event()
        self._cm: Any = None
        # Insertion-ordered, O(1) removal: popitem() yields the newest cleanup first.
        self._cleanups: dict[int, tuple[str, Callable[[], Awaitable[object]]]] = {}
        self._cleanup_ids = itertools.count()
        self._leave_parent: Callable[[], None] | None = None

    @property
    def is_open(self) -> bool:
        """Entered and not closed: it can own new tasks and cleanups."""
        return self._tasks is not None and not self.closed

    def descends_from(self, other: Lifetime) -> bool:
        """Whether ``other`` is this owner or one of its parents."""
        owner: Owner | None = self
        while owner is not None:
            if owner is other:
                return True
            owner = owner.parent
        return False

    async def __aenter__(self) -> Owner:
        parent = self.parent
        if parent is not None:
            # Refused (LifetimeClosedError) when the parent is closed or not open.
            self._leave_parent = parent.defer(
                lambda: self.aclose(parent.reason), name=f"child owner {self.name!r}"
            )
        self._cm = trio.open_nursery()
        outer: trio.Nursery = await self._cm.__aenter__()
        try:
            self._tasks = await outer.start(self._host)
        except BaseException:
            self._drop_parent()
            await self._cm.__aexit__(*sys.exc_info())
            raise
        return self

    async def _host(self, task_status: trio.TaskStatus[trio.Nursery] = trio.TASK_STATUS_IGNORED) -> None:
        """The owner's own task: holds the nursery of its tasks and, once the owner is
        closed or cancelled from outside, runs the cleanups (shielded) while the tasks
        are cancelled. Ends when both are done (``_ended``)."""
        self._host_task = trio.lowlevel.current_task()
        try:
            async with trio.open_nursery() as tasks:
                task_status.started(tasks)
                try:
                    await trio.sleep_forever()
                finally:
                    # Closed, or the scope around the owner was cancelled: either way
                    # the owner ends here, and what it owns is released completely.
                    self.close("owner cancelled")
                    with trio.CancelScope(shield=True):
                        await self._run_cleanups()
        finally:
            self._ended.set()

    async def _run_cleanups(self) -> None:
        """Newest first, one at a time; the caller shields it. A cleanup deferred while
        they run is refused (the owner is closed), so the loop ends."""
        while self._cleanups:
            _, (name, cleanup) = self._cleanups.popitem()
            try:
                await cleanup()
            except Exception:
                log.exception("owner %r: cleanup %s failed", self.name, name)

    async def __aexit__(self, *exc: Any) -> bool | None:
        self.close("owner exited")
        body: BaseException | None = exc[1] if len(exc) > 1 else None
        unwrapped: BaseException | None = None
        try:
            result: bool | None = await self._cm.__aexit__(*exc)
        except BaseExceptionGroup as group:
            # The owner's nursery spans the body only to host the owner's own task: an
            # exception of the body comes out as it was raised (a typed error stays
            # catchable by its type), unless an owned task failed too.
            if body is None or not _lone(group, body):
                raise
            unwrapped = body
        finally:
            self._drop_parent()
        if unwrapped is not None:
            raise unwrapped
        return result

    def _drop_parent(self) -> None:
        if self._leave_parent is not None:
            self._leave_parent()
            self._leave_parent = None

    def close(self, reason: object) -> None:
        """Close the lifetime (cancelling bound waits) and cancel the owned tasks, at
        once and without waiting (synchronous, idempotent: the first reason wins);
        the cleanups start right after, in the owner's own task. :meth:`aclose` also
        waits for the tasks and the cleanups to end."""
        super().close(reason)
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None:
        """Run ``fn(*args)`` as a task owned by this owner (cancelled when it closes).

        Raises :class:`LifetimeClosedError` once the owner is closed (or before it
        was entered).
        """
        if self._tasks is None or self.closed:
            raise LifetimeClosedError(self.name, self.reason)
        self._tasks.start_soon(fn, *args, name=name)

    def defer(self, cleanup: Callable[[], Awaitable[object]], *, name: str = "cleanup") -> Callable[[], None]:
        """Run ``await cleanup()`` when this owner closes; return an idempotent remover
        (call it when what the cleanup releases was released another way).

        Cleanups run one at a time, newest first, shielded, in the owner's own task,
        while its owned tasks are being cancelled; :meth:`aclose` and the end of the
        ``async with`` wait for all of them. A cleanup's ``Exception`` is logged and
        the next one runs. Synchronous: raises :class:`LifetimeClosedError` once the
        owner is closed (or before it was entered), so a resource registered here
        without an error is certain to be released by the close.
        """
        if not self.is_open:
            raise LifetimeClosedError(self.name, self.reason if self.closed else "not entered")
        key = next(self._cleanup_ids)
        self._cleanups[key] = (name, cleanup)

        def remove() -> None:
            self._cleanups.pop(key, None)

        return remove

    async def aclose(self, reason: object = "owner closed") -> None:
        """Close, cancel the owned tasks, and wait until they and the cleanups have
        ended (idempotent).

        Called from inside one of the owner's own tasks or cleanups it does not wait
        (that task is itself being cancelled, or is the one running the cleanups;
        waiting for it would never end). Cancelling the caller abandons the wait only:
        the owned tasks are cancelled and the cleanups run regardless.
        """
        self.close(reason)
        tasks = self._tasks
        if tasks is None:
            return
        if trio.lowlevel.current_task() is not self._host_task and not _inside(tasks):
            await self._ended.wait()


def _inside(nursery: trio.Nursery) -> bool:
    """Whether the current task runs (directly or not) in ``nursery``."""
    task: trio.lowlevel.Task | None = trio.lowlevel.current_task()
    while task is not None:
        parent = task.parent_nursery
        if parent is None:
            return False
        if parent is nursery:
            return True
        task = parent.parent_task
    return False


class _Slot(Generic[T]):
    __slots__ = ("abandoned", "delivered", "done", "result", "scope")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: outcome.Outcome[T] | None = None
        self.abandoned = False
        self.delivered = False
        self.scope: trio.CancelScope | None = None


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
    :class:`LifetimeClosedError` naming the lifetime that closed *first*, with its
    reason). If a lifetime is already closed, the operation is not started.

    Abandoning the wait cancels the operation. Ownership: if it still produces a
    result (a shielded step or a worker thread cannot be interrupted), the result
    belongs to the child task, which disposes it (shielded: disposal must finish) —
    exactly once, and before ``nursery`` exits. A result delivered in the same
    moment the wait was abandoned is disposed by the caller instead. After
    abandonment, an ``Exception`` from the operation is passed to ``on_late_error``
    (logged by default), never lost; a ``BaseException`` that is not the
    cancellation (``KeyboardInterrupt``, ``SystemExit``, a group holding one)
    propagates into ``nursery``, as Trio propagates it anywhere else.
    """
    first = Lifetime.first_closed(lifetimes)
    if first is not None:
        raise LifetimeClosedError(first.name, first.reason)
    slot: _Slot[T] = _Slot()

    async def child() -> None:
        if slot.abandoned:
            return  # abandoned before it started: never run it
        result: outcome.Outcome[T] | None = None
        try:
            with trio.CancelScope() as scope:
                slot.scope = scope
                try:
                    result = outcome.Value(await operation())
                except BaseException as exc:
                    if _is_cancellation(exc):
                        raise  # ours (absorbed by the scope) or the nursery's
                    result = outcome.Error(exc)
        finally:
            slot.scope = None
            if result is None and not slot.abandoned:
                # Cancelled by the nursery itself, not by an abandonment: the waiter
                # must not hang.
                slot.result = outcome.Error(RuntimeError(f"{name} was cancelled by its nursery"))
                slot.delivered = True
                slot.done.set()
        if result is None:
            return  # cancelled because it was abandoned: nothing to dispose
        if slot.abandoned:
            if isinstance(result, outcome.Value):
                await _dispose_shielded(dispose, result.value)
                return
            error: BaseException | None = result.error
            if isinstance(error, BaseExceptionGroup):
                # The operation's own nursery may mix our cancellation with its
                # failures: the cancellation was ours, the failures are reported.
                error = error.split(trio.Cancelled)[1]
            if error is None:
                return
            if isinstance(error, Exception):
                (on_late_error or _log_late)(error)
                return
            raise error  # KeyboardInterrupt and friends are not ours to swallow
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
        closed = Lifetime.first_closed(lifetimes)
        raise LifetimeClosedError(
            closed.name if closed else name, closed.reason if closed else "abandoned"
        )
    if not slot.delivered:  # pragma: no cover - defensive
        raise RuntimeError("run_abandonable: wait ended without a result")
    assert slot.result is not None
    if scope.cancelled_caught and isinstance(slot.result, outcome.Value):
        # Delivered, but a lifetime closed in the same moment: honour the closure.
        await _dispose_shielded(dispose, slot.result.value)
        first = Lifetime.first_closed(lifetimes)
        assert first is not None
        raise LifetimeClosedError(first.name, first.reason)
    return slot.result.unwrap()


def _is_cancellation(exc: BaseException) -> bool:
    """``Cancelled``, or a group made only of ``Cancelled`` (a cancelled nursery)."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return False


async def _abandon(slot: _Slot[T], dispose: Callable[[T], Awaitable[None]]) -> None:
    slot.abandoned = True
    if slot.scope is not None:
        slot.scope.cancel()
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
