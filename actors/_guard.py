"""A guarded block: services opened inside it outlive a cancellation of the enclosing
scope long enough to stop in order (architecture §4, teardown)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

import trio

log = logging.getLogger("actors")


class Guard:
    """What :func:`open_guard` yields. See there for the contract.

    ``cancelled`` says whether a scope enclosing the guard was cancelled (seen by the
    guard's relay); ``overran`` whether the cleanup hit its ``grace`` and was cut short.
    """

    def __init__(self, name: str, grace: float) -> None:
        self.name = name
        self.grace = grace
        self.cancelled = False
        self.overran = False
        self._callbacks: list[Callable[[], None]] = []
        self._body: trio.CancelScope | None = None
        self._body_done = False
        self._shield: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._watchdog = trio.CancelScope(shield=True)
        self._body_error: BaseException | None = None

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (synchronously, in registration order) when an enclosing
        scope is cancelled while the body runs, *before* the body is cancelled: it can
        give the work the body is doing its own cause first. A raise is logged."""
        self._callbacks.append(callback)

    @contextmanager
    def body(self) -> Iterator[None]:
        """The cancellable part: enter it once, after the services were opened.

        An enclosing cancellation reaches the body here (relayed: the callbacks run,
        then this scope is cancelled); the body's ``Cancelled`` ends at this block.
        Any other exception of the body is kept and re-raised by :func:`open_guard`
        once the services are closed, so they close as after a normal exit. Leaving
        the block starts the cleanup's ``grace``.
        """
        try:
            with trio.CancelScope() as scope:
                self._body = scope
                if self.cancelled:
                    scope.cancel()
                yield
        except (trio.Cancelled, GeneratorExit):
            raise  # not ours to postpone: some scope inside the guard cancelled it
        except BaseException as exc:
            self._body_error = exc
        finally:
            self._body = None
            self._body_done = True
            self._start_watchdog()

    def _start_watchdog(self) -> None:
        if self._nursery is not None and self._shield is not None:
            self._nursery.start_soon(self._watch, self._shield, name=f"{self.name} cleanup watchdog")

    async def _watch(self, shield: trio.CancelScope) -> None:
        """The cleanup's bound: cancel ``shield`` (the guard's own scope) once
        ``grace`` has passed. Owned by the guard's nursery; shielded (the enclosing
        scope may well be cancelled by now), it ends only when it fires or when the
        guard closes (``_watchdog.cancel()``)."""
        # Both clocks, as run_bounded: under an autojump clock, a cleanup waiting on a
        # worker thread must not look like an overrun.
        with self._watchdog:
            started = time.monotonic()
            while True:
                await trio.sleep(max(self.grace - (time.monotonic() - started), 0.0))
                if time.monotonic() - started >= self.grace:
                    self.overran = True
                    log.warning("%s: cleanup did not finish within %g s; cancelling it", self.name, self.grace)
                    shield.cancel()
                    return

    async def _relay(self) -> None:
        """Runs in the guard's nursery, outside the shield, so that an enclosing
        cancellation reaches it: it relays it (callbacks, then the body's scope) and
        returns. The guard closing cancels it too (then it only returns)."""
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            # Kept, not re-raised: open_guard raises the enclosing cancellation itself
            # once the cleanup is done (a Cancelled from this task would reach the
            # caller wrapped in the nursery's exception group).
            if self._nursery is not None and self._nursery.cancel_scope.cancel_called:
                return  # the guard closing, not an enclosing cancellation
            self.cancelled = True
            if self._body_done:
                return  # the cleanup is under way: it goes on, shielded
            for callback in list(self._callbacks):
                try:
                    callback()
                except Exception:
                    log.exception("%s: an on_cancel callback failed", self.name)
            if self._body is not None:
                self._body.cancel()


@asynccontextmanager
async def open_guard(name: str, *, grace: float) -> AsyncIterator[Guard]:
    """Open services that must stop in order even when an enclosing scope is cancelled.

    Use::

        async with open_guard("runtime", grace=30.0) as guard:
            async with open_services() as services:   # shielded: survives the cancel
                with guard.body():
                    yield services                    # cancellable, as usual
            # services closed here, in order, shielded

    Cancellation: everything inside the guard runs shielded from the enclosing scopes
    (a service's tasks must not be cancelled together with the body: they are what
    the body's cleanup talks to). A relay task outside the shield watches the
    enclosing scope: when it is cancelled, the ``on_cancel`` callbacks run, then the
    body's scope is cancelled; the services then close as after a normal exit (the
    body's ``Cancelled`` ends at :meth:`Guard.body`). The cleanup — everything after
    the body — is bounded by ``grace`` seconds (both clocks): past it the shield's
    own scope is cancelled (logged), so what is still unshielded inside the services'
    exits ends at once. Then, outside the guard, the body's exception if it raised
    one (unwrapped, as it was raised), else a cleanup error, else the enclosing
    ``Cancelled``, propagates — a cleanup error raised while a body's error is
    pending takes over, with the body's error as its ``__context__``; a cleanup
    error that the services' nurseries wrapped in exception groups is unwrapped
    when it is the only one.

    An enclosing cancellation while the services open (before the body) does not
    interrupt the opening; the body then starts cancelled. The body sees the
    enclosing cancellation relayed, one scheduler step late, and not the enclosing
    deadlines (:func:`trio.current_effective_deadline` inside is the guard's).
    """
    if grace <= 0:
        raise ValueError(f"{name}: the cleanup grace must be a positive number of seconds, got {grace!r}")
    guard = Guard(name, grace)
    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        guard._nursery = nursery
        nursery.start_soon(guard._relay, name=f"{name} cancellation relay")
        try:
            with trio.CancelScope(shield=True) as shield:
                guard._shield = shield
                yield guard
        except GeneratorExit:
            raise
        except BaseException as exc:
            # Raised after the nursery has closed, so the caller gets it unwrapped; a
            # lone error the services' own nurseries wrapped is unwrapped as well.
            leaves = _leaves(exc)
            error = leaves[0] if len(leaves) == 1 else exc
        finally:
            guard._shield = None
            guard._watchdog.cancel()
            nursery.cancel_scope.cancel()
    body_error = guard._body_error
    if error is not None:
        if body_error is not None and error.__context__ is None and error is not body_error:
            error.__context__ = body_error
        raise error
    if body_error is not None:
        raise body_error
    await trio.lowlevel.checkpoint_if_cancelled()


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]
