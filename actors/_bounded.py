"""Bounded waits that hold under a virtual clock too."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import trio


async def run_bounded(fn: Callable[[], Awaitable[object]], seconds: float, *, shield: bool = False) -> bool:
    """Run ``fn()``; give up on it once ``seconds`` have passed. True if it finished.

    The bound is on both clocks: it expires only when ``seconds`` have passed on
    the Trio clock *and* in wall-clock time. Under a virtual clock that jumps
    whenever every task is blocked (``trio.testing.MockClock`` with autojump, as
    pytest-trio's ``autojump_clock`` sets up), a wait on a worker thread would
    otherwise look like an overrun the moment the clock jumps; real overruns (a
    wedged handler, a provider that never closes) still end after ``seconds``.

    Giving up cancels ``fn`` (it runs in a cancel scope). ``shield=True`` protects
    ``fn`` from the caller's cancellation, so the bound is the only way it ends
    early: use it for cleanup that should finish but must not hang forever.
    Without ``shield``, a cancelled caller gets ``Cancelled`` as usual (a bare one,
    never a group).
    """
    started = time.monotonic()
    finished = False
    with trio.CancelScope(shield=shield) as scope:
        try:
            async with trio.open_nursery() as nursery:

                async def watchdog() -> None:
                    while True:
                        await trio.sleep(max(seconds - (time.monotonic() - started), 0.0))
                        if time.monotonic() - started >= seconds:
                            scope.cancel()
                            return

                nursery.start_soon(watchdog, name="run_bounded watchdog")
                await fn()
                finished = True
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The watchdog only ever raises Cancelled (when the caller is cancelled).
            # The caller gets what fn raised, unwrapped: fn's one exception if it
            # raised one (the caller's cancellation, level-triggered, lands at its
            # next checkpoint), else a bare Cancelled.
            cancelled, rest = group.split(trio.Cancelled)
            if rest is None:
                assert cancelled is not None
                raise _leaves(cancelled)[0] from None
            leaves = _leaves(rest)
            if len(leaves) == 1:
                raise leaves[0] from leaves[0].__cause__
            raise
    return finished


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]
