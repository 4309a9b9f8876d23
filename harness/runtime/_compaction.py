"""Compaction owned by the session actor (architecture §2, compaction reference §1).

The actor opens the bracket (``compaction/start``), runs the summarizer as one of its
child tasks while it keeps serving appends and reads, commits through one atomic
message, and always closes the bracket: on a summary failure, an unstable surface, a
refused commit, a cancelled caller, or the actor's own stop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

from harness.compaction import SummarizationInput, SummaryOutput, check_shrink
from harness.compaction._summarize import check_output_content
from harness.compaction._transaction import CompactionResult, Transaction, framed_checkpoint
from harness.errors import (
    ManualCompactionError,
    SessionNotLiveError,
    SummaryCancelledError,
    SurfaceChangedError,
)

Summarizer = Callable[[SummarizationInput], Awaitable[SummaryOutput]]

#: Seconds a cancelled caller waits (shielded) for the bracket to close.
CLOSE_GRACE: Final = 30.0


class CompactionTicket:
    """The caller's side of one open compaction: resolved exactly once, when the
    bracket closes (committed or not)."""

    __slots__ = (
        "_done",
        "_scope",
        "abort_check",
        "cancel_reason",
        "closed",
        "compaction_id",
        "failure",
        "result",
        "stage",
    )

    def __init__(self, compaction_id: str) -> None:
        self.compaction_id = compaction_id
        self._done = trio.Event()
        self._scope = trio.CancelScope()  # the summarizer child runs in it
        self.result: CompactionResult | None = None
        self.failure: BaseException | None = None
        self.stage = "summary"
        self.cancel_reason: object = None
        # Whether the bracket got its end (success or error): only then is a manual
        # run's flush due (§1.2 step 9; a failed error end leaves it open).
        self.closed = False
        self.abort_check: Callable[[], bool] | None = None

    async def wait(self) -> None:
        """Wait until the bracket is closed. Cancellation: only the wait."""
        await self._done.wait()

    def cancel(self, reason: object) -> None:
        """Cancel the summarizer (the first reason wins); the bracket still closes."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self._scope.cancel()

    def resolve(
        self, result: CompactionResult | None, failure: BaseException | None, stage: str, *, closed: bool
    ) -> None:
        if self._done.is_set():
            return
        self.result, self.failure, self.stage, self.closed = result, failure, stage, closed
        self._done.set()


async def run_summarizer(
    txn: Transaction, ticket: CompactionTicket, summarizer: Summarizer
) -> tuple[SummaryOutput | None, dict[str, Any] | None, BaseException | None]:
    """The child task's work: summarize, frame, shrink-check. Never raises an
    ``Exception``: the failure is returned for the actor to record in the bracket.

    Cancellation: ``ticket.cancel`` ends it with a :class:`SummaryCancelledError` failure; the
    actor's own stop cancels it with ``trio.Cancelled`` (propagated)."""
    assert txn.input is not None
    output: SummaryOutput | None = None
    failure: BaseException | None = None
    framed: dict[str, Any] | None = None
    with ticket._scope:
        try:
            output = await summarizer(txn.input)
            check_output_content(output)
            framed = framed_checkpoint(txn, output)
            check_shrink(framed, txn.shadowed_token_count)
        except Exception as exc:
            failure = exc
    if ticket._scope.cancelled_caught and failure is None and framed is None:
        failure = SummaryCancelledError(f"compaction {txn.compaction_id} cancelled: {ticket.cancel_reason}")
    return output, framed, failure


def outcome(ticket: CompactionTicket, *, manual: bool, session_id: str) -> CompactionResult:
    """The caller's answer once the bracket closed (§1.2 steps 11-13): the result, the
    raw error (automatic runs) or the classified :class:`ManualCompactionError`."""
    if ticket.failure is None:
        assert ticket.result is not None
        return ticket.result
    error = ticket.failure
    if not manual:
        raise error
    if isinstance(error, ManualCompactionError):
        raise error
    if ticket.stage == "commit":
        kind = "commit"
    elif isinstance(error, SurfaceChangedError):
        kind = "changed"
    elif isinstance(error, SummaryCancelledError):
        kind = "cancelled"
    elif isinstance(error, SessionNotLiveError):
        kind = "commit"
    else:
        kind = "summary"
    raise ManualCompactionError.of(kind, f"manual compaction failed: {error}", cause=error, session_id=session_id)
