"""Messages understood by session and store actors (frozen values)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from harness.session import EventDraft, Session

# -- session actor -------------------------------------------------------------------


@attrs.frozen
class Append:
    """Append a batch: it lands whole or not at all."""

    drafts: tuple[EventDraft, ...]


@attrs.frozen
class Derive:
    """Return the model-visible messages."""


@attrs.frozen
class CompactBegin:
    """Open a compaction bracket over the surface span ``start..end`` (seqs): validate,
    check the lock and the owner, append ``compaction/start``, prepare, and start the
    summarizer as a child task of the session actor. Returns a ticket."""

    start: int
    end: int
    summarizer: Any  # async (SummarizationInput) -> SummaryOutput
    manual: bool
    stability: str
    source_command_id: str | None
    # Manual runs: asked after the summary, before the commit (§1.2 step 7.3); True
    # means "cancelled": the bracket closes with an error end instead.
    abort_check: Any = None  # Callable[[], bool] | None


@attrs.frozen
class CompactFinish:
    """The summarizer child's outcome: commit (stability check + summary + checkpoint
    + end, one batch) or close the bracket with an error end."""

    compaction_id: str
    output: Any  # SummaryOutput | None
    framed: Any  # the checkpoint message, when the output passed the shrink check
    failure: BaseException | None


@attrs.frozen
class Prune:
    """Phase one of compaction (reference §4): prune every over-threshold tool result
    on the surface, one priced pair per result; returns the ``PruneResult``."""

    config: Any  # ToolResultPruneConfig


@attrs.frozen
class Measure:
    """Return ``harness.compaction.measure`` of the session, the compaction lock state
    and, when ``retain_tokens`` is given, the head-anchored selection (one atomic read)."""

    retain_tokens: int | None = None


@attrs.frozen
class MeasureReply:
    measurement: Any  # harness.compaction.Measurement
    lock: Any  # harness.compaction._transaction.LockState
    selection: Any  # harness.compaction.CompactableRange | None


@attrs.frozen
class ForkPrefix:
    """Validate a fork boundary; build and return the child Session (not yet live).

    The child shares the parent's events ``0..boundary``; ``header`` is the child's
    header record (the boundary-dependent ``seedLength`` is filled in).
    """

    boundary: object
    header: dict[str, Any]
    validator: Any = None


@attrs.frozen
class CommitReplace:
    """Append ``draft`` only if the surface still equals ``expected`` (atomically)."""

    expected: tuple[int, ...]
    draft: EventDraft


@attrs.frozen
class Barrier:
    """Returns once every message queued before it has been handled."""


# -- store actor -------------------------------------------------------------------------


@attrs.frozen
class Prepare:
    session_id: str | None
    seed: Sequence[Any] | None
    meta: dict[str, Any]


@attrs.frozen
class Adopt:
    """Take an already-built (e.g. restored) unpublished Session as a preparation."""

    session: Session


@attrs.frozen
class Enter:
    prepared: Any
    # The session's routing scope (an actors.Owner) captured at enter: scoped
    # listeners of that owner or an ancestor hear it. Scope only: not owner-bound.
    scope: Any = None


@attrs.frozen
class Announce:
    handle: Any


@attrs.frozen
class Detach:
    handle: Any


@attrs.frozen
class Create:
    session_id: str | None
    seed: Sequence[Any] | None
    meta: dict[str, Any]
    owner: Any = None  # an actors.Owner: the scope, and closing it detaches the session


@attrs.frozen
class Fork:
    source: Any
    boundary: object
    child_id: str | None
    owner: Any = None  # as Create's


@attrs.frozen
class Get:
    session_id: str


@attrs.frozen
class List:
    """Return the live sessions' handles, in enter order."""


@attrs.frozen
class Close:
    """Detach every live session (the store is shutting down)."""
