"""One writer process of W18 (:mod:`harness.bench._procs`) and tests/test_many_processes.py.

    python -m harness.bench._procs_worker KIND TARGET PROC SESSIONS ROUNDS BURST

``KIND`` is ``jsonl`` (``TARGET`` a root directory), ``sqlite`` (a database file) or
``postgres`` (``URL#schema``). The process opens one store with persistence on the
shared target, creates ``SESSIONS`` sessions ``p<PROC>-s<j>`` (each made durable),
prints ``READY`` and waits for a line on stdin, so that every process starts its bursts
at once. Then, ``ROUNDS`` times, every session (all at once) appends ``BURST`` messages
one by one and flushes: when the flush returns the burst is acknowledged. Message ``k``
of session ``sid`` is a ``user/message`` whose text is ``"<sid>#<k>"``. After the
rounds it prints ``DONE``, closes the store and prints one JSON line: ``appended`` and
``acked`` (sid -> count), ``errors`` (every exception any append, flush, create or the
close raised, and every report on the store's warnings channel: type, code, message).
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import orjson
import trio

from harness.persistence import (
    Backend,
    JsonlBackend,
    PostgresBackend,
    SqliteBackend,
    open_persistence,
)
from harness.runtime import SessionHandle, open_store

_NS = uuid.UUID("6f1b3c2e-52a1-4f8e-9d3e-5b0c1a7d2e90")


def message(sid: str, k: int) -> dict[str, Any]:
    """The data of message ``k`` of session ``sid``."""
    text = f"{sid}#{k}"
    return {"id": str(uuid.uuid5(_NS, text)), "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}


def backend_for(kind: str, target: str) -> Backend:
    if kind == "jsonl":
        return JsonlBackend(target)
    if kind == "sqlite":
        return SqliteBackend(target)
    if kind == "postgres":
        return PostgresBackend.from_url(target)
    raise ValueError(f"unknown backend kind {kind!r}")


def _error(where: str, sid: str | None, exc: BaseException) -> dict[str, Any]:
    return {"where": where, "sid": sid, "type": type(exc).__name__, "code": getattr(exc, "code", None), "message": str(exc)}


async def _main(kind: str, target: str, proc: int, sessions: int, rounds: int, burst: int) -> dict[str, Any]:
    errors: list[dict[str, Any]] = []
    appended: dict[str, int] = {}
    acked: dict[str, int] = {}
    backend = backend_for(kind, target)
    try:
        async with open_store() as store:
            store.warnings.subscribe(lambda report: errors.append({"where": "warning", "sid": None, "type": "warning", "code": None, "message": repr(report)}))
            try:
                async with open_persistence(store, backend):
                    handles: list[SessionHandle] = []

                    async def create(j: int) -> None:
                        sid = f"p{proc}-s{j}"
                        try:
                            h = await store.create(sid, cwd="/bench")
                            await h.flush()
                        except Exception as exc:
                            errors.append(_error("create", sid, exc))
                            return
                        appended[sid] = acked[sid] = 0
                        handles.append(h)

                    async with trio.open_nursery() as nursery:
                        for j in range(sessions):
                            nursery.start_soon(create, j)
                    print("READY", flush=True)
                    await trio.to_thread.run_sync(sys.stdin.readline)

                    async def bursts(h: SessionHandle) -> None:
                        sid = h.id
                        for _ in range(rounds):
                            try:
                                for _ in range(burst):
                                    await h.append("user/message", message(sid, appended[sid]), surface_op="append")
                                    appended[sid] += 1
                                await h.flush()
                            except Exception as exc:
                                errors.append(_error("append", sid, exc))
                                return
                            acked[sid] = appended[sid]

                    async with trio.open_nursery() as nursery:
                        for h in handles:
                            nursery.start_soon(bursts, h)
                    print("DONE", flush=True)
            except Exception as exc:
                errors.append(_error("close", None, exc))
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    return {"proc": proc, "appended": appended, "acked": acked, "errors": errors}


def main(argv: list[str]) -> None:
    kind, target, proc, sessions, rounds, burst = argv
    out = trio.run(_main, kind, target, int(proc), int(sessions), int(rounds), int(burst))
    sys.stdout.write(orjson.dumps(out).decode() + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
