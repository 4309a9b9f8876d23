"""The child process of :func:`harness.faults.kill_campaign`.

``python -m harness.faults._killchild jsonl|sqlite|jsonl-zstd|postgres ROOT``
(ROOT as the campaign lays it out: ``backend_location``): resume the session
``crashy`` (or create it), then append turns with a tool call and flush, forever,
printing ``ready <seq>`` once and ``durable <n>`` after every flush that returned (the
first ``n`` events are acknowledged). The parent kills it with SIGKILL.
"""

from __future__ import annotations

import sys

import trio

from harness.errors import PersistedSessionNotFoundError
from harness.faults._backends import make_backend_at
from harness.faults._io import KILL_SESSION
from harness.faults._scenarios._frame import turn_batches
from harness.persistence import open_persistence
from harness.runtime import open_store


async def main(kind: str, root: str) -> None:
    backend = make_backend_at(root, kind)
    async with open_store() as store, open_persistence(store, backend, write_delay=0.005) as p:
        try:
            session = await p.publish(await p.prepare(KILL_SESSION))
        except PersistedSessionNotFoundError:
            session = await store.create(KILL_SESSION, cwd="/crash")
        turn = 1 + session.last_turn()
        print(f"ready {session.seq}", flush=True)
        while True:
            batches = turn_batches(turn, session.seq)
            for i, batch in enumerate(batches):
                await session.append_batch(batch)
                if i in (2, len(batches) - 1):  # after the tool call, and at the turn's end
                    await session.flush()
                    print(f"durable {session.seq}", flush=True)
            turn += 1


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
