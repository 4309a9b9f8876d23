"""W18: many processes writing one store at once (issue 26's "W13: many processes"; the
id W13 was taken by the fault explorer's workload, so it is W18 here).

``W18-<backend>``: :data:`PROCS` processes (``python -m harness.bench._procs_worker``,
real processes) each open one store with persistence on the same SQLite file (or
PostgreSQL schema, or JSONL root) and create :data:`SESSIONS` sessions of their own.
When all are ready they start at once: :data:`ROUNDS` rounds in which every session
appends a burst of :data:`BURST` messages and flushes it (acknowledged when the flush
returns). Afterwards a reader loads every session's stored log and checks it against
what its writer appended and had acknowledged.

The verdict (:class:`Verdict`), reported with the throughput: ``errors`` (every
exception surfaced to any caller in any process, ``database is locked`` included, and
every background write failure reported on a store's warnings channel), ``lost`` (an
acknowledged message missing from its log), ``reordered`` (a log whose messages are not
in the order they were appended), ``duplicated`` and ``unexpected`` (a stored message
nobody appended); a clean run has 0 of each. ``msgs_per_s``: acknowledged messages of
all processes over the time from the start signal to the last process's end of bursts.
``median_ms`` is that time; ``runs`` is capped at 3. The test
tests/test_many_processes.py runs the same driver smaller (4 x 10) as a pass/fail check.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Final

import attrs
import orjson

from harness.bench._backends import postgres_server
from harness.bench._procs_worker import backend_for
from harness.bench._runner import Result
from harness.errors import PersistedSessionNotFoundError

PROCS: Final = 8
SESSIONS: Final = 50
ROUNDS: Final = 5
BURST: Final = 10
BACKENDS: Final = ("jsonl", "sqlite", "postgres")
_ROOT = Path(__file__).resolve().parent.parent.parent


@attrs.frozen
class Verdict:
    """What one many-process run found; :attr:`clean` when nothing was wrong."""

    acked: int
    appended: int
    stored: int
    elapsed: float
    errors: list[dict[str, Any]]
    lost: list[str]
    reordered: list[str]
    duplicated: list[str]
    unexpected: list[str]

    @property
    def clean(self) -> bool:
        return not (self.errors or self.lost or self.reordered or self.duplicated or self.unexpected)

    def summary(self) -> str:
        return (
            f"acked {self.acked}, appended {self.appended}, stored {self.stored}; errors {len(self.errors)} "
            f"{self.errors[:3]}, lost {self.lost[:5]}, reordered {self.reordered[:5]}, "
            f"duplicated {self.duplicated[:5]}, unexpected {self.unexpected[:5]}"
        )


def _texts(records: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in records:
        if r.get("type") == "user/message":
            content = r["data"]["content"]
            out.append(content[0]["text"])
    return out


def check(kind: str, target: str, reports: Sequence[dict[str, Any]], elapsed: float, errors: list[dict[str, Any]]) -> Verdict:
    """Load every session of ``target`` and compare it with the workers' ``reports``."""
    appended: dict[str, int] = {}
    acked: dict[str, int] = {}
    for report in reports:
        appended.update(report["appended"])
        acked.update(report["acked"])
        errors = errors + [{"proc": report["proc"], **e} for e in report["errors"]]
    lost: list[str] = []
    reordered: list[str] = []
    duplicated: list[str] = []
    unexpected: list[str] = []
    stored_total = 0
    backend = backend_for(kind, target)
    try:
        for sid, count in appended.items():
            try:
                texts = _texts(backend.load(sid).records)
            except PersistedSessionNotFoundError:
                # A session is materialized with its first appended event: one whose
                # every burst failed may have no log (its acknowledged messages, if
                # any, are then counted lost below).
                texts = []
            stored_total += len(texts)
            ks = []
            for text in texts:
                owner, _, k = text.rpartition("#")
                if owner != sid or not k.isdigit() or int(k) >= count:
                    unexpected.append(f"{sid}: {text}")
                else:
                    ks.append(int(k))
            if len(set(ks)) != len(ks):
                duplicated.append(sid)
            if ks != sorted(ks):
                reordered.append(sid)
            present = set(ks)
            lost += [f"{sid}#{k}" for k in range(acked[sid]) if k not in present]
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    return Verdict(
        sum(acked.values()), sum(appended.values()), stored_total, elapsed, errors, lost, reordered, duplicated, unexpected
    )


