"""Cancellation at every scheduler step of a session's life on PostgreSQL
(``harness.faults.explore``): create, two appends with durable flushes, close. Every
attempt must leave every acknowledged event stored, the log loadable and at rest, no
writer lease held, and no connection left inside a transaction. Needs tests/pg_cluster.py."""

from __future__ import annotations

import pytest

# psycopg is in the "test" extra; without it these tests skip instead of failing to import.
pytest.importorskip("psycopg", reason="psycopg not installed: PostgreSQL tests skipped")

import hashlib

import trio

from harness.faults import Probe, Settings, check_stored, explore
from harness.faults._scenarios import flush_and_acknowledge
from harness.persistence import PostgresBackend, open_persistence
from harness.runtime import open_store
from tests.test_postgres import activity

SETTINGS = Settings(autojump_threshold=0.0, timeout=600.0, grace=60.0, real_timeout=60.0)


def lifecycle(url: str, prefix: str) -> object:
    async def scenario(probe: Probe) -> None:
        # One schema per attempt (a fresh store), named after the attempt's directory.
        schema = f"{prefix}_{hashlib.sha256(str(probe.tmp_path).encode()).hexdigest()[:10]}"
        backend = PostgresBackend(url, schema=schema, application_name=schema)
        try:
            with trio.CancelScope() as caller:
                probe.canceller("caller", caller.cancel)
                probe.arm()
                async with open_store() as store, open_persistence(store, backend):
                    s = await store.create("s", cwd="/w")
                    await s.append("feedback/record", 0)
                    await flush_and_acknowledge(probe, s, "flush 1")
                    await s.append("feedback/record", 1)
                    await flush_and_acknowledge(probe, s, "flush 2")
        finally:
            probe.disarm()
            backend.close()
        plain = PostgresBackend(url, schema=schema)
        try:
            probe.record(
                check_stored(
                    plain, "s", acknowledged=probe.acknowledged.get("s", -1), expected=probe.acknowledged_records.get("s")
                )
            )
            probe.check(not plain.lock_held({"id": "s"}), 'the writer lease of "s" is still held after the runtime exited')
        finally:
            plain.close()
        probe.check(
            "idle in transaction" not in activity(url, schema), "a connection was left inside a transaction"
        )

    return scenario


@pytest.mark.slow
def test_cancellation_at_every_step_of_a_session_on_postgres(pg_url: str, pg_schema: str) -> None:
    report = explore(lifecycle(pg_url, pg_schema), name="postgres-lifecycle", cancellers=["caller"], settings=SETTINGS)  # type: ignore[arg-type]
    assert report.ok, report.distinct()
    assert sum(report.dry_steps.values()) > 20  # the scenario really ran through its steps
