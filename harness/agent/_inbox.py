"""The agent inbox: two FIFOs of user messages, every change durable as a splice.

``next-turn`` holds prompts (``send``, follow-ups): each starts a turn of its own.
``next-step`` holds messages for the next step of whatever turn runs (``steer``,
``inject``). Every change is written as one log-only ``agent/inbox/spliced {target,
start, removedCount?, inserted, outcome?}`` record, so the inbox survives a resume:
:meth:`Inbox.rebuild` folds those records back (reference persistence §6).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from harness.session import Event, EventDraft, EventLog, thaw

Target = Literal["next-turn", "next-step"]
TARGETS: tuple[Target, Target] = ("next-turn", "next-step")
SPLICED = "agent/inbox/spliced"


def splice_draft(
    target: Target,
    start: int,
    removed: int,
    inserted: Sequence[dict[str, Any]],
    *,
    outcome: str | None = None,
) -> EventDraft:
    data: dict[str, Any] = {"target": target, "start": start}
    if removed:
        data["removedCount"] = removed
    data["inserted"] = list(inserted)
    if outcome is not None:
        data["outcome"] = outcome
    return EventDraft(SPLICED, data)


class Inbox:
    """The in-memory queues; changed only after the splice that records the change
    was appended (the agent holds its inbox lock across both)."""

    __slots__ = ("queues", "waking")

    def __init__(self) -> None:
        self.queues: dict[Target, list[dict[str, Any]]] = {"next-turn": [], "next-step": []}
        # Ids of next-step messages that wake an idle agent (steer, not inject).
        # Process-local: after a resume every pending message waits for a wake.
        self.waking: set[str] = set()

    @classmethod
    def rebuild(cls, events: Iterable[Event]) -> Inbox:
        """Fold every ``agent/inbox/spliced`` record of a log (malformed ones are
        skipped: the inbox is a convenience, the log stays the record)."""
        inbox = cls()
        if isinstance(events, EventLog):
            # A resumed log: build only the splice records' events, not all of them
            # (materialising every event of a 100k-event log was ~1/5 of a resume).
            events = [events[seq] for seq in events.seqs_of_type(SPLICED)]
        for event in events:
            if event.type != SPLICED:
                continue
            data = thaw(event.data)
            if type(data) is not dict:
                continue
            target, start = data.get("target"), data.get("start")
            inserted = data.get("inserted", [])
            removed = data.get("removedCount", 0)
            if target not in TARGETS or type(start) is not int or type(removed) is not int or type(inserted) is not list:
                continue
            inbox.apply(target, start, removed, [m for m in inserted if type(m) is dict])
        return inbox

    def apply(self, target: Target, start: int, removed: int, inserted: Sequence[dict[str, Any]]) -> None:
        queue = self.queues[target]
        for message in queue[start : start + removed]:
            self.waking.discard(str(message.get("id")))
        queue[start : start + removed] = list(inserted)

    @property
    def next_turn(self) -> list[dict[str, Any]]:
        return self.queues["next-turn"]

    @property
    def next_step(self) -> list[dict[str, Any]]:
        return self.queues["next-step"]

    def wakes(self) -> bool:
        """Whether queued work would start a turn on an idle agent."""
        return bool(self.next_turn) or any(str(m.get("id")) in self.waking for m in self.next_step)

    def steered(self) -> bool:
        """Whether a waking message waits for the next step (a turn about to complete
        runs one more step for it)."""
        return any(str(m.get("id")) in self.waking for m in self.next_step)

    def __len__(self) -> int:
        return len(self.next_turn) + len(self.next_step)
