"""Fault injection and exploration.

* Exploration (docs/faults.md): :func:`explore` injects a cancellation at every
  scheduler step of a scenario, by every canceller it declares; :func:`explore_io`
  fails every file operation / SQLite statement in turn; :func:`explore_crash` stops
  the world at every write or fsync (power-loss model); :func:`kill_campaign` SIGKILLs
  a writing process; :func:`replay` re-runs one attempt by its :class:`ReplayKey`.
* Built-in invariants: :func:`check_log`, :func:`check_preparations`,
  :func:`check_writer_locks`, :func:`check_no_tasks_left`, :func:`check_durable`,
  :func:`check_stored`.
* Fault layers: :class:`FaultyFiles`, :class:`PowerLossFiles`, :class:`SqliteFaults`,
  :class:`FailingFiles`; named :class:`FaultPoints`.
"""

from harness.agent._points import FaultPoints
from harness.faults._backends import check_at_rest, make_backend, plain_backend, track_session
from harness.faults._explore import (
    LIBRARY_ERRORS,
    Probe,
    Scenario,
    ScenarioError,
    ScenarioFn,
    Settings,
    TaskInfo,
    explore,
    step_plan,
)
from harness.faults._files import MUTATING_KINDS, FailingFiles, FaultyFiles
from harness.faults._invariants import (
    check_durable,
    check_log,
    check_no_tasks_left,
    check_preparations,
    check_stored,
    check_writer_locks,
    open_compaction,
)
from harness.faults._io import explore_crash, explore_io, kill_campaign, replay
from harness.faults._power import POWER_LOSS_KINDS, PowerLossFiles
from harness.faults._report import (
    Attempt,
    ExploreReport,
    Group,
    ReplayKey,
    TaskSite,
    Violation,
    group_violations,
    normalise,
)
from harness.faults._sqlite_faults import SqliteFaults
from harness.persistence._files import SimulatedCrash

__all__ = [
    "LIBRARY_ERRORS",
    "MUTATING_KINDS",
    "POWER_LOSS_KINDS",
    "Attempt",
    "ExploreReport",
    "Group",
    "Probe",
    "ReplayKey",
    "Scenario",
    "ScenarioError",
    "ScenarioFn",
    "Settings",
    "TaskInfo",
    "TaskSite",
    "Violation",
    "builtin_scenarios",
    "check_at_rest",
    "check_durable",
    "check_log",
    "open_compaction",
    "check_no_tasks_left",
    "check_preparations",
    "check_stored",
    "check_writer_locks",
    "explore",
    "explore_crash",
    "explore_io",
    "group_violations",
    "kill_campaign",
    "make_backend",
    "normalise",
    "plain_backend",
    "replay",
    "step_plan",
    "track_session",
    "FailingFiles",
    "FaultPoints",
    "FaultyFiles",
    "PowerLossFiles",
    "SimulatedCrash",
    "SqliteFaults",
]


def builtin_scenarios() -> list[Scenario]:
    """The built-in scenarios (``agent-turn``, ``resume``, ``fork``, ``lifecycle``,
    ``write-behind``, the compaction ones), one per backend kind: ``NAME/jsonl``,
    ``NAME/sqlite``, and a reduced subset on ``NAME/jsonl-zstd`` and ``NAME/postgres``
    (``harness chaos --list``).

    Imported on first call: the scenarios use the agent loop, which itself imports
    this package.
    """
    from harness.faults._scenarios import builtin_scenarios as scenarios

    return scenarios()
