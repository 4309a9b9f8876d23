"""``ExploreCheckpoints``: explore a test body at every checkpoint, the ``caller``
canceller bound, and fail on a violation. The ``harness.testing`` plugin's
``explore_checkpoints`` fixture and the ``explore`` marker (``_pytest``) both run it; it
lives here, below the plugin, so the marker's hooks need not import the plugin."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from harness.faults._explore import Probe, Settings, explore
from harness.faults._report import ExploreReport


class ExploreCheckpoints:
    """``explore_checkpoints(body, **options)``: run ``async def body(probe)`` with a
    cancellation injected before every scheduler step (:func:`harness.faults.explore`),
    assert that no attempt violated anything, and return the report.

    The body runs inside a cancel scope bound as the ``caller`` canceller and, with
    ``arm=True`` (the default), the probe is armed before it starts: every step of the
    body counts. With ``arm=False`` the body calls ``probe.arm()`` itself (after its
    setup). The body records its own checks with ``probe.check(cond, msg)`` and may bind
    more cancellers with ``probe.canceller(name, action)``.

    ``seeds``, ``stride``, ``max_steps``, ``cancellers``, ``settings``, ``allowed``,
    ``max_attempts`` and ``max_seconds`` go to ``explore`` (default settings:
    ``Settings(autojump_threshold=0.0)``, mock time). A violation fails with the
    report's grouped summary (``str(report)``); ``check=False`` returns the report
    without asserting. Call it from a synchronous
    test: each attempt is a ``trio.run`` of its own (from an async test it works but
    blocks the test's loop while it runs).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.reports: list[ExploreReport] = []

    def __call__(
        self,
        body: Callable[[Probe], Awaitable[object]],
        *,
        name: str | None = None,
        arm: bool = True,
        seeds: int | Sequence[int] | None = None,
        stride: int = 1,
        max_steps: int | None = None,
        cancellers: Sequence[str] | None = None,
        settings: Settings | None = None,
        check: bool = True,
        allowed: Sequence[type[BaseException]] | None = None,
        max_attempts: int | None = None,
        max_seconds: float | None = None,
    ) -> ExploreReport:
        async def scenario(probe: Probe) -> None:
            with trio.CancelScope() as caller:
                probe.canceller("caller", caller.cancel)
                if arm:
                    probe.arm()
                await body(probe)
            probe.disarm()

        report = explore(
            scenario,
            name=name or getattr(body, "__name__", None) or self.name,
            seeds=seeds,
            stride=stride,
            max_steps=max_steps,
            cancellers=cancellers,
            settings=settings or Settings(autojump_threshold=0.0),
            allowed=allowed,
            max_attempts=max_attempts,
            max_seconds=max_seconds,
        )
        self.reports.append(report)
        if check and not report.ok:
            raise AssertionError(str(report))
        return report