def run_many(kind: str, target: str, *, procs: int, sessions: int, rounds: int, burst: int, timeout: float = 600.0) -> Verdict:
    """Run ``procs`` worker processes on ``target`` (see the module doc); blocking.

    ``timeout`` bounds the whole run (a hung worker is killed and reported as an error,
    never waited for forever); it is not part of any verdict of a run that finishes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    cmd = [sys.executable, "-m", "harness.bench._procs_worker", kind, target]
    # stderr to files, not pipes: a worker that logs much must never block on a full pipe
    # while the driver waits for another worker's line.
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(procs)]
        return _run_workers(kind, target, cmd, env, logs, procs, sessions, rounds, burst, timeout)


def _run_workers(
    kind: str,
    target: str,
    cmd: list[str],
    env: dict[str, str],
    logs: Sequence[IO[str]],
    procs: int,
    sessions: int,
    rounds: int,
    burst: int,
    timeout: float,
) -> Verdict:
    workers = [
        subprocess.Popen(
            [*cmd, str(i), str(sessions), str(rounds), str(burst)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=logs[i],
            text=True,
            env=env,
        )
        for i in range(procs)
    ]
    # A hung worker is killed at ``timeout`` (the run then fails on its missing lines):
    # a bound on a broken run, never part of a clean run's verdict.
    def kill_all() -> None:
        for w in workers:
            if w.poll() is None:
                w.kill()

    watchdog = threading.Timer(timeout, kill_all)
    watchdog.daemon = True
    watchdog.start()
    errors: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    elapsed = 0.0
    try:

        def expect(i: int, word: str) -> bool:
            stream = workers[i].stdout
            assert stream is not None
            line = stream.readline().strip()
            if line != word:
                errors.append({"proc": i, "where": "protocol", "message": f"expected {word}, got {line!r}"})
                return False
            return True

        ready = [expect(i, "READY") for i in range(procs)]
        t0 = time.perf_counter()
        for w in workers:
            assert w.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                w.stdin.write("go\n")
                w.stdin.close()
        for i in range(procs):
            if ready[i]:
                expect(i, "DONE")
        elapsed = time.perf_counter() - t0
        for i, w in enumerate(workers):
            assert w.stdout is not None
            out = w.stdout.read()
            w.wait()
            logs[i].seek(0)
            err = logs[i].read()
            if w.returncode != 0:
                errors.append({"proc": i, "where": "exit", "message": f"exit status {w.returncode}: {err.strip()[-2000:]}"})
            last = out.strip().rpartition("\n")[2]
            if last.startswith("{"):
                reports.append(orjson.loads(last))
            else:
                errors.append({"proc": i, "where": "report", "message": f"no report: {out[-500:]!r} {err[-2000:]!r}"})
    finally:
        watchdog.cancel()
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        for w in workers:
            for stream in (w.stdin, w.stdout):
                if stream is not None:
                    with contextlib.suppress(BrokenPipeError):
                        stream.close()
    return check(kind, target, reports, elapsed, errors)


@contextlib.contextmanager
def target_of(kind: str, tmp: Path) -> Iterator[str]:
    """A fresh shared target of ``kind``: a JSONL root, a SQLite file, a PostgreSQL schema
    (at ``HARNESS_BENCH_POSTGRES_URL``, else on a throwaway cluster)."""
    if kind == "jsonl":
        yield str(tmp / f"jsonl-{secrets.token_hex(4)}")
        return
    if kind == "sqlite":
        yield str(tmp / f"db-{secrets.token_hex(4)}.sqlite")
        return
    schema = f"bench_{secrets.token_hex(4)}"
    with postgres_server(schema) as url:
        yield f"{url}#{schema}"


def w18(
    n: int,
    runs: int,
    backends: Sequence[str] = ("sqlite",),
    procs: int = PROCS,
    sessions: int = SESSIONS,
    rounds: int = ROUNDS,
    burst: int = BURST,
) -> list[Result]:
    """``procs`` processes x ``sessions`` sessions on one store per backend (``n`` unused)."""
    runs = max(1, min(runs, 3))
    out: list[Result] = []
    for kind in backends:
        tmp = Path(tempfile.mkdtemp(prefix="harness-bench-"))
        try:
            verdicts = []
            for _ in range(runs):
                with target_of(kind, tmp) as target:
                    verdicts.append(run_many(kind, target, procs=procs, sessions=sessions, rounds=rounds, burst=burst))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        elapsed = statistics.median(v.elapsed for v in verdicts)
        rates = [v.acked / v.elapsed for v in verdicts if v.elapsed > 0]
        extra: dict[str, object] = {
            "backend": kind,
            "procs": procs,
            "sessions_per_proc": sessions,
            "rounds": rounds,
            "burst": burst,
            "acked": sum(v.acked for v in verdicts),
            "msgs_per_s": round(statistics.median(rates), 1) if rates else 0.0,
            "errors": sum(len(v.errors) for v in verdicts),
            "lost": sum(len(v.lost) for v in verdicts),
            "reordered": sum(len(v.reordered) for v in verdicts),
            "duplicated": sum(len(v.duplicated) for v in verdicts),
            "unexpected": sum(len(v.unexpected) for v in verdicts),
            "clean": all(v.clean for v in verdicts),
        }
        firsts = [e for v in verdicts for e in v.errors][:3]
        if firsts:
            extra["first_errors"] = [str(e.get("message", ""))[:600] for e in firsts]
        note = "processes x sessions, bursts of appends; errors/lost/reordered must be 0"
        out.append(Result(f"W18-{kind}", elapsed * 1000.0, None, extra, note))
    return out


def backends_of(choice: str) -> tuple[str, ...]:
    """``--backend`` value -> the backends W18 runs on (``all``: JSONL and SQLite)."""
    return ("jsonl", "sqlite") if choice == "all" else (choice,)


__all__ = ["BACKENDS", "Verdict", "backends_of", "check", "run_many", "target_of", "w18"]
