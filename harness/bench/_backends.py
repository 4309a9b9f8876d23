"""W5 and W7 on the SQLite and PostgreSQL backends (``harness bench W5 W7 --backend
postgres``), beside the JSONL figures of :mod:`harness.bench._disk` in the same run.

Variants: ``W5-write-<backend>`` (materialize N events: one durable transaction),
``W5-load-<backend>`` (load them back) and ``W7-<backend>`` (resume end to end through
the coordinator and the agent loop). Floors: a raw ``orjson`` + one fsync for writes,
``orjson.loads`` of the same lines for loads (as W5/W7 on JSONL), so the ratios compare.

PostgreSQL: the server at ``HARNESS_BENCH_POSTGRES_URL`` if set, else a throwaway
cluster started for the run (server binaries on PATH; see
:mod:`harness.persistence._postgres_cluster`) and removed after it. Every write run
uses a fresh schema, as every JSONL run uses a fresh directory.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from harness.bench._disk import HEADER, resume_samples
from harness.bench._events import bench_record
from harness.bench._runner import Result, loads_floor, median_ms
from harness.persistence import Backend, SqliteBackend

URL_ENV = "HARNESS_BENCH_POSTGRES_URL"

Factory = Callable[[], Backend]


def _close(backend: Backend) -> None:
    close = getattr(backend, "close", None)
    if close is not None:
        close()


@contextlib.contextmanager
def _factory(kind: str, tmp: Path) -> Iterator[Factory]:
    """Fresh, empty backends of ``kind``: a new SQLite file or PostgreSQL schema each."""
    counter = [0]
    if kind == "sqlite":

        def sqlite() -> Backend:
            counter[0] += 1
            return SqliteBackend(tmp / f"db-{counter[0]}.sqlite")

        yield sqlite
        return
    from harness.persistence import PostgresBackend

    run = secrets.token_hex(4)
    with postgres_server(f"bench_{run}_") as url:

        def postgres() -> Backend:
            counter[0] += 1
            return PostgresBackend(url, schema=f"bench_{run}_{counter[0]}")

        yield postgres


@contextlib.contextmanager
def postgres_server(prefix: str) -> Iterator[str]:
    """The PostgreSQL server the benches use: ``HARNESS_BENCH_POSTGRES_URL`` (the
    schemas named ``prefix*`` are dropped afterwards), else a throwaway local cluster
    (destroyed afterwards)."""
    from harness.persistence._postgres_cluster import missing, start_cluster

    url = os.environ.get(URL_ENV)
    cluster = None
    if not url:
        why = missing()
        if why is not None:
            raise RuntimeError(f"harness bench --backend postgres: set {URL_ENV} or install the server: {why}")
        cluster = start_cluster()
        url = cluster.url
    try:
        yield url
    finally:
        if cluster is not None:
            cluster.destroy()
        else:
            _drop_schemas(url, prefix)


def _drop_schemas(url: str, prefix: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        names = [r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (prefix + "%",))]
        for name in names:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


def _write_floor(records: list[dict[str, Any]], tmp: Path) -> float:
    path = tmp / f"floor-{secrets.token_hex(4)}.jsonl"
    t0 = time.perf_counter()
    payload = b"".join(orjson.dumps(r) + b"\n" for r in records)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    dt = time.perf_counter() - t0
    path.unlink()
    return dt


def w5_on(kind: str, n: int, runs: int) -> list[Result]:
    """W5 on ``kind`` (``sqlite``/``postgres``): write N events durably, load them back."""
    records = [bench_record(i) for i in range(n)]
    lines = [orjson.dumps(r) for r in records]
    tmp = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    try:
        with _factory(kind, tmp) as make:

            def write() -> float:
                backend = make()
                try:
                    backend.list_headers()  # schema/file creation is not part of the write
                    t0 = time.perf_counter()
                    backend.materialize(dict(HEADER), records)
                    return time.perf_counter() - t0
                finally:
                    _close(backend)

            write_ms = median_ms(write, runs)
            backend = make()
            try:
                backend.materialize(dict(HEADER), records)

                def load() -> float:
                    t0 = time.perf_counter()
                    stored = backend.load("bench")
                    dt = time.perf_counter() - t0
                    assert len(stored.records) == n
                    return dt

                load_ms = median_ms(load, runs)
            finally:
                _close(backend)
        write_floor = median_ms(lambda: _write_floor(records, tmp), runs)
        floor = median_ms(lambda: loads_floor(lines), runs)
        return [
            Result(f"W5-write-{kind}", write_ms, write_floor, {"n": n}, "materialize, one durable transaction vs orjson + one fsync"),
            Result(f"W5-load-{kind}", load_ms, floor, {"n": n}, "load: read + scan + decode"),
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def w7_on(kind: str, n: int, runs: int) -> list[Result]:
    """W7 on ``kind``: resume an N-event session end to end (load + repair + publish)."""
    lines = [orjson.dumps(bench_record(i)) for i in range(n)]
    tmp = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    try:
        with _factory(kind, tmp) as make:
            backend = make()
            try:
                backend.materialize(dict(HEADER), [bench_record(i) for i in range(n)])
                samples = iter(resume_samples(backend, n, runs))
            finally:
                _close(backend)
        floor = median_ms(lambda: loads_floor(lines), runs)
        return [Result(f"W7-{kind}", median_ms(lambda: next(samples), runs), floor, {"n": n}, "resume: load + repair + publish")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["URL_ENV", "beside", "w5_on", "w7_on"]


def beside(
    base: Callable[[int, int], list[Result]], on: Callable[[str, int, int], list[Result]], kinds: tuple[str, ...]
) -> Callable[[int, int], list[Result]]:
    """Workload ``base`` (JSONL) followed by ``on`` for each backend of ``kinds``."""

    def run(n: int, runs: int) -> list[Result]:
        out = base(n, runs)
        for kind in kinds:
            out += on(kind, n, runs)
        return out

    return run
