"""The compaction transaction's synchronous steps (reference §1, §3).

Everything here is a plain function over a :class:`~harness.session.Session`: the
range validation, the lock and owner checks, ``prepare``, the stability checks and
the drafts of every bracket event. The session actor runs them inside its messages,
so each step is atomic with respect to the session's other writers; the summarizer,
the one slow step, runs between two messages (see ``harness.runtime``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Final, Literal

import attrs

from harness.compaction._framing import SummarizationInput, frame_checkpoint, summarization_input
from harness.compaction._measure import NodeTokens, measure, span_tokens
from harness.compaction._pairing import tool_pairing_balanced_after, tool_pairing_balanced_before
from harness.compaction._summarize import SummaryOutput
from harness.errors import CompactionError, ManualCompactionError, SurfaceChangedError
from harness.session import EventDraft, ReplaceOp, Session, thaw
from harness.session._session import _NO_TURN

Stability = Literal["whole-surface", "selected-span"]

START: Final = "compaction/start"
SUMMARY: Final = "compaction/summary"
END: Final = "compaction/end"


@attrs.frozen(slots=True)
class CompactionResult:
    """A committed compaction (the reference's ``CompactionResult``)."""

    compaction_id: str
    source_command_id: str | None
    start_seq: int
    summary_seq: int
    end_seq: int
    summary: tuple[Any, ...]
    shadowed_range: tuple[int, int]
    shadowed_seqs: tuple[int, ...]
    shadowed_token_count: int


@attrs.frozen(slots=True)
class LockState:
    """What the backward scan of §1.2 step 3 finds."""

    open_turn: int | None
    unmatched_start: int | None  # seq of the latest compaction/start not yet ended
    end_seed: int  # seq of the newest session/end-seed (-1: none)

    @property
    def locked(self) -> bool:
        """A live lock: an unmatched start newer than every end-seed (§1.4: an older
        one was left by an earlier lifecycle and is stale)."""
        return self.unmatched_start is not None and self.unmatched_start > self.end_seed


@attrs.define(slots=True)
class Transaction:
    """One open bracket, owned by the session actor from ``begin`` to its end."""

    compaction_id: str
    source_command_id: str | None
    turn: int | None  # the owner: the open turn, or None for a standalone manual run
    start: int  # the region's first and last surface seqs
    end: int
    stability: Stability
    start_seq: int = -1
    shadowed_seqs: tuple[int, ...] = ()
    shadowed_token_count: int = 0
    surface_nodes: tuple[NodeTokens, ...] = ()  # the whole surface as prepared
    span_nodes: tuple[NodeTokens, ...] = ()
    generation: int = -1  # the surface's replace generation as prepared
    input: SummarizationInput | None = None


def validate_region(session: Session, start: int, end: int) -> None:
    """§1.2 step 2, in order; raises :class:`CompactionError` (nothing is written)."""
    nodes = session.surface_snapshot()
    try:
        i = nodes.index(start)
    except ValueError:
        raise CompactionError(f"compactRegion: start seq {start} not found in surface", session_id=session.id) from None
    try:
        j = nodes.index(end)
    except ValueError:
        raise CompactionError(f"compactRegion: end seq {end} not found in surface", session_id=session.id) from None
    if i > j:
        raise CompactionError(
            f"compactRegion: start seq {start} (position {i}) is after end seq {end} (position {j}) on the surface",
            session_id=session.id,
        )
    if not tool_pairing_balanced_before(session, start):
        raise CompactionError(
            f"compactRegion: start seq {start} is not a balanced boundary (would split a step's tool-call/result pair)",
            session_id=session.id,
        )
    if not tool_pairing_balanced_after(session, end):
        raise CompactionError(
            f"compactRegion: end seq {end} is not a balanced boundary (would split a step, or the step is still open)",
            session_id=session.id,
        )


def lock_state(session: Session) -> LockState:
    """The three independent facts of §1.2 step 3: the open turn, an unmatched
    ``compaction/start`` and the newest ``session/end-seed``. O(log turns): the session
    keeps the seqs of its turn markers, its latest bracket event and its newest end-seed."""
    last = session.seq - 1
    turn = session.open_turn_at(last) if last >= 0 else _NO_TURN
    open_turn = int(turn) if turn is not _NO_TURN and type(turn) is int else None
    bracket, end_seed = session.compaction_marks()
    unmatched = bracket if bracket >= 0 and session.type_at(bracket) == START else None
    return LockState(open_turn, unmatched, end_seed)


def begin(
    session: Session,
    start: int,
    end: int,
    *,
    manual: bool,
    stability: Stability,
    source_command_id: str | None = None,
    compaction_id: str | None = None,
) -> tuple[Transaction, EventDraft]:
    """§1.2 steps 2-6: validate, check the lock and the owner, and return the
    transaction with the ``compaction/start`` draft to append (the caller appends it
    in the same atomic step and then calls :func:`prepare`).

    Raises :class:`CompactionError` for a bad range or an automatic run outside a turn,
    ``ManualCompactionError("busy")`` for a live lock (every path) or a manual run
    during an open turn. Nothing is written."""
    validate_region(session, start, end)
    lock = lock_state(session)
    if lock.locked:
        raise ManualCompactionError.of(
            "busy",
            "compaction: compaction already in progress; the session compaction lock is already active",
            session_id=session.id,
        )
    if manual and lock.open_turn is not None:
        raise ManualCompactionError.of(
            "busy", "manual compaction: the session already has an open turn", session_id=session.id
        )
    if not manual and lock.open_turn is None:
        raise CompactionError(
            "compactRegion: no open turn — automatic compaction events must be enclosed in a turn",
            session_id=session.id,
        )
    txn = Transaction(
        compaction_id=compaction_id or str(uuid.uuid4()),
        source_command_id=source_command_id,
        turn=None if manual else lock.open_turn,
        start=start,
        end=end,
        stability=stability,
    )
    data: dict[str, Any] = {"compactionId": txn.compaction_id}
    if source_command_id is not None:
        data["sourceCommandId"] = source_command_id
    data["turn"] = txn.turn
    return txn, EventDraft(START, data)


def prepare(session: Session, txn: Transaction) -> None:
    """§3.1: measure once, take the selected span's nodes and their token count, and
    build the summarizer's input from that snapshot."""
    measurement = measure(session)
    nodes = measurement.nodes
    surface = session.surface_snapshot()
    i, j = surface.index(txn.start), surface.index(txn.end)
    span = nodes[i : j + 1]
    if tuple(n.seq for n in span) != surface[i : j + 1]:
        raise SurfaceChangedError(
            "compaction: selected surface changed before summarization began", session_id=session.id
        )
    txn.span_nodes = span
    txn.surface_nodes = nodes
    txn.generation = measurement.generation
    txn.shadowed_seqs = tuple(n.seq for n in span)
    txn.shadowed_token_count = sum(n.tokens for n in span)
    txn.input = summarization_input(session, txn.shadowed_seqs)


def check_stable(session: Session, txn: Transaction) -> None:
    """§3.2 (whole surface) or §3.3 (selected span); raises :class:`SurfaceChangedError`."""
    sid = session.id
    if txn.stability == "whole-surface":
        # Every node as prepared, deep-equal (§3.2): events are immutable and their
        # prices fixed, and in one replace generation the surface only grows at its
        # end, so "no replace and no new node" is exactly that check, in O(1).
        if session.generation != txn.generation or len(session.surface) != len(txn.surface_nodes):
            raise SurfaceChangedError("compaction: session surface changed during summarization", session_id=sid)
        return
    try:
        validate_region(session, txn.start, txn.end)
    except CompactionError as exc:
        raise SurfaceChangedError(
            "compaction: the selected span is no longer a valid replacement target", session_id=sid
        ) from exc
    surface = session.surface_snapshot()
    span = surface[surface.index(txn.start) : surface.index(txn.end) + 1]
    if span != txn.shadowed_seqs:
        raise SurfaceChangedError("compaction: the selected span changed during summarization", session_id=sid)
    if span_tokens(session, span) != txn.span_nodes:
        raise SurfaceChangedError("compaction: the selected span was rewritten during summarization", session_id=sid)


def framed_checkpoint(txn: Transaction, output: SummaryOutput) -> dict[str, Any]:
    """The checkpoint message for ``output`` (§1.1)."""
    return frame_checkpoint(output.summary, txn.compaction_id, txn.source_command_id)


def commit_drafts(
    session: Session, txn: Transaction, output: SummaryOutput, framed: dict[str, Any]
) -> list[EventDraft]:
    """``compaction/summary``, the checkpoint ``user/message`` (the replace) and the
    success ``compaction/end``: one batch, so the three land together or not at all."""
    summary_seq = session.seq
    data: dict[str, Any] = {"compactionId": txn.compaction_id}
    if txn.source_command_id is not None:
        data["sourceCommandId"] = txn.source_command_id
    data["summary"] = [thaw(b) for b in output.summary]
    # Provenance, then each optional field only when the summarizer supplied it
    # (reference §1.1): an absent field stays absent, never null.
    if output.raw_output is not None:
        data["rawOutput"] = [thaw(b) for b in output.raw_output]
        if output.llm_stream_call:
            data["llmStreamCall"] = True
    data["shadowedRange"] = {"start": txn.start, "end": txn.end}
    data["shadowedSeqs"] = list(txn.shadowed_seqs)
    data["shadowedTokenCount"] = txn.shadowed_token_count
    if output.provider is not None:
        data["provider"] = output.provider
    if output.model is not None:
        data["model"] = output.model
    if output.max_tokens is not None:
        data["maxTokens"] = output.max_tokens
    if output.usage is not None:
        data["usage"] = thaw(output.usage)
    return [
        EventDraft(SUMMARY, data),
        EventDraft(
            "user/message",
            framed,
            ReplaceOp(txn.start, txn.end),
            [txn.start_seq, summary_seq, *txn.shadowed_seqs],
        ),
        end_draft(txn),
    ]


def end_draft(txn: Transaction, error: BaseException | str | None = None) -> EventDraft:
    """``compaction/end`` (with ``error`` rendered by :func:`error_chain` on failure)."""
    data: dict[str, Any] = {"compactionId": txn.compaction_id}
    if txn.source_command_id is not None:
        data["sourceCommandId"] = txn.source_command_id
    data["turn"] = txn.turn
    if error is not None:
        data["error"] = error if isinstance(error, str) else error_chain(error)
    return EventDraft(END, data)


def error_chain(error: BaseException) -> str:
    """The message, then ``: cause`` for each cause in the ``__cause__`` chain, a
    message repeated by its cause skipped (the reference's ``errorChain``)."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current) or type(current).__name__
        if not parts or parts[-1] != text:
            parts.append(text)
        current = current.__cause__
    return ": ".join(parts)


def result_of(txn: Transaction, events: Sequence[Any], output: SummaryOutput) -> CompactionResult:
    """The result of a committed transaction from its three committed events."""
    summary, _, end = events
    return CompactionResult(
        compaction_id=txn.compaction_id,
        source_command_id=txn.source_command_id,
        start_seq=txn.start_seq,
        summary_seq=summary.seq,
        end_seq=end.seq,
        summary=output.summary,
        shadowed_range=(txn.start, txn.end),
        shadowed_seqs=txn.shadowed_seqs,
        shadowed_token_count=txn.shadowed_token_count,
    )
