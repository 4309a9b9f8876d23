"""The PostgreSQL server stopped (as by a crash: ``pg_ctl stop -m immediate``) and
started again while a session writes through the coordinator: typed flush errors while it is down,
recovery once it is back, no acknowledged event lost, no half-written batch.
Needs tests/pg_cluster.py."""

from __future__ import annotations

import pytest

# psycopg is in the "test" extra; without it these tests skip instead of failing to import.
pytest.importorskip("psycopg", reason="psycopg not installed: PostgreSQL tests skipped")

import trio

from harness.errors import FlushError, StorageIOError
from harness.persistence import PostgresBackend, open_persistence
from harness.runtime import open_store
from tests.pg_cluster import PgCluster


async def test_a_server_restart_during_a_campaign_loses_nothing_acknowledged(
    pg_cluster: PgCluster, pg_schema: str
) -> None:
    backend = PostgresBackend(pg_cluster.url, schema=pg_schema, pool_timeout=1.0)
    acknowledged = 0  # events covered by a flush that returned
    failures: list[FlushError] = []
    restarted = trio.Event()
    failed = trio.Event()
    some_written = trio.Event()  # 20 batches acknowledged before the restart

    async def restart_after_some_writes() -> None:
        await some_written.wait()
        await trio.to_thread.run_sync(pg_cluster.stop, "immediate")  # as a crash
        await failed.wait()  # the server stays down until a write has failed
        await trio.to_thread.run_sync(pg_cluster.start)  # recovery replays the WAL
        restarted.set()

    try:
        async with open_store() as store, open_persistence(store, backend, write_delay=0.0):
            s = await store.create("s", cwd="/w")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(restart_after_some_writes)
                i = 0
                after: int | None = None  # i when the restart was over
                # Bounded: writes go on until 20 batches after the restart (or give up).
                while i < 5000 and (after is None or i < after + 20):
                    if after is None and restarted.is_set():
                        after = i
                    await s.append("feedback/record", {"i": i, "pad": "x" * 50})
                    await s.append("feedback/record", {"i": i, "pad": "y" * 50})  # two per batch
                    i += 1
                    try:
                        await s.flush()
                    except FlushError as exc:
                        failures.append(exc)
                        failed.set()
                        await trio.sleep(0.05)  # retained: the next flush retries them
                    else:
                        acknowledged = i
                        if acknowledged >= 20:
                            some_written.set()
            await s.flush()
        assert after is not None and failures, "the restart never hit a write"
        assert all(isinstance(f.__cause__, StorageIOError) for f in failures)
        assert all(f.session_id == "s" or 'session "s"' in str(f) for f in failures)
        records = (await trio.to_thread.run_sync(backend.load, "s")).records
        assert [r["seq"] for r in records] == list(range(len(records)))  # contiguous, no duplicate
        data = [r["data"] for r in records if r["type"] == "feedback/record"]
        assert [d["i"] for d in data] == [n // 2 for n in range(2 * i)]  # every event, whole batches, once
    finally:
        await trio.to_thread.run_sync(backend.close)
