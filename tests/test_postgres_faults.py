"""The PostgreSQL server stopped (as by a crash: ``pg_ctl stop -m immediate``) and
started again while a session writes through the coordinator: typed flush errors while it is down,
recovery once it is back, no acknowledged event lost, no half-written batch.
And a ``COMMIT`` that landed but whose acknowledgement was lost (the connection dropped
right after it): the writer's retry recognises its own write, for the first write
(``materialize``) as for an ``append``. Needs tests/pg_cluster.py."""

from __future__ import annotations

import pytest

# psycopg is in the "test" extra; without it these tests skip instead of failing to import.
pytest.importorskip("psycopg", reason="psycopg not installed: PostgreSQL tests skipped")

import threading
from collections.abc import Iterator

import psycopg
import trio

from harness.errors import FlushError, SessionLogExistsError, StorageIOError
from harness.persistence import PostgresBackend, open_persistence
from harness.runtime import open_store
from tests.pg_cluster import PgCluster
from tests.test_postgres import H, chunks, events, sql


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


# -- a COMMIT that landed, its acknowledgement lost ------------------------------------------------


class AckLost:
    """A statement hook: once armed, the next transaction that creates a session
    (``INSERT INTO … sessions``) or bumps one's revision (an append) has its ``COMMIT``
    run on the server, then its connection is terminated (``pg_terminate_backend``)
    and the client sees the connection error instead of the acknowledgement."""

    def __init__(self, url: str, app: str) -> None:
        self.url = url
        self.app = app
        self.armed = 0  # acknowledgements still to lose
        self.lost = 0
        self._local = threading.local()

    def before(self, stmt: str) -> None:
        if stmt == "BEGIN" or stmt.startswith("BEGIN "):
            self._local.writes = False
        elif ".sessions (id, header" in stmt or "SET revision = revision + 1" in stmt:
            self._local.writes = True

    def after(self, stmt: str) -> None:
        if stmt != "COMMIT" or not getattr(self._local, "writes", False) or self.armed <= 0:
            return
        self.armed -= 1
        self.lost += 1
        sql(
            self.url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s "
            "AND pid <> pg_backend_pid()",
            (self.app,),
        )
        raise psycopg.OperationalError("server closed the connection unexpectedly (injected after COMMIT)")


@pytest.fixture
def ack_lost(pg_url: str, pg_schema: str) -> Iterator[tuple[PostgresBackend, AckLost]]:
    app = f"acklost-{pg_schema}"
    hook = AckLost(pg_url, app)
    backend = PostgresBackend(pg_url, schema=pg_schema, faults=hook, application_name=app, pool_timeout=5.0)
    try:
        yield backend, hook
    finally:
        backend.close()


def test_a_first_write_whose_commit_ack_was_lost_is_recognised_on_retry(
    ack_lost: tuple[PostgresBackend, AckLost], pg_url: str, pg_schema: str
) -> None:
    b, hook = ack_lost
    lease = b.acquire_writer(H)
    hook.armed = 1
    with pytest.raises(StorageIOError, match="outcome is unknown"):
        b.materialize(H, events(0, 3), lease=lease)
    assert hook.lost == 1 and b.load("s").records == events(0, 3)  # it did land
    # The writer retries its batch, grown meanwhile: its own write is recognised and
    # only the new events land (no SESSION_LOG_EXISTS, nothing twice).
    b.materialize(H, [*events(0, 3), *chunks(3, 6)], lease=lease)
    assert b.load("s").records == [*events(0, 3), *chunks(3, 6)]
    rev = b.revision("s")
    # Recognised once only: a later materialize of the same content is refused.
    with pytest.raises(SessionLogExistsError):
        b.materialize(H, [*events(0, 3), *chunks(3, 6)], lease=lease)
    assert b.revision("s") == rev
    # An in-doubt retry whose ack is lost again, then retried again.
    hook.armed = 1
    with pytest.raises(StorageIOError, match="outcome is unknown"):
        b.append("s", events(9, 2), lease=lease)
    rev = b.revision("s")
    b.append("s", events(9, 2), lease=lease)  # the same batch: already stored, not applied twice
    assert b.revision("s") == rev
    hook.armed = 1
    with pytest.raises(StorageIOError, match="outcome is unknown"):
        b.append("s", chunks(11, 5), lease=lease)  # one packed row
    b.append("s", [*chunks(11, 5), *events(16, 1)], lease=lease)  # merged with a newer event
    assert b.load("s").records == [*events(0, 3), *chunks(3, 6), *events(9, 2), *chunks(11, 5), *events(16, 1)]
    lease.release()


def test_only_the_in_doubt_write_itself_is_recognised(
    ack_lost: tuple[PostgresBackend, AckLost], pg_url: str, pg_schema: str
) -> None:
    b, hook = ack_lost
    other = PostgresBackend(pg_url, schema=pg_schema)
    try:
        hook.armed = 1
        with pytest.raises(StorageIOError, match="outcome is unknown"):
            b.materialize(H, events(0, 2))
        # Another backend (another process) never takes it for its own, even identical.
        with pytest.raises(SessionLogExistsError):
            other.materialize(H, events(0, 2))
        # Different content is not ours either: refused (and the doubt resolved).
        with pytest.raises(SessionLogExistsError):
            b.materialize(H, events(0, 3)[1:])
        with pytest.raises(SessionLogExistsError):
            b.materialize(H, events(0, 2))
        # Deleted and re-created by someone else meanwhile: another incarnation.
        other.delete("s")
        hook.armed = 1
        with pytest.raises(StorageIOError, match="outcome is unknown"):
            b.materialize(H, events(0, 2))
        other.delete("s")
        other.materialize(H, events(0, 2))
        with pytest.raises(SessionLogExistsError):
            b.materialize(H, events(0, 2))
        assert b.load("s").records == events(0, 2)
    finally:
        other.close()


async def test_the_writer_retries_a_lost_commit_ack_without_error_or_duplicate(
    ack_lost: tuple[PostgresBackend, AckLost],
) -> None:
    """Through the coordinator: the first flush (materialize) and a later one (append)
    lose their COMMIT's acknowledgement; each fails typed, the next flush succeeds and
    every event is stored exactly once."""
    b, hook = ack_lost
    async with open_store() as store, open_persistence(store, b, write_delay=10.0):
        s = await store.create("s", cwd="/w")
        await s.append("feedback/record", {"i": 0})
        hook.armed = 1
        with pytest.raises(FlushError) as info:
            await s.flush()
        assert isinstance(info.value.__cause__, StorageIOError)
        await s.append("feedback/record", {"i": 1})
        await s.flush()  # the retry: its own first write recognised, the new event added
        await s.append("feedback/record", {"i": 2})
        hook.armed = 1
        with pytest.raises(FlushError):
            await s.flush()
        await s.flush()  # the same batch again: already stored, not applied twice
        await s.append("feedback/record", {"i": 3})
        await s.flush()
    assert hook.lost == 2
    records = (await trio.to_thread.run_sync(b.load, "s")).records
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert [r["data"]["i"] for r in records if r["type"] == "feedback/record"] == [0, 1, 2, 3]
