"""I/O failure and crash exploration over the persistence backends.

* :func:`explore_io` — a dry run counts the file operations (JSONL: write, fsync,
  truncate, link, rename, mkdir, unlink, lock, ...) or SQLite statements a scenario
  performs; then one attempt per ``k`` fails the k-th with ``ENOSPC``/``EIO`` (SQLite:
  disk full / I/O error).
* :func:`explore_crash` — the world stops at the k-th write or fsync (JSONL, then power
  loss: bytes not yet fsynced are dropped or torn at a random offset) or the k-th
  statement (SQLite); the disk is then reloaded with a plain backend.
* :func:`kill_campaign` — a child process appends and flushes; the parent SIGKILLs it at
  random moments and reloads (both backends).

After every attempt: nothing acknowledged (flushed) is lost, the log still loads and
repairs to a closed log, no raw non-library exception escaped, and the runtime either
went on or failed closed with a typed error while staying able to shut down (a hang is
a violation).
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from harness.errors import PersistedSessionNotFoundError
from harness.faults._backends import (
    BACKENDS,
    check_at_rest,
    close_backend,
    plain_backend,
    uses_files,
)
from harness.faults._explore import (
    ProgressFn,
    Scenario,
    ScenarioFn,
    Settings,
    _settings_of,
    as_scenario,
    run_attempt,
    step_plan,
)
from harness.faults._explore import replay as replay_checkpoint
from harness.faults._files import FaultyFiles
from harness.faults._invariants import check_durable, check_stored
from harness.faults._power import PowerLossFiles
from harness.faults._report import Attempt, ExploreReport, ReplayKey, Violation
from harness.faults._scratch import scratch_dir
from harness.faults._sqlite_faults import SqliteFaults
from harness.persistence._files import SimulatedCrash

#: The I/O faults explored by default, by backend: label -> errno (JSONL) or SQLite kind.
IO_FAULTS: Final[dict[str, dict[str, int | str]]] = {
    "jsonl": {"enospc": errno.ENOSPC, "eio": errno.EIO},
    "sqlite": {"full": "full", "ioerr": "ioerr"},
    "jsonl-zstd": {"enospc": errno.ENOSPC, "eio": errno.EIO},
    "postgres": {"full": "full", "ioerr": "ioerr"},  # statements fail as SQLite's do
}
CRASH: Final = "crash"
SIGKILL: Final = "sigkill"


def _kind(spec: Scenario, backend: str | None) -> str:
    kind = backend or spec.backend
    if kind not in BACKENDS:
        raise ValueError(f"scenario {spec.name!r}: name a backend ({', '.join(BACKENDS)}), got {kind!r}")
    return kind


def _io_labels(kind: str, errors: Sequence[int | str] | None) -> dict[str, int | str]:
    known = IO_FAULTS[kind]
    if errors is None:
        return dict(known)
    out: dict[str, int | str] = {}
    for e in errors:
        if uses_files(kind):
            code = e if isinstance(e, int) else getattr(errno, str(e).upper(), None)
            if not isinstance(code, int) or code not in errno.errorcode:
                raise ValueError(f"not an errno: {e!r}")
            out[errno.errorcode[code].lower()] = code
        else:
            if e not in ("full", "ioerr"):
                raise ValueError(f"SQLite faults are 'full' or 'ioerr', not {e!r}")
            out[str(e)] = str(e)
    return out


def _io_faults(kind: str, fault: int | str, k: int | None) -> FaultyFiles | SqliteFaults:
    if uses_files(kind):
        assert isinstance(fault, int)
        return FaultyFiles(fail_at=k, error=fault)
    return SqliteFaults(fail_at=k, error="ioerr" if fault == "ioerr" else "full")


def _crash_faults(kind: str, k: int | None) -> PowerLossFiles | SqliteFaults:
    return PowerLossFiles(crash_at=k) if uses_files(kind) else SqliteFaults(crash_at=k)


def _at_rest_after(kind: str) -> Callable[[Any, BaseException | None], None]:
    def finish(probe: Any, escaped: BaseException | None) -> None:
        faults = probe.faults
        if isinstance(faults, PowerLossFiles):
            faults.apply(probe.rng)  # the power cut: what was not fsynced may be gone
            probe.data["at_rest_checked"] = False  # the disk changed under any earlier check
        if not probe.data.get("at_rest_checked"):
            check_at_rest(probe, kind)

    return finish


def _count(faults: object) -> int:
    return int(getattr(faults, "count", 0))


def _injected(faults: object) -> bool:
    if isinstance(faults, PowerLossFiles):
        return faults.crashed
    if isinstance(faults, SqliteFaults):
        return faults.crashed or bool(faults.injected)
    return bool(getattr(faults, "injected", ()))


def _explore_faults(
    spec: Scenario,
    kind: str,
    mode: str,
    labels: dict[str, Any],
    make: Callable[[Any, int | None], object],
    *,
    seeds: int | Sequence[int],
    stride: int,
    max_steps: int | None,
    settings: Settings | None,
    progress: ProgressFn | None,
) -> ExploreReport:
    conf = _settings_of(spec, settings)
    started = time.perf_counter()
    expected = (SimulatedCrash,) if mode == "crash" else ()
    finish = _at_rest_after(kind)
    steps: dict[str, int] = {}
    dry_steps: dict[int, int] = {}
    violations: list[Violation] = []
    notes: list[str] = []
    attempts = 0
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    for seed in seed_list:
        first = next(iter(labels.values()))
        dry_faults = make(first, None)
        dry = run_attempt(
            spec.run, spec.name, seed=seed, k=0, canceller=None, settings=conf, faults=dry_faults, finish=finish
        )
        attempts += 1
        violations.extend(dry.violations)
        n = _count(dry_faults)
        dry_steps[seed] = n
        if dry.outcome == "hang":
            notes.append(f"seed {seed}: the dry run hung; its operations were not explored")
            continue
        plan = step_plan(n, seed=seed, stride=stride, max_steps=max_steps)
        total, done, missed = len(plan) * len(labels), 0, 0
        for label, fault in labels.items():
            steps.setdefault(label, 0)
            for k in plan:
                faults = make(fault, k)
                attempt = run_attempt(
                    spec.run,
                    spec.name,
                    seed=seed,
                    k=k,
                    canceller=None,
                    label=label,
                    settings=conf,
                    faults=faults,
                    expected=expected,
                    finish=finish,
                )
                attempts += 1
                done += 1
                steps[label] += 1
                missed += not _injected(faults)
                violations.extend(attempt.violations)
                if progress is not None:
                    progress(f"{spec.name} {mode} seed={seed} {label}", done, total)
        if missed:
            notes.append(f"seed {seed}: {missed} attempt(s) ended before their operation k (the count drifted)")
    return ExploreReport(
        scenario=spec.name,
        mode=mode,
        steps=steps,
        attempts=attempts,
        violations=tuple(violations),
        wall_time=time.perf_counter() - started,
        dry_steps=dry_steps,
        backend=kind,
        notes=tuple(notes),
    )


def explore_io(
    scenario: Scenario | ScenarioFn,
    *,
    backend: str | None = None,
    errors: Sequence[int | str] | None = None,
    seeds: int | Sequence[int] = 1,
    stride: int = 1,
    max_steps: int | None = None,
    settings: Settings | None = None,
    progress: ProgressFn | None = None,
) -> ExploreReport:
    """Fail the k-th file operation (JSONL: ``errors`` are errnos, default ``ENOSPC``
    and ``EIO``) or SQLite statement (``"full"``, ``"ioerr"``) for every ``k`` of the
    scenario's dry run. The scenario builds its backend with
    :func:`~harness.faults.make_backend`, which wires ``probe.faults`` in.

    After each attempt the sessions the scenario tracked are reloaded with a plain
    backend (:func:`~harness.faults.check_at_rest`) unless the scenario did it itself.
    Typed persistence errors are answers here; anything raw, a hang, or a lost
    acknowledged event is a violation. Synchronous, like :func:`explore`.
    """
    spec = as_scenario(scenario)
    kind = _kind(spec, backend)
    return _explore_faults(
        spec,
        kind,
        "io",
        _io_labels(kind, errors),
        lambda fault, k: _io_faults(kind, fault, k),
        seeds=seeds,
        stride=stride,
        max_steps=max_steps,
        settings=settings,
        progress=progress,
    )


def explore_crash(
    scenario: Scenario | ScenarioFn,
    *,
    backend: str | None = None,
    seeds: int | Sequence[int] = 1,
    stride: int = 1,
    max_steps: int | None = None,
    settings: Settings | None = None,
    progress: ProgressFn | None = None,
) -> ExploreReport:
    """Stop the world at the k-th write/fsync/truncate/link/rename/directory fsync (JSONL,
    :class:`~harness.faults.PowerLossFiles`) or the k-th statement (SQLite), for every
    ``k``; the JSONL disk then loses what a power cut could (unsynced bytes dropped or
    torn at a random offset from ``probe.rng``; unsynced directory entries undone).

    The :class:`~harness.faults.SimulatedCrash` escaping the scenario is expected; the
    reload afterwards must satisfy the repair rules with every acknowledged event
    present. Synchronous, like :func:`explore`.
    """
    spec = as_scenario(scenario)
    kind = _kind(spec, backend)
    return _explore_faults(
        spec,
        kind,
        "crash",
        {CRASH: CRASH},
        lambda _fault, k: _crash_faults(kind, k),
        seeds=seeds,
        stride=stride,
        max_steps=max_steps,
        settings=settings,
        progress=progress,
    )


def replay(scenario: Scenario | ScenarioFn, key: ReplayKey | str, *, settings: Settings | None = None) -> Attempt:
    """Re-run exactly the attempt ``key`` names, whatever its mode: a canceller (see
    :func:`~harness.faults.explore`), an I/O fault label (``enospc``, ``eio``,
    ``full``, ``ioerr``) or ``crash``. SIGKILL rounds depend on wall-clock timing and
    cannot be replayed (``ValueError``)."""
    spec = as_scenario(scenario)
    if isinstance(key, str):
        key = ReplayKey.parse(key)
    label = key.canceller
    if label == SIGKILL:
        raise ValueError("SIGKILL rounds depend on wall-clock timing and cannot be replayed")
    kind = spec.backend
    io_labels = IO_FAULTS.get(kind or "", {})
    if label not in io_labels and label != CRASH:
        return replay_checkpoint(spec, key, settings=settings)
    assert kind is not None
    conf = _settings_of(spec, settings)
    k = key.k if key.k > 0 else None
    faults = _crash_faults(kind, k) if label == CRASH else _io_faults(kind, io_labels[label], k)
    return run_attempt(
        spec.run,
        key.scenario,
        seed=key.seed,
        k=key.k,
        canceller=None,
        label=label,
        settings=conf,
        faults=faults,
        expected=(SimulatedCrash,) if label == CRASH else (),
        finish=_at_rest_after(kind),
    )


# -- SIGKILL ----------------------------------------------------------------------------------

KILL_SESSION: Final = "crashy"


def kill_campaign(
    backend: str,
    *,
    kills: int = 20,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    max_delay: float = 0.08,
    progress: ProgressFn | None = None,
) -> ExploreReport:
    """SIGKILL a writing child process at random moments, ``kills`` times, on one store.

    The child (``python -m harness.faults._killchild``) resumes the session (or creates
    it), appends turns with tool calls and flushes in a loop, printing ``durable <n>``
    after each flush returned. After each kill the parent reloads with a plain backend:
    the log loads and repairs to a closed log, every event acknowledged in this or an
    earlier round is there unchanged. Violation keys name the round as ``k`` (timing
    decides where a kill lands: they are not replayable). Blocking.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}")
    started = time.perf_counter()
    rng = random.Random(seed)
    name = f"sigkill/{backend}"
    violations: list[Violation] = []
    repaired = 0
    with tempfile.TemporaryDirectory(prefix="harness-kill-", dir=scratch_dir(backend), ignore_cleanup_errors=True) as tmp:
        where = Path(root) if root is not None else Path(tmp)
        acknowledged: list[Any] = []
        for round_no in range(1, kills + 1):
            messages = _kill_round(backend, where, rng.uniform(0.0, max_delay), acknowledged)
            repaired += messages.pop() == "repaired"
            violations.extend(Violation(name, SIGKILL, round_no, seed, m) for m in messages)
            if progress is not None:
                progress(name, round_no, kills)
    return ExploreReport(
        scenario=name,
        mode="kill",
        steps={SIGKILL: kills},
        attempts=kills,
        violations=tuple(violations),
        wall_time=time.perf_counter() - started,
        backend=backend,
        notes=(f"{repaired} of {kills} kills left a turn for crash repair to close",),
    )


