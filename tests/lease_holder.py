"""A lease holder process for tests/test_lease_liveness.py (run directly, or inside
``unshare --pid --fork --mount-proc``: a pid namespace of its own, same host name).

    python -m tests.lease_holder sqlite DB_PATH TTL SESSION [fork]
    python -m tests.lease_holder postgres URL SCHEMA TTL SESSION [fork]
    python -m tests.lease_holder jsonl ROOT TTL SESSION [fork]      (TTL unused: flock)

``fork``: first take and release the lease once (so this process knows its own
identity), then fork; the child is the holder, the parent waits for it.

Takes SESSION's writer lease (the session exists already) with the machine's host
name, prints ``HELD <fence> <pid>``, then writes one event per line read from stdin
(the test decides when) and prints ``ACK <seq>``, or ``LOST <code>`` when the write is
refused because the lease was taken over. At the end of stdin it releases the lease,
closes the backend and prints ``DONE``. Lines are flushed at once: the test may
SIGSTOP or SIGKILL it at any point.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from harness.errors import LeaseLostError


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> None:
    fork = argv[-1] == "fork"
    kind, *rest = argv[:-1] if fork else argv

    def open_backend() -> Any:
        if kind == "jsonl":
            from harness.persistence import JsonlBackend

            return JsonlBackend(rest[0])
        if kind == "sqlite":
            from harness.persistence import SqliteBackend

            path, ttl, _sid = rest
            return SqliteBackend(path, lease_ttl=float(ttl))
        from harness.persistence import PostgresBackend

        url, schema, ttl, _sid = rest
        return PostgresBackend(url, schema=schema, lease_ttl=float(ttl), pool_size=2)

    sid = rest[-1]
    backend = open_backend()
    header = backend.load(sid).header
    if fork:
        backend.acquire_writer(header).release()
        backend.close()
        child = os.fork()
        if child:
            _, status = os.waitpid(child, 0)
            os._exit(os.waitstatus_to_exitcode(status))
        backend = open_backend()
    lease = backend.acquire_writer(header)
    say(f"HELD {getattr(lease, 'fence', 1)} {os.getpid()}")
    for _line in sys.stdin:
        seq = len(backend.load(sid).records)
        event = {"type": "test/mark", "seq": seq, "time": seq, "data": {"w": "holder", "f": lease.fence}}
        try:
            backend.append(sid, [event], lease=lease)
        except LeaseLostError as exc:
            say(f"LOST {exc.code}")
            continue
        say(f"ACK {seq}")
    lease.release()
    backend.close()
    say("DONE")


if __name__ == "__main__":
    main(sys.argv[1:])
