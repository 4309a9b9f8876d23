"""Backends for scenarios: wired to the attempt's fault layer, or plain for reloads.

The kinds a campaign explores (:data:`BACKENDS`): ``jsonl`` (plain JSONL), ``sqlite``
and ``jsonl-zstd`` (JSONL with the reference's default Zstandard encoding: one
checksummed frame per batch, torn final frames recovered on load). The two JSONL kinds
fail and crash through the file layer (:data:`FILE_BACKENDS`); SQLite through its
statement hook. ``jsonl-zstd`` runs a subset (:func:`scenario_modes`): the encoding
only matters where bytes reach the disk, so it runs the persistence scenarios in the
``io`` and ``crash`` modes (and a SIGKILL campaign), not the scheduler-level
``checkpoints`` mode, which its plain twin already covers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal

from harness.faults._explore import Probe
from harness.faults._invariants import check_stored, check_writer_locks
from harness.faults._sqlite_faults import SqliteFaults
from harness.persistence import JsonlBackend, SqliteBackend
from harness.persistence._files import OsFiles
from harness.runtime import SessionHandle

BACKENDS: Final = ("jsonl", "sqlite", "jsonl-zstd")
#: The kinds whose faults go through the file layer (``FaultyFiles``, ``PowerLossFiles``).
FILE_BACKENDS: Final = frozenset({"jsonl", "jsonl-zstd"})

#: Per kind, the built-in scenarios and modes it runs (a kind not listed runs all).
_SCOPE: Final[dict[str, tuple[frozenset[str], frozenset[str]]]] = {
    "jsonl-zstd": (
        frozenset({"resume", "lifecycle", "write-behind", "agent-turn"}),
        frozenset({"io", "crash"}),
    ),
}


def uses_files(kind: str) -> bool:
    """Whether ``kind``'s faults are file operations (else SQLite statements)."""
    return kind in FILE_BACKENDS


def scenario_modes(name: str, kind: str, modes: tuple[str, ...]) -> tuple[str, ...]:
    """The modes of ``modes`` the built-in scenario ``name`` runs in on ``kind``
    (empty: the scenario does not run on that kind)."""
    scope = _SCOPE.get(kind)
    if scope is None:
        return modes
    names, allowed = scope
    return tuple(m for m in modes if m in allowed) if name in names else ()

Backend = JsonlBackend | SqliteBackend


def backend_location(probe_or_root: Probe | Path, kind: str) -> Path:
    """Where a scenario's ``kind`` backend keeps its data under the attempt's tmp_path."""
    root = probe_or_root.tmp_path if isinstance(probe_or_root, Probe) else probe_or_root
    if kind in ("jsonl", "jsonl-zstd"):
        return root / kind
    if kind == "sqlite":
        return root / "sessions.sqlite"
    raise ValueError(f"unknown backend {kind!r} (expected one of {', '.join(BACKENDS)})")


def make_backend(probe: Probe, kind: str) -> Backend:
    """The backend a scenario persists to: wired to ``probe.faults`` (a ``FaultyFiles``
    / ``PowerLossFiles`` for JSONL, a ``SqliteFaults`` for SQLite) when the attempt
    injects I/O faults or crashes, plain otherwise."""
    where = backend_location(probe, kind)
    faults = probe.faults
    if uses_files(kind):
        return JsonlBackend(where, files=faults if isinstance(faults, OsFiles) else None, compression=_compression(kind))
    return SqliteBackend(where, faults=faults if isinstance(faults, SqliteFaults) else None)


def plain_backend(root: Probe | Path, kind: str) -> Backend:
    """A fresh backend over the same location, without faults (to reload and check)."""
    where = backend_location(root, kind)
    return JsonlBackend(where, compression=_compression(kind)) if uses_files(kind) else SqliteBackend(where)


def _compression(kind: str) -> Literal["none", "zstd"]:
    return "zstd" if kind == "jsonl-zstd" else "none"


def make_backend_at(root: str | Path, kind: str) -> Backend:
    """A plain ``kind`` backend under ``root`` (the layout :func:`backend_location` uses)."""
    return plain_backend(Path(root), kind)


def close_backend(backend: Backend) -> None:
    """Release what a backend holds open (SQLite's connection; JSONL holds nothing)."""
    if isinstance(backend, SqliteBackend):
        backend.close()


# -- what persistence scenarios share ---------------------------------------------------------


def track_session(probe: Probe, handle: SessionHandle) -> None:
    """Remember a session for :func:`check_at_rest` (its header names its lock)."""
    sessions: dict[str, dict[str, Any]] = probe.data.setdefault("sessions", {})
    sessions[handle.id] = handle.header.to_record()


def check_at_rest(probe: Probe, kind: str) -> None:
    """Reload every tracked session with a fresh ``kind`` backend: it loads under the
    reading rules, crash repair closes it, every acknowledged event is there unchanged,
    and its writer lock is free. Blocking; run it once the runtime has exited (the I/O
    and crash explorers run it after the attempt when the scenario did not get there)."""
    backend = plain_backend(probe, kind)
    try:
        sessions: dict[str, dict[str, Any]] = probe.data.get("sessions", {})
        for sid, header in sessions.items():
            probe.record(
                check_stored(
                    backend,
                    sid,
                    acknowledged=probe.acknowledged.get(sid, -1),
                    expected=probe.acknowledged_records.get(sid),
                )
            )
            probe.record(check_writer_locks((), backend, [header]))
        for sid in sorted(set(probe.acknowledged) - set(sessions)):
            probe.fail(f'acknowledged session "{sid}" was never tracked')
    finally:
        close_backend(backend)
    probe.data["at_rest_checked"] = True
