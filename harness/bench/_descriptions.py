"""The one-line description of each workload, kept apart from the workloads so that
``harness bench --help`` (and every other ``harness`` command, whose group builds that
help) imports nothing of the runtime, Trio or the database drivers to show it."""

from __future__ import annotations

DESCRIPTIONS: dict[str, str] = {
    "W1": "append one event per call (and W1-actor, W1-actor-batch through the session actor)",
    "W2": "derive the surface per call (W2b: a full derive rebuild)",
    "W3": "fork at the last seq, through the actor",
    "W4": "decode and restore a stored log (W4-snapshot)",
    "W5": "write and load on disk (W5-write, W5-load, W4-disk)",
    "W6": "one replace over a large surface",
    "W7": "resume from disk",
    "W8": "compaction of an agent session and the derive rebuild",
    "W9": "durable appends through the actor, one flush each (W9-sqlite; W9-durable: append(durable=True))",
    "W10": "durable batches of 50, one flush each (W10-sqlite; W10-durable: one call each)",
    "W11": "in-memory batches through the actor",
    "W12": "close a store of many live sessions",
    "W13": "the fault explorer's own cost per attempt on a 10-task scenario",
    "W15": "streamed tool-call arguments of 1, 3 and 10 MB (agent turn, provider parse, SSE line)",
    "W16": "appends with one owner-scoped listener per agent, 1 to 10,000 agents",
    "W17": "1, 8, 64, 512 sessions in one process appending durably at once (issue 26's W12; "
    "W17-durable-*: append(durable=True))",
    "W18": "8 processes x 50 sessions, bursts of appends on one SQLite file / PostgreSQL database; "
    "0 errors, 0 lost, 0 reordered (issue 26's W13)",
    "W19": "one durable write handed off from Trio: W19-inline (the floor), -thread (to_thread), -uring "
    "(io_uring + eventfd), -harness (append(durable=True))",
    "W20": "side by side with the Agents SDK's SQLiteSession: add_items of 1 and of 50 items, durable, "
    "through TrioAgentsSession and AgentsSession (SQLite, JSONL)",
    "M1": "memory retained by a restored session",
}
"""One line per workload, for ``harness bench --help`` (docs/architecture.md, Performance)."""
