"""The per-runtime warnings channel: failures the runtime contains instead of raising.

A listener that raises after a commit cannot fail the append it observed, and a
background write that fails cannot fail anyone's call (its events are retained and
the next flush reports it). Both used to reach only :mod:`logging`, which is
process-wide: an application running two runtimes could not tell whose failure it
was, nor react to one without parsing log text. Each store now owns a
:class:`Warnings` channel; every contained failure is logged *and* reported to the
channel's subscribers as a :class:`WarningReport`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal, TypeAlias, final

import attrs

from harness.runtime._subscribe import refuse_awaitable, subscribe_sync

log = logging.getLogger("harness.warnings")

WarningKind: TypeAlias = Literal["listener-failed", "write-failed"]
"""``listener-failed``: a contained listener raised (``source`` names the event it
was listening to). ``write-failed``: a write-behind write, retirement or lease release
failed in the background (``source`` says which)."""


@final
@attrs.frozen(slots=True, eq=False)
class WarningReport:
    """One contained failure.

    Attributes:
        kind: ``listener-failed`` or ``write-failed`` (stable, for matching).
        source: What failed, e.g. ``session/event``, ``session/disposed``,
            ``agent/disposed``, ``agent/status``, ``agent/request-error`` (a hook),
            ``agent/queued-work`` (a bug under a queued turn), ``agent/compaction``
            (a compaction hook: step pressure, overflow recovery),
            ``background-write``, ``retirement``, ``close`` (a session whose last
            events the persistence's close could not make durable).
        message: The text that was logged.
        session_id: The session concerned, when there is one.
        error: The exception, when there is one. Holding it keeps its traceback (and
            the frames it names) alive: keep what you need, not the report.
    """

    kind: WarningKind
    source: str
    message: str
    session_id: str | None = None
    error: BaseException | None = None


WarningListener: TypeAlias = Callable[[WarningReport], None]


@final
class Warnings:
    """A store's warnings channel (``store.warnings``, ``runtime.warnings``).

    Subscribers are synchronous callables, called in subscription order right where
    the failure was contained (so a subscriber may read the live state it concerns).
    To consume reports from a task instead, forward them into a memory channel::

        send, receive = trio.open_memory_channel[WarningReport](100)
        unsubscribe = runtime.warnings.subscribe(lambda r: send.send_nowait(r))

    (``send_nowait`` raises ``trio.WouldBlock`` when the buffer is full: that failure
    is contained like any subscriber's.) A subscriber that raises is logged on the
    ``harness.warnings`` logger and never reported to the channel (no feedback loop).
    """

    __slots__ = ("_subscribers",)

    def __init__(self) -> None:
        self._subscribers: list[WarningListener] = []

    def subscribe(self, listener: WarningListener) -> Callable[[], None]:
        """Call ``listener`` with every later report; return an idempotent unsubscribe.

        Raises:
            AsyncListenerError: ``listener`` is an async callable (``ASYNC_LISTENER``).
        """
        return subscribe_sync("runtime warnings", self._subscribers, listener)

    def report(
        self,
        logger: logging.Logger,
        kind: WarningKind,
        source: str,
        message: str,
        *,
        session_id: str | None = None,
        error: BaseException | None = None,
        level: int = logging.WARNING,
        traceback: bool = False,
    ) -> None:
        """Log ``message`` on ``logger`` at ``level`` (with ``error``'s traceback when
        ``traceback``), then tell every subscriber."""
        logger.log(level, "%s", message, exc_info=error if traceback and error is not None else None)
        if not self._subscribers:
            return
        warning = WarningReport(kind, source, message, session_id, error)
        for listener in list(self._subscribers):
            try:
                result: object = listener(warning)
                if result is not None:
                    refuse_awaitable("runtime warnings", listener, result)
            except Exception:
                log.exception("a runtime warnings subscriber failed")