def _kill_round(backend: str, root: Path, delay: float, acknowledged: list[Any]) -> list[str]:
    """One kill; returns its violations followed by ``"repaired"`` or ``"clean"``.
    ``acknowledged`` (the records known durable) is updated in place."""
    # The child imports this very checkout (also when it is not installed).
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "harness.faults._killchild", backend, str(root)]
    durable = 0
    out: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as child:
        assert child.stdout is not None and child.stderr is not None
        ready = child.stdout.readline().split()
        if not ready or ready[0] != b"ready":
            child.kill()
            child.wait()
            err = child.stderr.read().decode(errors="replace")[-2000:]
            return [f"kill child did not start: {ready!r}: {err}", "clean"]
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        for line in child.stdout.read().splitlines():
            if line.startswith(b"durable "):
                durable = int(line.split()[1])
    store = plain_backend(root, backend)
    try:
        try:
            stored = store.load(KILL_SESSION)
        except PersistedSessionNotFoundError:
            if durable or acknowledged:
                out.append(f"session lost after SIGKILL ({durable} event(s) acknowledged)")
            return [*out, "clean"]
        records = list(stored.records)
        out.extend(check_durable(records, len(acknowledged) - 1, acknowledged))
        out.extend(check_durable(records, durable - 1))
        out.extend(check_stored(store, KILL_SESSION, acknowledged=durable - 1))
        repaired = bool(records) and records[-1].get("type") != "turn/end"
        if durable > len(acknowledged):
            acknowledged[:] = records[:durable]
    finally:
        close_backend(store)
    return [*out, "repaired" if repaired else "clean"]
