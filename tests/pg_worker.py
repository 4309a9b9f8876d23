"""A worker process for tests/test_postgres_procs.py: one lease holder ("host").

    python -m tests.pg_worker URL SCHEMA HOST TTL compete SESSIONS HOLDS BATCHES SEED
    python -m tests.pg_worker URL SCHEMA HOST TTL step SESSION
    python -m tests.pg_worker URL SCHEMA HOST TTL stall SESSION

``compete``: HOLDS times, take the lease of a random session of SESSIONS (comma
separated; busy: try another), append BATCHES batches of three events, release.
``step``: take SESSION's lease, write one batch, then one more batch per line read
from stdin (the test decides when). ``stall``: as ``step``, but the second batch stops
inside its transaction, before ``COMMIT``, until a line arrives (the test SIGSTOPs it
there). The server ends a transaction idle for a second.

Every event's data names its writer: ``{"w": HOST, "f": fence, "b": batch}``. After
each batch is durable the worker prints ``ACK <sid> <first seq> <last seq> <fence>
<batch>``; a refused write prints ``LOST <sid> <code>`` (lease lost) or ``FAIL <sid>
<code>`` (storage error). Lines are flushed at once:
the test may SIGKILL or SIGSTOP the worker at any point.
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any

from harness.errors import (
    LeaseLostError,
    PersistedSessionNotFoundError,
    SessionLockedError,
    StorageIOError,
)
from harness.persistence import PostgresBackend
from harness.persistence._postgres_lease import PgLease


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def batch(start: int, host: str, fence: int, b: int) -> list[dict[str, Any]]:
    return [{"type": "test/mark", "seq": s, "time": s, "data": {"w": host, "f": fence, "b": b}} for s in range(start, start + 3)]


def write(backend: PostgresBackend, lease: PgLease, host: str, b: int) -> None:
    sid = lease.session_id
    try:
        start = len(backend.load(sid).records)
    except PersistedSessionNotFoundError:
        start = None
    records = batch(start or 0, host, lease.fence, b)
    try:
        if start is None:
            backend.materialize({"version": 0, "id": sid, "createdAt": 1}, records, lease=lease)
        else:
            backend.append(sid, records, lease=lease)
    except LeaseLostError as exc:
        say(f"LOST {sid} {exc.code}")
        return
    except StorageIOError as exc:
        say(f"FAIL {sid} {exc.code}")
        return
    say(f"ACK {sid} {records[0]['seq']} {records[-1]['seq']} {lease.fence} {b}")


class Stall:
    """In ``stall`` mode: the ``armed``-th batch written with ``COPY`` stops before its
    ``COMMIT``, says ``STALL`` and waits for a line on stdin — inside its transaction,
    holding the lease and session row locks."""

    def __init__(self) -> None:
        self.armed = 0
        self.copies = 0
        self.stalled = False

    def before(self, sql: str) -> None:
        if sql.startswith("COPY"):
            self.copies += 1
        elif sql == "COMMIT" and self.armed and self.copies == self.armed and not self.stalled:
            self.stalled = True
            say("STALL")
            sys.stdin.readline()


def main(argv: list[str]) -> None:
    url, schema, host, ttl, mode, *rest = argv
    stall = Stall()
    backend = PostgresBackend(
        url,
        schema=schema,
        host=host,
        lease_ttl=float(ttl),
        pool_size=2,
        idle_timeout=1.0 if mode == "stall" else None,
        faults=stall,
    )
    n = 0
    if mode == "compete":
        sessions, holds, batches, seed = rest[0].split(","), int(rest[1]), int(rest[2]), int(rest[3])
        rng = random.Random(seed)
        done = 0
        while done < holds:
            sid = rng.choice(sessions)
            try:
                lease = backend.acquire_writer({"id": sid})
            except SessionLockedError:
                time.sleep(0.005)  # busy: let the holder work
                continue
            assert isinstance(lease, PgLease)
            for _ in range(batches):
                write(backend, lease, host, n)
                n += 1
            lease.release()
            done += 1
    else:
        if mode == "stall":
            stall.armed = 2  # the second batch stops before its COMMIT until told
        lease = backend.acquire_writer({"id": rest[0]})
        assert isinstance(lease, PgLease)
        write(backend, lease, host, n)
        for _line in sys.stdin:
            n += 1
            write(backend, lease, host, n)
    backend.close()
    say("DONE")


if __name__ == "__main__":
    main(sys.argv[1:])
