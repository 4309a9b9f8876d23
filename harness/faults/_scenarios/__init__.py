"""The built-in scenarios: the runtime's own code paths under every canceller.

Each scenario runs a real store, persistence backend and (where it applies) agent
loop, arms the probe at its trigger, and checks the built-in invariants twice: on the
live state while the runtime runs, and at rest (after everything closed) by reloading
every session it touched from disk with a fresh backend. Persistence scenarios exist
in a JSONL and a SQLite variant (``agent-turn/jsonl``, ``agent-turn/sqlite``, ...).

Cancellers (what each may do at step k, all synchronous):

* ``caller`` — cancel the cancel scope around the scenario's own calls;
* ``owner`` — close the agent's :class:`~actors.Owner` (its lifetime at once; a helper
  task then awaits ``owner.aclose``, cancelling the tasks it owns);
* ``teardown`` — close the runtime's teardown lifetime and cancel the scenario's body,
  as an application shutting down does (the runtime's blocks then exit normally);
* ``agent-cancel`` — ``agent.cancel("parent")`` on the running turn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import attrs

from harness.faults._backends import BACKENDS, scenario_modes
from harness.faults._chain_scenario import group_chain
from harness.faults._explore import Probe, Scenario
from harness.faults._group_scenario import group_write
from harness.faults._scenarios._agent import agent_turn, resume
from harness.faults._scenarios._agent_compaction import agent_compaction, compact_command
from harness.faults._scenarios._bridge import agents_session
from harness.faults._scenarios._compaction import compaction

# The shared frame, importable from the package as before the split (tests use it).
from harness.faults._scenarios._frame import (
    LIFECYCLE_ERRORS,
    SETTINGS,
    TOOLS,
    TURN_SCRIPT,
    AgentRun,
    Caller,
    OwnerCloser,
    Rig,
    StoreRun,
    agent_run,
    allowed_errors,
    append_turns,
    bind_teardown,
    check_live,
    check_runtime_exited,
    check_runtime_live,
    flush_and_acknowledge,
    guarded,
    note_errors,
    rig,
    store_run,
    turn_batches,
)
from harness.faults._scenarios._sessions import fork, lifecycle
from harness.faults._scenarios._writes import (
    close_writes,
    durable_append,
    group_commit,
    write_behind,
)
from harness.faults._scratch import scratch_dir

# The registry: one row per scenario, in the order `harness chaos --list` shows them.
# A new scenario is a function `async def name(probe, kind)` in its family's module
# (_agent, _sessions, _writes, _compaction, _agent_compaction, _bridge) and a row here.
_DEFS: Final[list[tuple[str, Callable[[Probe, str], Awaitable[None]], str, tuple[str, ...], tuple[str, ...]]]] = [
    (
        "agent-turn",
        agent_turn,
        "an agent with the scripted provider and two tools runs a turn with tool calls",
        ("caller", "owner", "teardown", "agent-cancel"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "resume",
        resume,
        "resume a persisted session through AgentLoop.resume, run a turn, dispose",
        ("caller", "owner", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "fork",
        fork,
        "fork a live session (at a turn boundary, then at its last seq) while turns are appended",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "lifecycle",
        lifecycle,
        "create/append/flush/detach concurrency; re-open a detached session while it retires",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "compaction",
        compaction,
        "an automatic compaction of two turns inside an open turn, with the actor owning the bracket",
        ("caller", "teardown", "actor-stop"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "agent-compaction",
        agent_compaction,
        "an agent's turn compacts under pressure, overflows the context window, recovers and retries in the same step",
        ("caller", "owner", "teardown", "agent-cancel"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "compact-command",
        compact_command,
        "an idle agent runs /compact while a follow-up is sent during the summary",
        ("caller", "owner", "teardown", "agent-cancel"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "close-writes",
        close_writes,
        "a detached and a live session leave events for the close; after one transient fault it loses nothing",
        ("caller", "teardown"),
        ("checkpoints", "io"),
    ),
    (
        "agents-session",
        agents_session,
        "the OpenAI Agents SDK Session (harness.bridge) adds, pops and clears items, each mutation durable",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "write-behind",
        write_behind,
        "appends with the write window running, flushes, clean close",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "group-commit",
        group_commit,
        "three sessions append and flush at once, twice: their batches share group-commit rounds",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "durable-append",
        durable_append,
        "two sessions append a turn event by event with append(durable=True), one behind casts (the busy-actor path)",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "group-write",
        group_write,
        "one blocking group commit of several sessions' batches (appends, first writes, a refused one, a lost lease)",
        ("caller",),
        # No checkpoints mode: one blocking call in a worker thread has no scheduler
        # steps of its own to cancel at (the runtime's write paths explore those).
        ("io", "crash"),
    ),
    (
        "group-chain",
        group_chain,
        "three sessions' staggered batches through the committer's chained rounds, waiters cancelled and withdrawn",
        ("caller", "waiter", "close"),
        ("checkpoints", "io", "crash"),
    ),
]


def _bind(fn: Callable[[Probe, str], Awaitable[None]], kind: str) -> Callable[[Probe], Awaitable[None]]:
    async def run(probe: Probe) -> None:
        await fn(probe, kind)

    run.__name__ = f"{fn.__name__}_{kind}"
    return run


def builtin_scenarios() -> list[Scenario]:
    """Every built-in scenario, one per backend (``NAME/jsonl``, ``NAME/sqlite``, and
    for a subset ``NAME/jsonl-zstd`` and ``NAME/postgres``, see
    :func:`~harness.faults._backends.scenario_modes`)."""
    out: list[Scenario] = []
    settings = {kind: attrs.evolve(SETTINGS, scratch=scratch_dir(kind)) for kind in BACKENDS}
    for name, fn, description, cancellers, all_modes in _DEFS:
        for kind in BACKENDS:
            modes = scenario_modes(name, kind, all_modes)
            if not modes:
                continue
            out.append(
                Scenario(
                    name=f"{name}/{kind}",
                    run=_bind(fn, kind),
                    description=description,
                    cancellers=cancellers,
                    backend=kind,
                    modes=modes,
                    settings=settings[kind],
                )
            )
    return out


def select_scenarios(names: Sequence[str]) -> list[Scenario]:
    """The built-in scenarios matching ``names`` (``agent-turn`` selects both backends,
    ``agent-turn/sqlite`` one); all of them for an empty list. Unknown names raise
    ``KeyError``."""
    every = builtin_scenarios()
    if not names:
        return every
    out: list[Scenario] = []
    for name in names:
        found = [s for s in every if s.name == name or s.name.split("/")[0] == name]
        if not found:
            raise KeyError(name)
        out.extend(s for s in found if s not in out)
    return out


# Re-exported: the names tests and callers imported from here before the split.
__all__ = [
    "AgentRun",
    "Caller",
    "LIFECYCLE_ERRORS",
    "OwnerCloser",
    "Rig",
    "SETTINGS",
    "StoreRun",
    "TOOLS",
    "TURN_SCRIPT",
    "agent_run",
    "allowed_errors",
    "append_turns",
    "bind_teardown",
    "builtin_scenarios",
    "check_live",
    "check_runtime_exited",
    "check_runtime_live",
    "flush_and_acknowledge",
    "guarded",
    "note_errors",
    "rig",
    "select_scenarios",
    "store_run",
    "turn_batches",
]
